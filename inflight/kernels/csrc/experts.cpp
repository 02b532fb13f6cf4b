// A mixture of experts' routed experts over GGUF blocks, a layer's (or a pass's) in one call:
// what `moe.MoEDecoderLayer._host_routed_experts` does in Python (a dozen tensor ops and two
// linear calls an expert, each costing more than a decode row's multiply), with the same
// kernels in the same order, so that every token's sum rounds as it does there.
//
// Each expert takes its (token, rank) pairs in ascending token order; its [gate | up] rows,
// SiLU(gate) * up (gpt-oss's clamped SwiGLU, its biases added), and down rows come from
// `gguf_int_linear_many` (every chosen expert's [gate | up] in one parallel region, then every
// down: a decode token's experts are a few small products each, whose joins cost more than
// their work apart) and `silu_and_mul`; each
// output row is multiplied by its router weight, then added into its token's row, experts in
// ascending order (as `index_add_` adds the pairs sorted by expert).
//
// `route_experts` is the float32 router that chooses them where a layer's routing is that
// simple (`moe.fused_routing`): each token's row alone, in a fixed order, so a token's choice
// never depends on its batch, and both layer loops (Python's and the fused C++ one) call it.
#include "ops.h"

#include <ATen/ops/empty_cpu_dispatch.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace {

// x . w over n floats: 16 running sums (one vector register's lanes, or two), each a fixed
// sequence of products and adds, then halved pairwise: the same bits at any batch and thread.
float dot(const float* __restrict x, const float* __restrict w, int64_t n) {
  constexpr int kSums = 16;
  float acc[kSums] = {};
  int64_t i = 0;
  for (; i + kSums <= n; i += kSums) {
#pragma omp simd
    for (int j = 0; j < kSums; ++j) acc[j] += x[i + j] * w[i + j];
  }
  for (int j = 0; i + j < n; ++j) acc[j] += x[i + j] * w[i + j];
  for (int width = kSums / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  return acc[0];
}

// A router's sigmoid, one scalar formula for every score: ATen's vector sigmoid rounds otherwise
// than its scalar tail, and a token's scores would change with where its row fell in the step
inline float sigmoid_of(float logit) { return 1.f / (1.f + std::exp(-logit)); }

// a > b in top-k order: NaN above every number (as `torch.topk` ranks it), so a row of NaN
// still chooses experts in range
bool ranks_above(float a, float b) { return std::isnan(a) ? !std::isnan(b) : a > b; }

// how a router turns its logits into scores: a softmax over all experts, each expert's own
// sigmoid, or (gpt-oss's) the logits themselves, the chosen ones' softmax their weights
enum class RouterScoring { kSoftmax, kSigmoid, kSoftmaxOfChosen };

RouterScoring router_scoring(const std::string& name) {
  if (name == "softmax") return RouterScoring::kSoftmax;
  if (name == "sigmoid") return RouterScoring::kSigmoid;
  INFLIGHT_CHECK(name == "softmax_of_chosen",
                 "a router's scoring is softmax, sigmoid or softmax_of_chosen");
  return RouterScoring::kSoftmaxOfChosen;
}

}  // namespace

at::Tensor router_logits(const at::Tensor& x, const at::Tensor& router) {
  INFLIGHT_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
                 "x: [tokens, hidden] float32, contiguous");
  INFLIGHT_CHECK(router.dim() == 2 && router.size(1) == x.size(1) &&
                     router.scalar_type() == at::kFloat && router.is_contiguous(),
                 "router: [experts, hidden] float32, contiguous");
  const int64_t T = x.size(0), H = x.size(1), E = router.size(0);
  auto logits = at::cpu::empty({T, E}, x.options());
  const float *xp = x.data_ptr<float>(), *rp = router.data_ptr<float>();
  float* lp = logits.data_ptr<float>();
  // threads share the tokens, or a lone token's experts (a decode's router: [E, H] floats)
  at::parallel_for(0, T * E, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(H, 1)),
                   [&](int64_t a, int64_t b) {
                     for (int64_t i = a; i < b; ++i) {
                       lp[i] = dot(xp + (i / E) * H, rp + (i % E) * H, H);
                     }
                   });
  return logits;
}

at::Tensor router_sigmoids(const at::Tensor& x, const at::Tensor& router) {
  at::Tensor scores = router_logits(x, router);  // [T, E]
  float* l = scores.data_ptr<float>();
  for (int64_t i = 0; i < scores.numel(); ++i) l[i] = sigmoid_of(l[i]);
  return scores;
}

