// All decoder layers of a Llama-family model in one call (`DecoderLayers`: built once from the
// layers' weights and settings, whose lists it checks then; each step passes its inputs alone),
// for the CPU fast path (LFM2's too: its
// short convolutions in place of attention, where `conv_index` says; Qwen3.5's gated DeltaNet
// layers in the same places, where `delta_tensors` are given, and its attention's output gate;
// and experts in place of the MLP where `expert_index` says, routed by a float32 router and
// multiplied from their blocks, beside a shared expert where a sparse layer has one; gpt-oss's
// attention sinks, output projection bias, biased experts and clamped SwiGLU where given).
//
// The same sequence of operations as `DecoderLayer.forward` in inflight/model/llama.py (the
// reference, and what this is tested against, bit for bit): RMSNorm (the residual add fused in),
// fused QKV projection, each query and key head RMS-normalized where the family does it
// (Qwen3, Gemma 3), RoPE in place (a windowed layer's own tables where the family has them),
// K/V written to the paged cache, decode and prefill attention kernels within the layer's
// window, output projection (RMSNorm'd where the family norms outputs: Gemma 3), RMSNorm,
// gate-up projection, SiLU- or tanh-GELU-and-mul, down projection (RMSNorm'd likewise). Only
// the driving loop moves from Python to C++: at a few tokens per step the Python glue between
// ~20 ops per layer cost as much as the attention itself (~3 ms a step).
// A rank of a split model sums the output and down projections' outputs over the ranks where
// the Python layer does, through `all_reduce` (the rank's `TPGroup.all_reduce`, in place; empty
// for one rank), which takes the GIL for its call.
//
// Linears are plain weights (`at::linear`) or `PackedLinear`'s: inflight's bf16 or GGUF-block
// kernel (exact, or with 8- or 16-bit activations) for at most `small_rows` rows when the layer has
// its weight, else oneDNN
// (`mkldnn::_linear_pointwise`, called through the dispatcher), exactly as `PackedLinear.forward`
// chooses; and where a layer has a decode weight (its GGUF blocks for 16-bit x), the step's
// decode rows go through that instead.
#include "decoder_layers.h"

#include "kv_layout.h"
#include "ops.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/add.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/square.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/ones.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <string_view>

namespace {

using OptTensor = c10::optional<at::Tensor>;

struct Linear {
  const at::Tensor& weight;  // plain, or oneDNN-packed (logical shape [N, K] either way)
  const OptTensor& small;    // the same weight for a small-batch kernel: bf16_linear's packing
                             // (bf16) or its GGUF blocks for gguf_linear (uint8), if any
  const OptTensor& decode;   // its GGUF blocks for the decode rows (16-bit x), if any
  const OptTensor& bias;
};

// Which rows of the step are decodes, for the linears that have a decode weight.
struct DecodeSplit {
  bool any = false, all = false;
  int64_t leading = 0;  // the decodes are rows 0..leading-1 (the usual order: running first)
  at::Tensor decode_rows, prompt_rows;  // both ascending, when some rows are each
};

// Which kernels a layer's linears use, as `PackedLinear.forward` picks them.
struct LinearChoice {
  bool packed;            // oneDNN-packed weights (else plain ones, through at::linear)
  int64_t small_rows;     // batches up to this many rows go to the small-batch kernel
  int64_t activation_bits;  // 8 or 16: GGUF blocks regrouped for gguf_int_linear; else 0
};

at::Tensor dense_linear(const at::Tensor& x, const Linear& l, const LinearChoice& how) {
  if (!how.packed) return at::linear(x, l.weight, l.bias);
  if (l.small.has_value() && x.size(0) <= how.small_rows) {
    if (l.small->scalar_type() == at::kByte) {
      const int64_t N = l.weight.size(0);
      return how.activation_bits ? gguf_int_linear(x, *l.small, l.bias, N, how.activation_bits)
                                 : gguf_linear(x, *l.small, l.bias, N);
    }
    return bf16_linear(x, *l.small, l.bias, l.weight.size(0));
  }
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&,
                                         std::string_view, c10::List<std::optional<at::Scalar>>,
                                         std::optional<std::string_view>)>();
  // a lone row as two: oneDNN splits a lone row's sum over k between threads, which rounds
  // otherwise than any batch of 2 or more rows (PackedLinear._dense does the same)
  const bool lone = x.size(0) == 1;
  auto y = op.call(lone ? x.expand({2, x.size(1)}).contiguous() : x, l.weight, l.bias, "none",
                   c10::List<std::optional<at::Scalar>>(), std::string_view(""));
  return lone ? y.narrow(0, 0, 1) : y;
}

