// A mixture of experts' routed experts over GGUF blocks, a layer's (or a pass's) in one call:
// what `moe.MoEDecoderLayer._host_routed_experts` does in Python (a dozen tensor ops and two
// linear calls an expert, each costing more than a decode row's multiply), with the same
// kernels in the same order, so that every token's sum rounds as it does there.
//
// Each expert takes its (token, rank) pairs in ascending token order; its [gate | up] rows,
// SiLU(gate) * up, and down rows come from `gguf_int_linear_into` and `silu_and_mul`; each
// output row is multiplied by its router weight, then added into its token's row, experts in
// ascending order (as `index_add_` adds the pairs sorted by expert).
#include "ops.h"

#include <ATen/ops/empty_cpu_dispatch.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/zeros.h>

#include <vector>

at::Tensor gguf_int_experts(const at::Tensor& x, const at::Tensor& chosen,
                            const at::Tensor& weights, const std::vector<at::Tensor>& gate_up,
                            const std::vector<at::Tensor>& down, int64_t intermediate,
                            int64_t activation_bits) {
  const int64_t E = static_cast<int64_t>(gate_up.size());
  INFLIGHT_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
                 "x: [tokens, hidden] float32, contiguous");
  INFLIGHT_CHECK(chosen.dim() == 2 && chosen.size(0) == x.size(0) &&
                     chosen.scalar_type() == at::kLong && chosen.is_contiguous(),
                 "chosen: [tokens, k] int64, contiguous");
  INFLIGHT_CHECK(weights.sizes() == chosen.sizes() && weights.scalar_type() == at::kFloat &&
                     weights.is_contiguous(),
                 "weights: [tokens, k] float32, contiguous");
  INFLIGHT_CHECK(static_cast<int64_t>(down.size()) == E && E > 0,
                 "one gate_up and one down packing an expert");
  const int64_t T = x.size(0), H = x.size(1), k = chosen.size(1);
  const int64_t* c = chosen.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> pairs(E);  // each expert's t * k + rank, tokens ascending
  for (int64_t p = 0; p < T * k; ++p) {
    INFLIGHT_CHECK(c[p] >= 0 && c[p] < E, "expert ", c[p], " of ", E);
    pairs[c[p]].push_back(p);
  }
  auto out = at::zeros({T, H}, x.options());
  float* o = out.data_ptr<float>();
  const float* w = weights.data_ptr<float>();
  std::vector<int64_t> tokens;
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int64_t>& mine = pairs[e];
    const int64_t n = static_cast<int64_t>(mine.size());
    if (n == 0) continue;
    tokens.resize(n);
    for (int64_t j = 0; j < n; ++j) tokens[j] = mine[j] / k;
    // (one token, a decode's: its row in place, where a gather cost more than the lookup)
    const at::Tensor xe =
        n == 1 ? x.narrow(0, tokens[0], 1)
               : x.index_select(0, at::from_blob(tokens.data(), {n}, at::kLong));
    at::Tensor gu = at::cpu::empty({n, 2 * intermediate}, x.options());
    gguf_int_linear_into(xe, gate_up[e], c10::nullopt, 2 * intermediate, activation_bits, gu);
    const at::Tensor act = silu_and_mul(gu);
    at::Tensor h = at::cpu::empty({n, H}, x.options());
    gguf_int_linear_into(act, down[e], c10::nullopt, H, activation_bits, h);
    const float* hp = h.data_ptr<float>();
    for (int64_t j = 0; j < n; ++j) {
      const float scale = w[mine[j]];
      float* row = o + tokens[j] * H;
      const float* src = hp + j * H;
      for (int64_t d = 0; d < H; ++d) {
        const float weighted = src[d] * scale;  // (rounded apart: -ffp-contract=off)
        row[d] += weighted;
      }
    }
  }
  return out;
}
