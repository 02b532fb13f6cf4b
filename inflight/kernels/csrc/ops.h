// The CPU kernels of inflight, compiled together into one extension (see inflight/kernels).
//
// Only ATen's Tensor and the operators each file calls are included (`ATen/ops/*.h`), never the
// whole of `torch/extension.h` (pybind11, autograd, every operator): that header alone takes
// longer to compile than all of this project's kernels, and a new machine waits for the build.
// Outputs come from `at::cpu::empty` (`ATen/ops/empty_cpu_dispatch.h`): `ATen/ops/empty.h`
// brings the dispatcher's context and doubles a file's compile time (~5 s more each).
#pragma once
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>

#include "check.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

// paged_attention.cpp
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                     const at::Tensor& v_cache,
                                     const at::Tensor& block_tables,
                                     const at::Tensor& seq_lens, double scale, int64_t window,
                                     double softcap, const c10::optional<at::Tensor>& sinks);

// kv_cache.cpp: key/value [T, KVH, D] written at their slots in the kernels' layout (kv_layout.h)
void write_kv_cache(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& key,
                    const at::Tensor& value, const at::Tensor& slot_mapping);
// Whether the attention kernels read values out of their keys (`kv_layout.h`) in this block
// size, head_dim and cache dtype: blocks of multiples of 16 positions, heads of multiples of 32
// dims, no float16, on a CPU with AVX2 (the AVX2 items' shapes).
bool values_from_keys(int64_t block_size, int64_t head_dim, at::ScalarType dtype);

// prefill_attention.cpp
at::Tensor paged_prefill_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                      const at::Tensor& v_cache, const at::Tensor& chunks,
                                      const at::Tensor& block_tables, at::Tensor& out,
                                      double scale, int64_t window, double softcap,
                                      const c10::optional<at::Tensor>& sinks);

// layer_ops.cpp: fused element-wise parts of a decoder layer, rounding as PyTorch's unfused ops do
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor add_rms_norm(const at::Tensor& x, at::Tensor& residual,
                           const at::Tensor& weight, double eps);
at::Tensor silu_and_mul(const at::Tensor& gate_up);
// gpt-oss's expert activation, (clamp(up, +-limit) + 1) * g * sigmoid(alpha g) for
// g = min(gate, limit), over rows [gate | up], each row alone (its bits never its batch's)
at::Tensor clamped_swiglu(const at::Tensor& gate_up, double limit, double alpha);
void rope_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
           int64_t num_heads, int64_t head_dim);
// a causal depthwise convolution of x [T, C] with weight [C, kernel] (LFM2's, Qwen3.5's), each
// request's earlier inputs read from state [rows, kernel - 1, C] at read_rows, the step's last
// ones written at write_rows (`runner.conv_state.ConvStep`'s taps and keep index the step's rows
// then the rows read); each product and sum rounded as PyTorch's ops round them -> [T, C].
// snapshot_rows (int64 [T], or empty): where a token's entry is a row, the state after that
// token is written there too (a speculating request's, for whichever draft it keeps last)
// snapshot_rows' entries checked against the state's rows (nullptr: none)
const int64_t* snapshot_rows_of(const at::Tensor& snapshot_rows, int64_t T, int64_t rows);
at::Tensor short_convolution(const at::Tensor& x, const at::Tensor& weight, at::Tensor& state,
                             const at::Tensor& taps, const at::Tensor& keep,
                             const at::Tensor& read_rows, const at::Tensor& write_rows,
                             const at::Tensor& snapshot_rows);

// gated_delta.cpp: the gated delta rule (Qwen3.5's DeltaNet layers) over each request's rows
// [starts[r], starts[r + 1]) of q, k [T, H, K], v [T, H, V], g and beta [T, H] (float32), its
// state matrices read from `states` [rows, H, K, V] at read_rows[r] and written at
// write_rows[r] (and after a token at its snapshot_rows entry, as short_convolution's); returns
// o [T, H, V]
at::Tensor gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& g, const at::Tensor& beta, at::Tensor& states,
                            const at::Tensor& read_rows, const at::Tensor& write_rows,
                            const at::Tensor& snapshot_rows, const std::vector<int64_t>& starts);