// dense_linear into y (rows of a larger output): inflight's bf16 kernel writes there itself
void dense_linear_into(const at::Tensor& x, const Linear& l, const LinearChoice& how,
                       at::Tensor& y) {
  if (l.small->scalar_type() == at::kBFloat16) {
    bf16_linear_into(x, *l.small, l.bias, l.weight.size(0), y);
    return;
  }
  y.copy_(dense_linear(x, l, how));
}

// A step with a decode weight: its decode rows through the blocks (16-bit x), its prompt rows
// through the dense path, as `PackedLinear.forward` does. Prompt rows few enough for the
// small-batch kernel go there as a batch of their own; more go through oneDNN with the whole
// step, whose decode rows' results are then replaced (oneDNN cannot write into rows of y, and
// copying its prompt rows' outputs would cost more than computing the decode rows twice).
at::Tensor linear(const at::Tensor& x, const Linear& l, const LinearChoice& how,
                  const DecodeSplit& split) {
  if (!l.decode.has_value() || !split.any) return dense_linear(x, l, how);
  const int64_t N = l.weight.size(0), T = x.size(0);
  if (split.all) return gguf_int_linear(x, *l.decode, l.bias, N, 16);
  const int64_t D = split.decode_rows.size(0), P = T - D;
  if (!(how.packed && l.small.has_value() && P <= how.small_rows)) {
    auto y = dense_linear(x, l, how);
    if (split.leading) {
      auto decoded = y.narrow(0, 0, D);
      gguf_int_linear_into(x.narrow(0, 0, D), *l.decode, l.bias, N, 16, decoded);
    } else {
      y.index_copy_(0, split.decode_rows,
                    gguf_int_linear(x.index_select(0, split.decode_rows), *l.decode, l.bias, N,
                                    16));
    }
    return y;
  }
  auto y = at::empty({T, N}, x.options());
  if (split.leading) {  // contiguous slices: no gathers, the kernels write in place
    auto decoded = y.narrow(0, 0, D), prompted = y.narrow(0, D, P);
    gguf_int_linear_into(x.narrow(0, 0, D), *l.decode, l.bias, N, 16, decoded);
    dense_linear_into(x.narrow(0, D, P), l, how, prompted);
    return y;
  }
  y.index_copy_(0, split.decode_rows,
                gguf_int_linear(x.index_select(0, split.decode_rows), *l.decode, l.bias, N, 16));
  y.index_copy_(0, split.prompt_rows, dense_linear(x.index_select(0, split.prompt_rows), l, how));
  return y;
}

// A sparse layer's experts, where its router is a float32 one without expert groups and every
// expert multiplies from its blocks: `gguf_routed_experts`, the call `MoEDecoderLayer` makes.
struct Experts {
  const at::Tensor& router;  // [E, hidden] float32
  const OptTensor& bias;     // [E] float32: counts for the choice alone (gpt-oss's: in the logits)
  const std::vector<at::Tensor>& gate_up;
  const std::vector<at::Tensor>& down;
  const std::vector<at::Tensor>& gate_up_bias;  // each expert's (gpt-oss's), or none
  const std::vector<at::Tensor>& down_bias;
};

struct Routing {
  int64_t top_k;
  const std::string& scoring;
  bool renormalize;
  double eps, scale;
  int64_t intermediate, bits, pass_tokens;
  double swiglu_limit, swiglu_alpha;  // gpt-oss's clamped SwiGLU (0: SiLU)
};

at::Tensor routed_experts(const at::Tensor& x, const Experts& e, const Routing& r) {
  return gguf_routed_experts(x.to(at::kFloat).contiguous(), e.router, e.bias, r.top_k, r.scoring,
                             r.renormalize, r.eps, r.scale, e.gate_up, e.down, r.intermediate,
                             r.bits, r.pass_tokens, e.gate_up_bias, e.down_bias, r.swiglu_limit,
                             r.swiglu_alpha);
}

// tanh-GELU(gate) * up for rows [gate | up]: PyTorch's own ops, as the Python layer calls them
at::Tensor gelu_tanh_and_mul(const at::Tensor& gate_up) {
  auto parts = gate_up.chunk(2, -1);
  return at::mul(at::gelu(parts[0], "tanh"), parts[1]);
}

// input norm, qkv, o, pre-MLP norm, gate-up, down (the norms unread without pre-norms)
constexpr size_t kWeightsPerLayer = 6;
constexpr size_t kSmallPerLayer = 4;    // small-batch kernel weights (or none): qkv, o, gate-up, down
const OptTensor kNone;
// a DeltaNet layer's [b | a] projection, decay rates, dt bias and output norm; its [b | a]
// small-batch and decode weights
constexpr size_t kDeltaTensors = 4, kDeltaSmall = 2;
// a sparse layer's shared expert: [gate | up], down and its output's gate, each a weight, its
// small-batch and its decode weight
constexpr size_t kSharedPerLayer = 9;
// a layer's RoPE (`FusedDecoderLayers.rotations`): none (SmolLM3's NoPE layers), the model's
// tables, or the windowed layers' own (Gemma 3's)
constexpr int64_t kNoRope = -1, kModelRope = 0, kLocalRope = 1;

}  // namespace