std::vector<at::Tensor> route_experts(const at::Tensor& x, const at::Tensor& router,
                                      const c10::optional<at::Tensor>& bias, int64_t top_k,
                                      const std::string& scoring, bool renormalize, double eps,
                                      double scale) {
  const RouterScoring how = router_scoring(scoring);
  const at::Tensor logits = router_logits(x, router);  // (x and the router checked there)
  const int64_t T = x.size(0), E = router.size(0);
  INFLIGHT_CHECK(E > 0 && top_k > 0 && top_k <= E, "top_k ", top_k, " of ", E, " experts");
  INFLIGHT_CHECK(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == E &&
                                       bias->scalar_type() == at::kFloat && bias->is_contiguous()),
                 "bias: [experts] float32, contiguous");
  auto weights = at::cpu::empty({T, top_k}, x.options());
  auto chosen = at::cpu::empty({T, top_k}, x.options().dtype(at::kLong));
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* wp = weights.data_ptr<float>();
  int64_t* cp = chosen.data_ptr<int64_t>();
  const float eps_f = static_cast<float>(eps), scale_f = static_cast<float>(scale);
  const float* lp = logits.data_ptr<float>();
  at::parallel_for(0, T, 64, [&](int64_t a, int64_t b) {
    std::vector<float> scores(E), choice(E);
    std::vector<char> taken(E);
    for (int64_t t = a; t < b; ++t) {
      const float* l = lp + t * E;
      if (how == RouterScoring::kSigmoid) {
        for (int64_t e = 0; e < E; ++e) scores[e] = sigmoid_of(l[e]);
      } else if (how == RouterScoring::kSoftmax) {  // its sum in expert order
        float top = l[0], sum = 0.f;
        for (int64_t e = 1; e < E; ++e) top = std::fmax(top, l[e]);
        for (int64_t e = 0; e < E; ++e) sum += (scores[e] = std::exp(l[e] - top));
        for (int64_t e = 0; e < E; ++e) scores[e] /= sum;
      } else {  // the logits (the bias is the router linear's: in them), softmaxed once chosen
        for (int64_t e = 0; e < E; ++e) scores[e] = bp ? l[e] + bp[e] : l[e];
      }
      const bool choice_bias = bp && how != RouterScoring::kSoftmaxOfChosen;
      for (int64_t e = 0; e < E; ++e) choice[e] = choice_bias ? scores[e] + bp[e] : scores[e];
      std::fill(taken.begin(), taken.end(), 0);
      float total = 0.f;
      for (int64_t r = 0; r < top_k; ++r) {  // the best first; ties to the lower expert
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e) {
          if (!taken[e] && (best < 0 || ranks_above(choice[e], choice[best]))) best = e;
        }
        taken[best] = 1;
        cp[t * top_k + r] = best;
        wp[t * top_k + r] = scores[best];
        total += scores[best];
      }
      if (how == RouterScoring::kSoftmaxOfChosen) {  // best first: the first is the max
        float* w = wp + t * top_k;
        const float top = w[0];
        float sum = 0.f;
        for (int64_t r = 0; r < top_k; ++r) sum += (w[r] = std::exp(w[r] - top));
        for (int64_t r = 0; r < top_k; ++r) w[r] = w[r] / sum * scale_f;
        continue;
      }
      for (int64_t r = 0; r < top_k; ++r) {
        float& w = wp[t * top_k + r];
        if (renormalize) w /= total + eps_f;
        w *= scale_f;
      }
    }
  });
  return {weights, chosen};
}