// a DeltaNet layer between its projections: qkvz [T, q | k | v | z] and ba [T, b | a] (the model's
// dtype) through the short convolution (its state and ConvStep rows), SiLU, the rule (its state
// matrices `states`), the per-head RMSNorm times SiLU(z) -> [T, value heads x value dim]
at::Tensor gated_delta_net(const at::Tensor& qkvz, const at::Tensor& ba,
                           const at::Tensor& conv_weight, at::Tensor& conv_state,
                           const at::Tensor& taps, const at::Tensor& keep,
                           const at::Tensor& read_rows, const at::Tensor& write_rows,
                           const at::Tensor& snapshot_rows, const std::vector<int64_t>& starts,
                           at::Tensor& states,
                           const at::Tensor& decay_rate, const at::Tensor& dt_bias,
                           const at::Tensor& norm_weight, double eps, int64_t key_heads,
                           bool tiled);

// bf16_linear.cpp: bfloat16 linear layers for decode-sized batches (AVX-512 BF16 machines only)
bool bf16_linear_available();
// `out`, where given: the packing's memory, [ceil(N / 32), K / 2, 32, 2] bf16 (its own pages)
at::Tensor pack_bf16_linear(const at::Tensor& weight, const c10::optional<at::Tensor>& out);
// `_into`: the same into y, rows of out_features in x's dtype (a slice of a larger output)
void bf16_linear_into(const at::Tensor& x, const at::Tensor& packed,
                      const c10::optional<at::Tensor>& bias, int64_t out_features, at::Tensor& y);
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& packed,
                          const c10::optional<at::Tensor>& bias, int64_t out_features);

// gguf_linear.cpp: float32 linear layers over GGUF Q4_0 / Q4_1 / Q8_0 blocks, for decode-sized
// batches (AVX2 + FMA + F16C machines only)
bool gguf_linear_available();
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& blocks,
                       const c10::optional<at::Tensor>& bias, int64_t out_features);

// gguf_int_linear.cpp: the same with x rounded to 8 or 16 bits per block of 32 and integer dot
// products, over blocks regrouped 8 columns at a time (inflight/model/gguf_blocks.py; the 5-bit
// and K-quant formats by gguf_regroup.cpp)
bool gguf_int_linear_available();
// columns per group of the layout gguf_int_linear reads x of that many bits over (8 or 16)
int64_t gguf_int_linear_columns(int64_t activation_bits);
// the fewest rows of an 8-bit batch that gguf_int_linear multiplies on AMX tiles (0: never here)
int64_t gguf_int_linear_tile_rows();
// whether 8-bit x's products sum four at a time in one instruction here (AVX-512 VNNI)
bool gguf_int_linear_byte_dots();
void gguf_int_linear_into(const at::Tensor& x, const at::Tensor& packed,
                          const c10::optional<at::Tensor>& bias, int64_t out_features,
                          int64_t activation_bits, at::Tensor& y);
at::Tensor gguf_int_linear(const at::Tensor& x, const at::Tensor& packed,
                           const c10::optional<at::Tensor>& bias, int64_t out_features,
                           int64_t activation_bits);
// several unbiased linears y_i = x_i W_i^T, each as gguf_int_linear computes it, the few-row ones
// (a decode token's experts) sharing one parallel region
void gguf_int_linear_many(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& packed,
                          const std::vector<int64_t>& out_features, std::vector<at::Tensor>& ys,
                          int64_t activation_bits);