DecoderLayers::DecoderLayers(
    Tensors weights, OptTensors small_weights, OptTensors decode_weights, int64_t small_rows,
    OptTensors qkv_biases, OptTensors o_biases, OptTensors sinks, Tensors qk_norms,
    Tensors output_norms, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps,
    double scale, std::vector<int64_t> windows, std::vector<int64_t> rotations, bool pre_norms,
    bool qk_norm_after_rope, bool gelu, bool squared_relu, bool packed, int64_t activation_bits,
    double residual_scale, double softcap, std::function<void(const at::Tensor&)> all_reduce,
    std::vector<int64_t> conv_index, Tensors conv_weights, std::vector<int64_t> expert_index,
    Tensors routers, OptTensors router_biases, std::vector<Tensors> expert_gate_up,
    std::vector<Tensors> expert_down, std::vector<Tensors> expert_gate_up_bias,
    std::vector<Tensors> expert_down_bias, int64_t top_k, std::string router_scoring,
    bool renormalize, double router_eps, double routed_scale, int64_t expert_intermediate,
    int64_t expert_bits, int64_t expert_pass_tokens, double swiglu_limit, double swiglu_alpha,
    OptTensors shared_experts, bool output_gate, Tensors delta_tensors, OptTensors delta_small,
    int64_t delta_key_heads, bool delta_tiled, std::vector<int64_t> whole_qk_norms)
    : num_layers_(windows.size()),
      weights_(std::move(weights)),
      small_weights_(std::move(small_weights)),
      decode_weights_(std::move(decode_weights)),
      small_rows_(small_rows),
      qkv_biases_(std::move(qkv_biases)),
      o_biases_(std::move(o_biases)),
      sinks_(std::move(sinks)),
      qk_norms_(std::move(qk_norms)),
      output_norms_(std::move(output_norms)),
      num_heads_(num_heads),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      eps_(eps),
      scale_(scale),
      windows_(std::move(windows)),
      rotations_(std::move(rotations)),
      pre_norms_(pre_norms),
      qk_norm_after_rope_(qk_norm_after_rope),
      gelu_(gelu),
      squared_relu_(squared_relu),
      packed_(packed),
      has_decode_weights_(!decode_weights_.empty()),
      activation_bits_(activation_bits),
      residual_scale_(residual_scale),
      softcap_(softcap),
      all_reduce_(std::move(all_reduce)),
      conv_index_(std::move(conv_index)),
      conv_weights_(std::move(conv_weights)),
      expert_index_(std::move(expert_index)),
      routers_(std::move(routers)),
      router_biases_(std::move(router_biases)),
      expert_gate_up_(std::move(expert_gate_up)),
      expert_down_(std::move(expert_down)),
      expert_gate_up_bias_(std::move(expert_gate_up_bias)),
      expert_down_bias_(std::move(expert_down_bias)),
      top_k_(top_k),
      router_scoring_(std::move(router_scoring)),
      renormalize_(renormalize),
      router_eps_(router_eps),
      routed_scale_(routed_scale),
      expert_intermediate_(expert_intermediate),
      expert_bits_(expert_bits),
      expert_pass_tokens_(expert_pass_tokens),
      swiglu_limit_(swiglu_limit),
      swiglu_alpha_(swiglu_alpha),
      shared_experts_(std::move(shared_experts)),
      output_gate_(output_gate),
      delta_tensors_(std::move(delta_tensors)),
      delta_small_(std::move(delta_small)),
      delta_key_heads_(delta_key_heads),
      delta_tiled_(delta_tiled),
      whole_qk_norms_(std::move(whole_qk_norms)) {
  const size_t L = num_layers_;
  INFLIGHT_CHECK(weights_.size() == L * kWeightsPerLayer &&
                     small_weights_.size() == L * kSmallPerLayer && qkv_biases_.size() == L &&
                     o_biases_.size() == L && sinks_.size() == L && rotations_.size() == L,
                 "six weights, four optional small-batch packings, optional qkv and o biases, "
                 "optional sinks, a window and a rotation per layer");
  INFLIGHT_CHECK(qk_norms_.empty() || qk_norms_.size() == 2 * L,
                 "no q/k norms, or a query and a key norm weight per layer");
  INFLIGHT_CHECK(whole_qk_norms_.empty() ||
                     (whole_qk_norms_.size() == 4 && whole_qk_norms_[0] > 0 &&
                      whole_qk_norms_[1] > 0 && whole_qk_norms_[3] > 0 &&
                      whole_qk_norms_[2] >= 0 && whole_qk_norms_[2] < whole_qk_norms_[3] &&
                      whole_qk_norms_[0] == num_heads_ * whole_qk_norms_[3] && all_reduce_),
                 "whole_qk_norms: the model's query and KV heads (this rank's query heads times "
                 "the ranks), this rank and the ranks, with an all-reduce");
  for (size_t i = 0; i < qk_norms_.size(); ++i) {
    const int64_t heads = whole_qk_norms_.empty() ? (i % 2 ? num_kv_heads_ : num_heads_)
                                                  : whole_qk_norms_[i % 2];
    const int64_t width = qk_norms_[i].numel(), all = heads * head_dim_;
    INFLIGHT_CHECK(qk_norms_[i].dim() == 1 && (width == head_dim_ || width == all),
                   "a q/k norm weight spans a head or all heads");
  }
  INFLIGHT_CHECK(output_norms_.empty() || output_norms_.size() == 2 * L,
                 "no output norms, or one after attention and one after the MLP per layer");
  for (const OptTensor& s : sinks_) sink_logits(s, num_heads_);
  for (const int64_t r : rotations_) {
    INFLIGHT_CHECK(r == kNoRope || r == kModelRope || r == kLocalRope,
                   "a layer's rotation is none (-1), the model's tables (0) or the windowed "
                   "layers' own (1)");
  }
  INFLIGHT_CHECK(decode_weights_.empty() || decode_weights_.size() == L * kSmallPerLayer,
                 "no decode weights, or four optional ones per layer");
  if (decode_weights_.empty()) decode_weights_.resize(L * kSmallPerLayer);  // (all absent)
  // LFM2's short convolutions: layer l's index into conv_weights and the step's states (-1: it
  // attends); its caches and q/k norms are placeholders, never read
  INFLIGHT_CHECK(conv_index_.empty() || conv_index_.size() == L,
                 "one convolution index per layer, or none");
  for (const int64_t c : conv_index_) {
    INFLIGHT_CHECK(c < static_cast<int64_t>(conv_weights_.size()), "convolution ", c,
                   " out of range");
  }
  for (const at::Tensor& kernel : conv_weights_) {
    INFLIGHT_CHECK(kernel.dim() == 2 && kernel.size(1) >= 2, "a convolution's kernel [C, K]");
  }
  // a sparse layer's index into the experts' lists (-1: its own MLP, whose weights above it
  // uses; a sparse layer's are placeholders, never read)
  INFLIGHT_CHECK(expert_index_.empty() || expert_index_.size() == L,
                 "one expert index per layer, or none");
  const size_t S = routers_.size();
  INFLIGHT_CHECK(router_biases_.size() == S && expert_gate_up_.size() == S &&
                     expert_down_.size() == S && expert_gate_up_bias_.size() == S &&
                     expert_down_bias_.size() == S,
                 "a router, its bias, the experts' packings and their biases per sparse layer");
  for (const int64_t e : expert_index_) {
    INFLIGHT_CHECK(e < static_cast<int64_t>(S), "sparse layer ", e, " out of range");
  }
  INFLIGHT_CHECK(router_scoring_ == "softmax" || router_scoring_ == "sigmoid" ||
                     router_scoring_ == "softmax_of_chosen",
                 "a router's scoring is softmax, sigmoid or softmax_of_chosen");
  INFLIGHT_CHECK(swiglu_limit_ >= 0.0 && std::isfinite(swiglu_limit_) &&
                     std::isfinite(swiglu_alpha_),
                 "swiglu_limit: 0 (SiLU) or a positive limit, and a finite alpha");
  for (size_t e = 0; e < S; ++e) {
    const int64_t E = routers_[e].size(0);
    INFLIGHT_CHECK(routers_[e].dim() == 2 && routers_[e].scalar_type() == at::kFloat &&
                       (!router_biases_[e].has_value() || router_biases_[e]->numel() == E) &&
                       static_cast<int64_t>(expert_gate_up_[e].size()) == E &&
                       static_cast<int64_t>(expert_down_[e].size()) == E && 0 < top_k_ &&
                       top_k_ <= E && expert_pass_tokens_ > 0,
                   "a float32 router [E, hidden], its bias [E], E experts, 1..E a token");
  }
  // Qwen3.5's DeltaNet layers in the convolutions' places (none for LFM2): each one's [b | a]
  // projection, decay rates, dt bias and output norm, its [b | a] small-batch and decode weights
  INFLIGHT_CHECK(delta_tensors_.empty() ||
                     (delta_tensors_.size() == kDeltaTensors * conv_weights_.size() &&
                      delta_small_.size() == kDeltaSmall * conv_weights_.size()),
                 "no DeltaNet layers, or each convolution layer's four tensors and two optional "
                 "[b | a] weights");
  INFLIGHT_CHECK(shared_experts_.empty() || shared_experts_.size() == kSharedPerLayer * S,
                 "no shared experts, or nine optional tensors per sparse layer");
  for (size_t e = 0; e < shared_experts_.size(); e += kSharedPerLayer) {
    const OptTensor* s = &shared_experts_[e];
    for (size_t part = 0; part < kSharedPerLayer; part += 3) {
      INFLIGHT_CHECK(s[part].has_value() || (!s[part + 1].has_value() && !s[part + 2].has_value()),
                     "a shared expert's small-batch and decode weights come with its weight");
    }
    INFLIGHT_CHECK(s[0].has_value() == s[3].has_value() && (s[0].has_value() || !s[6].has_value()),
                   "a shared expert has [gate | up] and down, and a gate only beside them");
  }
}

