// The CPU kernels of inflight, compiled together into one extension (see inflight/kernels).
#pragma once
#include <torch/extension.h>

// paged_attention.cpp
torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                     const torch::Tensor& v_cache,
                                     const torch::Tensor& block_tables,
                                     const torch::Tensor& seq_lens, double scale, int64_t window);

// kv_cache.cpp: key/value [T, KVH, D] written at their slots in the kernels' layout (kv_layout.h)
void write_kv_cache(torch::Tensor& k_cache, torch::Tensor& v_cache, const torch::Tensor& key,
                    const torch::Tensor& value, const torch::Tensor& slot_mapping);

// prefill_attention.cpp
torch::Tensor paged_prefill_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                      const torch::Tensor& v_cache, const torch::Tensor& chunks,
                                      const torch::Tensor& block_tables, torch::Tensor& out,
                                      double scale, int64_t window);

// layer_ops.cpp: fused element-wise parts of a decoder layer, rounding as PyTorch's unfused ops do
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor add_rms_norm(const torch::Tensor& x, torch::Tensor& residual,
                           const torch::Tensor& weight, double eps);
torch::Tensor silu_and_mul(const torch::Tensor& gate_up);
void rope_(torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
           int64_t num_heads, int64_t head_dim);

// bf16_linear.cpp: bfloat16 linear layers for decode-sized batches (AVX-512 BF16 machines only)
bool bf16_linear_available();
torch::Tensor pack_bf16_linear(const torch::Tensor& weight);
torch::Tensor bf16_linear(const torch::Tensor& x, const torch::Tensor& packed,
                          const c10::optional<torch::Tensor>& bias, int64_t out_features);

// argmax.cpp: greedy sampling, the first maximum of each row as torch.max picks it
torch::Tensor first_argmax(const torch::Tensor& x);

// decoder_layers.cpp: every decoder layer of a Llama-family model in one call (the Python
// `DecoderLayer.forward` loop, moved to C++); returns {hidden, residual}
std::vector<torch::Tensor> llama_decoder_layers(
    torch::Tensor hidden, c10::optional<torch::Tensor> residual, const torch::Tensor& cos,
    const torch::Tensor& sin, const std::vector<torch::Tensor>& weights,
    const std::vector<c10::optional<torch::Tensor>>& small_weights, int64_t small_rows,
    const std::vector<c10::optional<torch::Tensor>>& qkv_biases,
    const std::vector<torch::Tensor>& k_caches, const std::vector<torch::Tensor>& v_caches,
    const torch::Tensor& slot_mapping, const c10::optional<torch::Tensor>& decode_rows,
    const c10::optional<torch::Tensor>& decode_tables,
    const c10::optional<torch::Tensor>& decode_lens, bool decode_all_rows,
    const c10::optional<torch::Tensor>& prefill_chunks,
    const c10::optional<torch::Tensor>& prefill_tables, int64_t num_heads, int64_t num_kv_heads,
    int64_t head_dim, double eps, double scale, int64_t window, bool packed);