// experts.cpp: a mixture of experts' chosen experts (their [gate | up] and down packings for
// gguf_int_linear, each with its biases where given; SiLU-gated, or gpt-oss's clamped SwiGLU
// where swiglu_limit > 0) over x [tokens, hidden], each output times its router weight and
// added into its token's row in expert order -> [tokens, hidden]
at::Tensor gguf_int_experts(const at::Tensor& x, const at::Tensor& chosen,
                            const at::Tensor& weights, const std::vector<at::Tensor>& gate_up,
                            const std::vector<at::Tensor>& down, int64_t intermediate,
                            int64_t activation_bits,
                            const std::vector<at::Tensor>& gate_up_bias = {},
                            const std::vector<at::Tensor>& down_bias = {},
                            double swiglu_limit = 0.0, double swiglu_alpha = 0.0);
// x [tokens, hidden] times a float32 router [experts, hidden]: each logit one row's dot product
// in a fixed order (16 running sums halved pairwise), the same bits at any batch and thread
// count -> [tokens, experts] float32
at::Tensor router_logits(const at::Tensor& x, const at::Tensor& router);
// sigmoid(router_logits(x, router)), each sigmoid scalar (a sigmoid router's scores, a shared
// expert's gate of one row) -> [tokens, experts] float32
at::Tensor router_sigmoids(const at::Tensor& x, const at::Tensor& router);
// a float32 router's choice for each token of x [tokens, hidden]: its best `top_k` experts by
// `scoring` "sigmoid" or "softmax" scores (plus `bias`, where given), and their scores as weights,
// renormalized (+ eps) where asked and times `scale`; or ("softmax_of_chosen", gpt-oss's) by its
// logits (plus `bias`, the router linear's), the chosen ones' softmax as weights, times `scale`
// -> {weights float32, chosen int64}, both [tokens, k]
std::vector<at::Tensor> route_experts(const at::Tensor& x, const at::Tensor& router,
                                      const c10::optional<at::Tensor>& bias, int64_t top_k,
                                      const std::string& scoring, bool renormalize, double eps,
                                      double scale);
// route_experts, then gguf_int_experts over the tokens in passes of at most `pass_tokens`
at::Tensor gguf_routed_experts(const at::Tensor& x, const at::Tensor& router,
                               const c10::optional<at::Tensor>& bias, int64_t top_k,
                               const std::string& scoring, bool renormalize, double eps,
                               double scale, const std::vector<at::Tensor>& gate_up,
                               const std::vector<at::Tensor>& down, int64_t intermediate,
                               int64_t activation_bits, int64_t pass_tokens,
                               const std::vector<at::Tensor>& gate_up_bias = {},
                               const std::vector<at::Tensor>& down_bias = {},
                               double swiglu_limit = 0.0, double swiglu_alpha = 0.0);
// each head's rows [rows, heads, in] through its own packing -> [heads, rows, out_features]
at::Tensor gguf_int_linear_heads(const at::Tensor& x, const std::vector<at::Tensor>& packed,
                                 int64_t out_features, int64_t activation_bits);

// gguf_regroup.cpp: a weight's Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K blocks in gguf_int_linear's
// 8-column layout; `out`, where given, is the layout's memory (contiguous, any contents)
at::Tensor gguf_regroup_blocks(const at::Tensor& blocks, const c10::optional<at::Tensor>& out);
// rows `ids` of a weight's 5-bit, K-quant or MXFP4 blocks [rows, blocks per row, file block bytes]
// as float32, gguf's dequantization bit for bit (a token embedding's lookup)
at::Tensor gguf_dequantize_rows(const at::Tensor& blocks, const at::Tensor& ids);
// the same rows read from their 8-column layout (`gguf_regroup_blocks`) of `rows` rows: a tied
// embedding looked up in its LM head's packing
at::Tensor gguf_dequantize_layout_rows(const at::Tensor& layout, const at::Tensor& ids,
                                       int64_t rows);

// argmax.cpp: greedy sampling, the first maximum of each row as torch.max picks it
at::Tensor first_argmax(const at::Tensor& x);