// A rank's queries and keys normalized as one rank normalizes the model's (`Qwen3DecoderLayer.
// _normalize_whole`'s ops): each rank writes its heads' rows into zeros as wide as every rank's
// queries and keys, one all-reduce sums them (adding zeros, exactly), the whole rows are
// normalized, and the rank keeps its own. Where ranks share a KV head, its first rank writes it.
void DecoderLayers::normalize_whole_qk(at::Tensor& qkv, size_t l, int64_t q_size,
                                       int64_t kv_size) const {
  const int64_t heads = whole_qk_norms_[0], kv_heads = whole_qk_norms_[1];
  const int64_t rank = whole_qk_norms_[2], ranks = whole_qk_norms_[3], d = head_dim_;
  const bool shared = kv_heads < ranks;  // (`Shard.kv_heads`)
  const int64_t first_kv = shared ? rank * kv_heads / ranks : rank * kv_size / d;
  auto whole = at::zeros({qkv.size(0), (heads + kv_heads) * d}, qkv.options());
  whole.narrow(1, rank * q_size, q_size).copy_(qkv.narrow(1, 0, q_size));
  auto keys = whole.narrow(1, heads * d, kv_heads * d);
  if (!shared || rank * kv_heads % ranks < kv_heads) {
    keys.narrow(1, first_kv * d, kv_size).copy_(qkv.narrow(1, q_size, kv_size));
  }
  all_reduce_(whole);
  const auto q = rms_norm(whole.narrow(1, 0, heads * d), qk_norms_[2 * l], eps_);
  const auto k = rms_norm(keys, qk_norms_[2 * l + 1], eps_);
  qkv.narrow(1, 0, q_size).copy_(q.narrow(1, rank * q_size, q_size));
  qkv.narrow(1, q_size, kv_size).copy_(k.narrow(1, first_kv * d, kv_size));
}