at::Tensor gguf_int_experts(const at::Tensor& x, const at::Tensor& chosen,
                            const at::Tensor& weights, const std::vector<at::Tensor>& gate_up,
                            const std::vector<at::Tensor>& down, int64_t intermediate,
                            int64_t activation_bits, const std::vector<at::Tensor>& gate_up_bias,
                            const std::vector<at::Tensor>& down_bias, double swiglu_limit,
                            double swiglu_alpha) {
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
  for (const auto& [biases, width] : {std::pair{&gate_up_bias, 2 * intermediate},
                                      std::pair{&down_bias, H}}) {
    INFLIGHT_CHECK(biases->empty() || static_cast<int64_t>(biases->size()) == E,
                   "no biases, or one an expert");
    for (const at::Tensor& b : *biases) {
      INFLIGHT_CHECK(b.dim() == 1 && b.size(0) == width && b.scalar_type() == at::kFloat,
                     "an expert's bias: [", width, "] float32");
    }
  }
  INFLIGHT_CHECK(swiglu_limit >= 0.0 && std::isfinite(swiglu_limit) && std::isfinite(swiglu_alpha),
                 "swiglu_limit: 0 (SiLU) or a positive limit, and a finite alpha");
  const int64_t* c = chosen.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> pairs(E);  // each expert's t * k + rank, tokens ascending
  for (int64_t p = 0; p < T * k; ++p) {
    INFLIGHT_CHECK(c[p] >= 0 && c[p] < E, "expert ", c[p], " of ", E);
    pairs[c[p]].push_back(p);
  }
  std::vector<int64_t> used;  // the chosen experts, ascending
  for (int64_t e = 0; e < E; ++e) {
    if (!pairs[e].empty()) used.push_back(e);
  }
  const size_t U = used.size();
  std::vector<std::vector<int64_t>> tokens(U);
  std::vector<at::Tensor> xs(U), ins(U), outs(U);
  std::vector<int64_t> widths(U, 2 * intermediate);
  for (size_t u = 0; u < U; ++u) {
    const std::vector<int64_t>& mine = pairs[used[u]];
    const int64_t n = static_cast<int64_t>(mine.size());
    for (const int64_t p : mine) tokens[u].push_back(p / k);
    // (one token, a decode's: its row in place, where a gather cost more than the lookup)
    xs[u] = n == 1 ? x.narrow(0, tokens[u][0], 1)
                   : x.index_select(0, at::from_blob(tokens[u].data(), {n}, at::kLong));
    ins[u] = gate_up[used[u]];
    outs[u] = at::cpu::empty({n, 2 * intermediate}, x.options());
  }
  gguf_int_linear_many(xs, ins, widths, outs, activation_bits);
  // (a bias adds to the kernel's float32 output as the kernel itself adds it: the same bits)
  for (size_t u = 0; u < U && !gate_up_bias.empty(); ++u) outs[u].add_(gate_up_bias[used[u]]);
  for (size_t u = 0; u < U; ++u) {  // (gpt-oss's clamped SwiGLU where it has a limit)
    xs[u] = swiglu_limit > 0.0 ? clamped_swiglu(outs[u], swiglu_limit, swiglu_alpha)
                               : silu_and_mul(outs[u]);
  }
  std::fill(widths.begin(), widths.end(), H);
  for (size_t u = 0; u < U; ++u) {
    ins[u] = down[used[u]];
    outs[u] = at::cpu::empty({xs[u].size(0), H}, x.options());
  }
  gguf_int_linear_many(xs, ins, widths, outs, activation_bits);
  for (size_t u = 0; u < U && !down_bias.empty(); ++u) outs[u].add_(down_bias[used[u]]);
  auto out = at::zeros({T, H}, x.options());
  float* o = out.data_ptr<float>();
  const float* w = weights.data_ptr<float>();
  for (size_t u = 0; u < U; ++u) {
    const std::vector<int64_t>& mine = pairs[used[u]];
    const float* hp = outs[u].data_ptr<float>();
    for (size_t j = 0; j < mine.size(); ++j) {
      const float scale = w[mine[j]];
      float* row = o + tokens[u][j] * H;
      const float* src = hp + j * H;
      for (int64_t d = 0; d < H; ++d) {
        const float weighted = src[d] * scale;  // (rounded apart: -ffp-contract=off)
        row[d] += weighted;
      }
    }
  }
  return out;
}

at::Tensor gguf_routed_experts(const at::Tensor& x, const at::Tensor& router,
                               const c10::optional<at::Tensor>& bias, int64_t top_k,
                               const std::string& scoring, bool renormalize, double eps,
                               double scale, const std::vector<at::Tensor>& gate_up,
                               const std::vector<at::Tensor>& down, int64_t intermediate,
                               int64_t activation_bits, int64_t pass_tokens,
                               const std::vector<at::Tensor>& gate_up_bias,
                               const std::vector<at::Tensor>& down_bias, double swiglu_limit,
                               double swiglu_alpha) {
  INFLIGHT_CHECK(pass_tokens > 0, "pass_tokens must be positive, got ", pass_tokens);
  INFLIGHT_CHECK(static_cast<int64_t>(gate_up.size()) == router.size(0),
                 "one expert per router row");
  const std::vector<at::Tensor> routed =
      route_experts(x, router, bias, top_k, scoring, renormalize, eps, scale);
  const at::Tensor &weights = routed[0], &chosen = routed[1];
  const int64_t T = x.size(0);
  auto experts = [&](int64_t a, int64_t n) {
    return gguf_int_experts(x.narrow(0, a, n), chosen.narrow(0, a, n), weights.narrow(0, a, n),
                            gate_up, down, intermediate, activation_bits, gate_up_bias,
                            down_bias, swiglu_limit, swiglu_alpha);
  };
  if (T <= pass_tokens) return experts(0, T);
  auto out = at::cpu::empty(x.sizes(), x.options());
  for (int64_t a = 0; a < T; a += pass_tokens) {
    const int64_t n = std::min(pass_tokens, T - a);
    out.narrow(0, a, n).copy_(experts(a, n));
  }
  return out;
}
