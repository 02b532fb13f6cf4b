// Every decoder layer of a Llama-family model driven from C++ (decoder_layers.cpp says what it
// computes). `FusedDecoderLayers` (model/fused_layers.py) builds one at load from the layers'
// weights and settings, checked once here; each step then calls it with the step's hidden
// states, caches and attention metadata alone.
#pragma once
#include "ops.h"

#include <functional>
#include <string>
#include <vector>

class DecoderLayers {
 public:
  using OptTensor = c10::optional<at::Tensor>;
  using Tensors = std::vector<at::Tensor>;
  using OptTensors = std::vector<OptTensor>;

  // Per layer: `weights` six (input norm, qkv, o, pre-MLP norm, gate-up, down; a norm unread
  // without pre-norms, a sparse layer's MLP pair unread), `small_weights` and `decode_weights`
  // four optional (qkv, o, gate-up, down: the small-batch kernels' packings, the decode rows'
  // GGUF blocks), qkv and o biases, attention sinks, a window (0: none) and a rotation (-1 none,
  // 0 the model's tables, 1 the windowed layers' own); `qk_norms` and `output_norms` two per
  // layer or none. Convolution layers (LFM2's; Qwen3.5's DeltaNet layers where `delta_tensors`
  // are given) where `conv_index` names one, sparse layers where `expert_index` does.
  // `whole_qk_norms`: {the whole model's query heads, KV heads, this rank, ranks} where q/k
  // norms over every head gather each tensor-parallel rank's heads (OLMo 2's), or empty.
  DecoderLayers(Tensors weights, OptTensors small_weights, OptTensors decode_weights,
                int64_t small_rows, OptTensors qkv_biases, OptTensors o_biases, OptTensors sinks,
                Tensors qk_norms, Tensors output_norms, int64_t num_heads, int64_t num_kv_heads,
                int64_t head_dim, double eps, double scale, std::vector<int64_t> windows,
                std::vector<int64_t> rotations, bool pre_norms, bool qk_norm_after_rope,
                bool gelu, bool squared_relu, bool packed, int64_t activation_bits,
                double residual_scale, double softcap,
                std::function<void(const at::Tensor&)> all_reduce,
                std::vector<int64_t> conv_index, Tensors conv_weights,
                std::vector<int64_t> expert_index, Tensors routers, OptTensors router_biases,
                std::vector<Tensors> expert_gate_up, std::vector<Tensors> expert_down,
                std::vector<Tensors> expert_gate_up_bias, std::vector<Tensors> expert_down_bias,
                int64_t top_k, std::string router_scoring, bool renormalize, double router_eps,
                double routed_scale, int64_t expert_intermediate, int64_t expert_bits,
                int64_t expert_pass_tokens, double swiglu_limit, double swiglu_alpha,
                OptTensors shared_experts, bool output_gate, Tensors delta_tensors,
                OptTensors delta_small, int64_t delta_key_heads, bool delta_tiled,
                std::vector<int64_t> whole_qk_norms);

  // One step: {last layer's MLP output, residual stream}. The caches are each layer's (a
  // convolution layer's placeholders, never read); KV groups after the first bring their own
  // slots and tables (`layer_groups`: each layer's group, or none); convolution layers read and
  // write `conv_states` (one a convolution layer) through the step's five `conv_rows`, DeltaNet
  // layers `delta_states` over the requests starting at `delta_starts`.
  std::vector<at::Tensor> operator()(
      at::Tensor hidden, OptTensor residual, const at::Tensor& cos, const at::Tensor& sin,
      const OptTensor& local_cos, const OptTensor& local_sin, const OptTensor& query_scale,
      const Tensors& k_caches, const Tensors& v_caches, const at::Tensor& slot_mapping,
      const OptTensor& decode_rows, const OptTensor& decode_tables, const OptTensor& decode_lens,
      bool decode_all_rows, const OptTensor& prefill_chunks, const OptTensor& prefill_tables,
      const std::vector<int64_t>& layer_groups, const Tensors& group_slots,
      const Tensors& group_decode_tables, const Tensors& group_prefill_tables,
      const Tensors& conv_states, const Tensors& conv_rows, const Tensors& delta_states,
      const std::vector<int64_t>& delta_starts) const;

 private:
  void normalize_whole_qk(at::Tensor& qkv, size_t l, int64_t q_size, int64_t kv_size) const;

  size_t num_layers_;
  Tensors weights_;
  OptTensors small_weights_, decode_weights_;  // (decode: none given, all empty)
  int64_t small_rows_;
  OptTensors qkv_biases_, o_biases_, sinks_;
  Tensors qk_norms_, output_norms_;
  int64_t num_heads_, num_kv_heads_, head_dim_;
  double eps_, scale_;
  std::vector<int64_t> windows_, rotations_;
  bool pre_norms_, qk_norm_after_rope_, gelu_, squared_relu_, packed_, has_decode_weights_;
  int64_t activation_bits_;
  double residual_scale_, softcap_;
  std::function<void(const at::Tensor&)> all_reduce_;
  std::vector<int64_t> conv_index_;
  Tensors conv_weights_;
  std::vector<int64_t> expert_index_;
  Tensors routers_;
  OptTensors router_biases_;
  std::vector<Tensors> expert_gate_up_, expert_down_, expert_gate_up_bias_, expert_down_bias_;
  int64_t top_k_;
  std::string router_scoring_;
  bool renormalize_;
  double router_eps_, routed_scale_;
  int64_t expert_intermediate_, expert_bits_, expert_pass_tokens_;
  double swiglu_limit_, swiglu_alpha_;
  OptTensors shared_experts_;
  bool output_gate_;
  Tensors delta_tensors_;
  OptTensors delta_small_;
  int64_t delta_key_heads_;
  bool delta_tiled_;
  std::vector<int64_t> whole_qk_norms_;
};