std::vector<at::Tensor> DecoderLayers::operator()(
    at::Tensor hidden, OptTensor residual, const at::Tensor& cos, const at::Tensor& sin,
    const OptTensor& local_cos, const OptTensor& local_sin, const OptTensor& query_scale,
    const Tensors& k_caches, const Tensors& v_caches, const at::Tensor& slot_mapping,
    const OptTensor& decode_rows, const OptTensor& decode_tables, const OptTensor& decode_lens,
    bool decode_all_rows, const OptTensor& prefill_chunks, const OptTensor& prefill_tables,
    const std::vector<int64_t>& layer_groups, const Tensors& group_slots,
    const Tensors& group_decode_tables, const Tensors& group_prefill_tables,
    const Tensors& conv_states, const Tensors& conv_rows, const Tensors& delta_states,
    const std::vector<int64_t>& delta_starts) const {
  const size_t L = num_layers_;
  INFLIGHT_CHECK(k_caches.size() == L && v_caches.size() == L, "two caches per layer");
  INFLIGHT_CHECK(local_cos.has_value() == local_sin.has_value(),
                 "the windowed layers' RoPE tables come as a pair or not at all");
  INFLIGHT_CHECK(local_cos.has_value() ||
                     std::find(rotations_.begin(), rotations_.end(), kLocalRope) ==
                         rotations_.end(),
                 "the windowed layers' own RoPE tables, given where a layer rotates by them");
  INFLIGHT_CHECK(!query_scale.has_value() ||
                     (query_scale->dim() == 2 && query_scale->size(0) == hidden.size(0) &&
                      query_scale->size(1) == 1 &&
                      query_scale->scalar_type() == hidden.scalar_type()),
                 "query_scale: [T, 1] in the hidden states' dtype");
  INFLIGHT_CHECK(decode_rows.has_value() == decode_tables.has_value() &&
                     decode_rows.has_value() == decode_lens.has_value() &&
                     prefill_chunks.has_value() == prefill_tables.has_value(),
                 "decode and prefill metadata come whole or not at all");
  const int64_t T = hidden.size(0), q_size = num_heads_ * head_dim_,
                kv_size = num_kv_heads_ * head_dim_;
  INFLIGHT_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == T &&
                     slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(),
                 "slot_mapping: one int64 slot per token");
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (size_t l = 0; l < L; ++l) {
    const KVLayout lay = kv_layout(k_caches[l], v_caches[l]);
    INFLIGHT_CHECK(k_caches[l].sizes() == k_caches[0].sizes() &&
                       v_caches[l].sizes() == v_caches[0].sizes() &&
                       lay.kv_heads == num_kv_heads_ && lay.head_dim == head_dim_ &&
                       k_caches[l].scalar_type() == k_caches[0].scalar_type(),
                   "every layer's caches must have the model's heads, all alike");
  }
  // every layer's caches alike (checked above): one layout serves all
  const KVLayout layout = L ? kv_layout(k_caches[0], v_caches[0]) : KVLayout{1, 0, 0};
  const int64_t num_slots = L ? layout.num_slots(k_caches[0].size(0)) : 0;
  for (int64_t t = 0; t < T; ++t) {
    INFLIGHT_CHECK(slots[t] >= 0 && slots[t] < num_slots, "slot ", slots[t], " out of range");
  }
  // KV groups (core/kv_groups.py): a layer of group g > 0 writes and reads through that group's
  // slots and tables (`group_*[g - 1]`); group 0's are the arguments above
  INFLIGHT_CHECK(layer_groups.empty() || layer_groups.size() == L,
                 "one KV group per layer, or none");
  const size_t G = group_slots.size();
  INFLIGHT_CHECK((!decode_tables.has_value() || group_decode_tables.size() == G) &&
                     (!prefill_tables.has_value() || group_prefill_tables.size() == G),
                 "every KV group after the first has its slots and its tables");
  std::vector<const int64_t*> slots_of{slots};
  for (size_t g = 0; g < G; ++g) {
    const at::Tensor& s = group_slots[g];
    INFLIGHT_CHECK(s.dim() == 1 && s.size(0) == T && s.scalar_type() == at::kLong &&
                       s.is_contiguous(),
                   "a KV group's slot_mapping: one int64 slot per token");
    const int64_t* p = s.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t) {
      INFLIGHT_CHECK(p[t] >= 0 && p[t] < num_slots, "slot ", p[t], " out of range");
    }
    slots_of.push_back(p);
  }
  for (const int64_t g : layer_groups) {
    INFLIGHT_CHECK(g >= 0 && static_cast<size_t>(g) <= G, "KV group ", g, " out of range");
  }
  // the convolution layers' states, one a layer, and the step's five row indices; the DeltaNet
  // layers' state matrices (`ConvStep.recurrent`)
  INFLIGHT_CHECK(conv_states.size() == conv_weights_.size() &&
                     (conv_weights_.empty() || conv_rows.size() == 5),
                 "a state per convolution layer, and the step's five row indices");
  for (size_t c = 0; c < conv_states.size(); ++c) {
    INFLIGHT_CHECK(conv_states[c].dim() == 3 &&
                       conv_states[c].size(1) == conv_weights_[c].size(1) - 1 &&
                       conv_states[c].size(2) == conv_weights_[c].size(0),
                   "a convolution's state [rows, K - 1, C] beside its kernel [C, K]");
  }
  const bool delta = !delta_tensors_.empty();
  INFLIGHT_CHECK(!delta || delta_states.size() == conv_weights_.size(),
                 "state matrices for each DeltaNet layer");
  DecodeSplit split;
  if (has_decode_weights_ && decode_rows.has_value()) {
    split.any = true;
    split.all = decode_all_rows;
    if (!split.all) {
      split.decode_rows = std::get<0>(decode_rows->sort());
      const int64_t D = split.decode_rows.size(0);
      if (D > 0 && split.decode_rows[D - 1].item<int64_t>() == D - 1) split.leading = D;
      auto prompt = at::ones({T}, slot_mapping.options().dtype(at::kBool));
      prompt.index_fill_(0, split.decode_rows, false);
      split.prompt_rows = prompt.nonzero().view({-1});
    }
  }
  const LinearChoice how{packed_, small_rows_, activation_bits_};
  const Routing routing{top_k_,       router_scoring_,     renormalize_,
                        router_eps_,  routed_scale_,       expert_intermediate_,
                        expert_bits_, expert_pass_tokens_, swiglu_limit_,
                        swiglu_alpha_};
  at::Tensor res = residual.has_value() ? *residual : at::Tensor();
  for (size_t l = 0; l < num_layers_; ++l) {
    const at::Tensor* w = &weights_[l * kWeightsPerLayer];
    const OptTensor* small = &small_weights_[l * kSmallPerLayer];
    const OptTensor* dec = &decode_weights_[l * kSmallPerLayer];
    at::Tensor x;
    if (!pre_norms_) {  // each sublayer reads the residual stream itself (`DecoderLayer.pre_norms`)
      res = res.defined() ? res.add_(hidden) : hidden;
      x = res;
    } else if (!res.defined()) {
      res = hidden;
      x = rms_norm(hidden, w[0], eps_);
    } else {
      x = add_rms_norm(hidden, res, w[0], eps_);
    }
    const int64_t conv = conv_index_.empty() ? -1 : conv_index_[l];
    at::Tensor out;
    if (conv >= 0 && delta) {  // `Qwen3_5DecoderLayer.attention`
      const at::Tensor* d = &delta_tensors_[conv * kDeltaTensors];
      const OptTensor* ds = &delta_small_[conv * kDeltaSmall];
      auto qkvz = linear(x, {w[1], small[0], dec[0], kNone}, how, split);
      auto ba = linear(x, {d[0], ds[0], ds[1], kNone}, how, split);
      at::Tensor inputs = conv_states[conv], matrices = delta_states[conv];  // (written)
      auto gated = gated_delta_net(qkvz, ba, conv_weights_[conv], inputs, conv_rows[0],
                                   conv_rows[1], conv_rows[2], conv_rows[3], conv_rows[4],
                                   delta_starts,
                                   matrices, d[1], d[2], d[3], eps_, delta_key_heads_, delta_tiled_);
      out = linear(gated, {w[2], small[1], dec[1], o_biases_[l]}, how, split);
    } else if (conv >= 0) {  // B, C and x rows; C * conv(B * x) (`Lfm2DecoderLayer.attention`)
      auto bcx = linear(x, {w[1], small[0], dec[0], kNone}, how, split).chunk(3, 1);
      at::Tensor state = conv_states[conv];
      auto mixed = short_convolution(at::mul(bcx[0], bcx[2]), conv_weights_[conv], state,
                                     conv_rows[0], conv_rows[1], conv_rows[2], conv_rows[3],
                                     conv_rows[4]);
      out = linear(at::mul(bcx[1], mixed), {w[2], small[1], dec[1], o_biases_[l]}, how, split);
    } else {
      at::Tensor qkv = linear(x, {w[1], small[0], dec[0], qkv_biases_[l]}, how, split);
      // a gated attention's query rows, each head's followed by its gate's (`split_query_gates`)
      at::Tensor gate;
      if (output_gate_) {
        auto pairs = qkv.narrow(1, 0, 2 * q_size).view({T, num_heads_, 2, head_dim_});
        gate = pairs.select(2, 1).reshape({T, q_size});
        qkv = at::cat({pairs.select(2, 0).reshape({T, q_size}), qkv.narrow(1, 2 * q_size,
                                                                          2 * kv_size)}, 1);
      }
      // queries and keys RMS-normalized, each head (Qwen3's q_norm, k_norm) or all heads as one
      // (OLMo 2's): the weight's width; before RoPE, or after it (Hunyuan's)
      auto normalize_qk = [&] {
        if (!whole_qk_norms_.empty()) return normalize_whole_qk(qkv, l, q_size, kv_size);
        for (int64_t part = 0; part < 2 && !qk_norms_.empty(); ++part) {
          auto heads = qkv.narrow(1, part ? q_size : 0, part ? kv_size : q_size);
          const at::Tensor& norm = qk_norms_[2 * l + part];
          heads.copy_(
              rms_norm(heads.reshape({-1, norm.size(0)}), norm, eps_).view(heads.sizes()));
        }
      };
      if (!qk_norm_after_rope_) normalize_qk();
      const int64_t window = windows_[l];
      if (rotations_[l] != kNoRope) {
        const bool local = rotations_[l] == kLocalRope;
        rope_(qkv, local ? *local_cos : cos, local ? *local_sin : sin, num_heads_ + num_kv_heads_,
              head_dim_);
      }
      if (qk_norm_after_rope_) normalize_qk();
      // each query's temperature (Ministral 3's), by the op the Python layer multiplies with
      if (query_scale.has_value()) qkv.narrow(1, 0, q_size).mul_(*query_scale);
      auto q = qkv.narrow(1, 0, q_size).view({T, num_heads_, head_dim_});
      auto k = qkv.narrow(1, q_size, kv_size).view({T, num_kv_heads_, head_dim_});
      auto v = qkv.narrow(1, q_size + kv_size, kv_size).view({T, num_kv_heads_, head_dim_});
      const auto& kc = k_caches[l];
      const auto& vc = v_caches[l];
      const int64_t group = layer_groups.empty() ? 0 : layer_groups[l];
      const OptTensor decode_tables_l =
          group == 0 || !decode_tables.has_value() ? decode_tables
                                                   : OptTensor(group_decode_tables[group - 1]);
      const OptTensor prefill_tables_l =
          group == 0 || !prefill_tables.has_value() ? prefill_tables
                                                    : OptTensor(group_prefill_tables[group - 1]);
      write_kv(kc, vc, layout, k, v, slots_of[group]);

      at::Tensor attn;
      if (decode_rows.has_value() && decode_all_rows) {
        // every token is a decode, in order: no gather of queries, no scatter of outputs
        attn = paged_decode_attention(q.contiguous(), kc, vc, *decode_tables_l, *decode_lens,
                                      scale_, window, softcap_, sinks_[l]);
      } else {
        attn = at::empty({T, num_heads_, head_dim_}, qkv.options());
        if (decode_rows.has_value()) {
          attn.index_copy_(0, *decode_rows,
                           paged_decode_attention(q.index_select(0, *decode_rows), kc, vc,
                                                  *decode_tables_l, *decode_lens, scale_, window,
                                                  softcap_, sinks_[l]));
        }
        if (prefill_chunks.has_value()) {
          paged_prefill_attention(q, kc, vc, *prefill_chunks, *prefill_tables_l, attn, scale_,
                                  window, softcap_, sinks_[l]);
        }
      }
      at::Tensor gated = attn.view({T, q_size});
      if (output_gate_) gated = at::mul(gated, at::sigmoid(gate));
      out = linear(gated, {w[2], small[1], dec[1], o_biases_[l]}, how, split);
    }
    if (all_reduce_) all_reduce_(out);
    if (!output_norms_.empty()) out = rms_norm(out, output_norms_[2 * l], eps_);
    if (residual_scale_ != 1.0) out = at::mul(out, residual_scale_);  // Granite's residual_multiplier
    x = pre_norms_ ? add_rms_norm(out, res, w[3], eps_) : res.add_(out);
    const int64_t sparse = expert_index_.empty() ? -1 : expert_index_[l];
    if (sparse >= 0) {
      hidden = routed_experts(x, {routers_[sparse], router_biases_[sparse], expert_gate_up_[sparse],
                                  expert_down_[sparse], expert_gate_up_bias_[sparse],
                                  expert_down_bias_[sparse]}, routing);
      // its shared expert, under the sigmoid of its gate where it has one (`MoEDecoderLayer.mlp`)
      const OptTensor* s = shared_experts_.empty() ? nullptr
                                                  : &shared_experts_[sparse * kSharedPerLayer];
      if (s != nullptr && s[0].has_value()) {
        at::Tensor shared = silu_and_mul(linear(x, {*s[0], s[1], s[2], kNone}, how, split));
        shared = linear(shared, {*s[3], s[4], s[5], kNone}, how, split);
        if (s[6].has_value()) {  // (a float32 row: `router_sigmoids`, as `shared_gate_rows` says)
          const bool row = s[6]->layout() == at::kStrided && s[6]->scalar_type() == at::kFloat &&
                           !s[7].has_value() && !s[8].has_value();
          const at::Tensor gate =
              row ? router_sigmoids(x.to(at::kFloat).contiguous(), *s[6]).to(x.scalar_type())
                  : at::sigmoid(linear(x, {*s[6], s[7], s[8], kNone}, how, split));
          shared = at::mul(gate, shared);
        }
        hidden = at::add(hidden, shared);
      }
    } else {
      at::Tensor gate_up = linear(x, {w[4], small[2], dec[2], kNone}, how, split);
      // the MLP's activation: gated (SiLU or tanh-GELU of the gate times up), or ReLU squared
      // of an ungated up projection (`DecoderLayer.squared_relu`)
      const at::Tensor act = squared_relu_ ? at::square(at::relu(gate_up))
                             : gelu_       ? gelu_tanh_and_mul(gate_up)
                                          : silu_and_mul(gate_up);
      hidden = linear(act, {w[5], small[3], dec[3], kNone}, how, split);
    }
    if (all_reduce_) all_reduce_(hidden);
    if (!output_norms_.empty()) hidden = rms_norm(hidden, output_norms_[2 * l + 1], eps_);
    if (residual_scale_ != 1.0) hidden = at::mul(hidden, residual_scale_);
  }
  return {hidden, res};
}
