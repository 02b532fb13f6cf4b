// The gated delta rule of Qwen3.5's DeltaNet layers (`model/qwen3_5.gated_delta_rule`, the same
// arithmetic): each request's tokens in turn, each value head's state matrix S [K, V] held in
// the thread's own buffer, two passes over it a token. The first decays S and reads what it
// remembers of the key (S^T k); the second writes the correction k (beta (v - S^T k))^T and
// reads the output S^T q. Rows of S are V floats apart, so each pass is vector code along V.
//
// `gated_delta_net` is a whole DeltaNet layer between its input and output projections
// (`Qwen3_5DecoderLayer.delta_net`, op for op: the convolution, SiLU, L2-normalized q and k,
// beta and the decay, the rule, the per-head RMSNorm times SiLU(z)), in one call: at a decode
// step the two dozen PyTorch ops around the rule cost more than the rule's own pass over the
// state. Values round to the model's dtype where those ops round them; exp is the polynomial
// of layer_ops.cpp's SiLU, so a value may land an ulp from PyTorch's.
#include "ops.h"
#include "vec_math.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty_cpu_dispatch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

namespace {

// One request's rows [begin, end) of one head: S read from `from`, written to `to`. The first
// token's decay reads `from` and writes `to` (the state moves rows without a copy of its own);
// every later pass works on `to` in place. Where `snap` names a row for a token, S after it is
// copied to that row's matrix of this head (`states` + (row H + h) K V).
void delta_head(const float* q, const float* k, const float* v, const float* g,
                const float* beta, const float* from, float* to, float* out, int64_t begin,
                int64_t end, int64_t H, int64_t h, int64_t K, int64_t V, const int64_t* snap,
                float* states) {
  if (begin == end) {
    if (from != to) std::memcpy(to, from, sizeof(float) * K * V);
    return;
  }
  std::vector<float> remembered(V), delta(V);
  for (int64_t t = begin; t < end; ++t) {
    const float* kt = k + (t * H + h) * K;
    const float* qt = q + (t * H + h) * K;
    const float* vt = v + (t * H + h) * V;
    const float decay = std::exp(g[t * H + h]), b = beta[t * H + h];
    const float* src = t == begin ? from : to;
    std::fill(remembered.begin(), remembered.end(), 0.0f);
    for (int64_t i = 0; i < K; ++i) {
      const float* in = src + i * V;
      float* row = to + i * V;
      const float ki = kt[i];
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) {
        row[j] = in[j] * decay;
        remembered[j] += row[j] * ki;
      }
    }
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) delta[j] = (vt[j] - remembered[j]) * b;
    float* o = out + (t * H + h) * V;
    std::fill(o, o + V, 0.0f);
    for (int64_t i = 0; i < K; ++i) {
      float* row = to + i * V;
      const float ki = kt[i], qi = qt[i];
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) {
        row[j] += ki * delta[j];
        o[j] += row[j] * qi;
      }
    }
    if (snap != nullptr && snap[t] >= 0) {
      std::memcpy(states + (snap[t] * H + h) * K * V, to, sizeof(float) * K * V);
    }
  }
}

// The rule over each request's rows [starts[r], starts[r + 1]), its state matrices read from
// `states` at read_rows[r] and written at write_rows[r]: a (request, head) per work item.
void run_rule(const float* qp, const float* kp, const float* vp, const float* gp,
              const float* bp, at::Tensor& states, const at::Tensor& read_rows,
              const at::Tensor& write_rows, const at::Tensor& snapshot_rows,
              const std::vector<int64_t>& starts, int64_t T, int64_t H, int64_t K, int64_t V,
              float* op) {
  const int64_t R = static_cast<int64_t>(starts.size()) - 1;
  INFLIGHT_CHECK(R >= 0 && read_rows.numel() == R && write_rows.numel() == R &&
                     read_rows.scalar_type() == at::kLong &&
                     write_rows.scalar_type() == at::kLong,
                 "gated_delta_rule: one int64 read and write row per request");
  const auto rows = states.size(0);
  auto read = read_rows.contiguous(), write = write_rows.contiguous();
  const int64_t *reads = read.data_ptr<int64_t>(), *writes = write.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) {
    INFLIGHT_CHECK(0 <= reads[r] && reads[r] < rows && 0 <= writes[r] && writes[r] < rows &&
                       0 <= starts[r] && starts[r] <= starts[r + 1] && starts[r + 1] <= T,
                   "gated_delta_rule: request ", r, "'s rows or state rows are out of range");
  }
  const int64_t* snap = snapshot_rows_of(snapshot_rows, T, rows);
  float* sp = states.data_ptr<float>();
  const int64_t matrix = K * V;
  at::parallel_for(0, R * H, 1, [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) {
      const int64_t r = item / H, h = item % H;
      delta_head(qp, kp, vp, gp, bp, sp + (reads[r] * H + h) * matrix,
                 sp + (writes[r] * H + h) * matrix, op, starts[r], starts[r + 1], H, h, K, V,
                 snap, sp);
    }
  });
}

// f rounded to X, as a PyTorch op's X result rounds it
template <class X>
inline float rounded(float f) {
  return static_cast<float>(static_cast<X>(f));
}

// (exp as layer_ops.cpp's SiLU takes it: a polynomial the loops below vectorize)
inline float silu(float x) { return x / (1.f + exp_poly(-x)); }

// PyTorch's softplus (beta 1, threshold 20)
inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

// Each head's n values SiLU'd (rounded to X, as `F.silu` on X rounds), as float32; where
// `scale` > 0, L2-normalized (then divided by `scale`) as `qwen3_5.l2_normalized` does.
template <class X>
void silu_head(const X* in, int64_t n, float scale, float* out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = rounded<X>(silu(static_cast<float>(in[i])));
  if (scale <= 0.f) return;
  float squares = 0.f;
  for (int64_t i = 0; i < n; ++i) squares += out[i] * out[i];
  const float inverse = 1.f / std::sqrt(squares + 1e-6f);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = out[i] * inverse / scale;
}

// The rule's float32 inputs from the convolution's output `mixed` [T, q | k | v] and b, a:
// q and k per key head, each value head given its key head's (every key-heads-th value head
// where the heads are tiled, else consecutive ones); beta = sigmoid(b) rounded to X; the log
// decay g = decay_rate softplus(a + dt_bias), float32.
template <class X>
void rule_inputs(const X* mixed, const X* ba, int64_t ba_stride, const float* decay,
                 const float* dt, int64_t T, int64_t H, int64_t KH, int64_t K, int64_t V,
                 bool tiled, float* q, float* k, float* v, float* g, float* beta) {
  const int64_t keys = KH * K, width = 2 * keys + H * V, repeats = H / KH;
  const float scale = static_cast<float>(std::sqrt(static_cast<double>(K)));
  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qh(K), kh(K);
    for (int64_t t = begin; t < end; ++t) {
      const X* row = mixed + t * width;
      for (int64_t j = 0; j < KH; ++j) {
        silu_head(row + j * K, K, scale, qh.data());
        silu_head(row + keys + j * K, K, 1.f, kh.data());
        for (int64_t r = 0; r < repeats; ++r) {
          const int64_t h = tiled ? r * KH + j : j * repeats + r;
          std::copy(qh.begin(), qh.end(), q + (t * H + h) * K);
          std::copy(kh.begin(), kh.end(), k + (t * H + h) * K);
        }
      }
      silu_head(row + 2 * keys, H * V, 0.f, v + t * H * V);
      const X* bt = ba + t * ba_stride;
      for (int64_t h = 0; h < H; ++h) {
        beta[t * H + h] = rounded<X>(1.f / (1.f + exp_poly(-static_cast<float>(bt[h]))));
        g[t * H + h] = decay[h] * softplus(static_cast<float>(bt[H + h]) + dt[h]);
      }
    }
  });
}

// The normalized outputs [T, n] times SiLU(z) in float32, rounded to X.
template <class X>
void gate_outputs(const X* normed, const X* z, int64_t z_stride, int64_t T, int64_t n,
                  X* out) {
  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const X* zt = z + t * z_stride;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        out[t * n + i] = static_cast<X>(static_cast<float>(normed[t * n + i]) *
                                        silu(static_cast<float>(zt[i])));
      }
    }
  });
}

}  // namespace

at::Tensor gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& g, const at::Tensor& beta, at::Tensor& states,
                            const at::Tensor& read_rows, const at::Tensor& write_rows,
                            const at::Tensor& snapshot_rows, const std::vector<int64_t>& starts) {
  const std::initializer_list<const at::Tensor*> floats{&q, &k, &v, &g, &beta, &states};
  for (const at::Tensor* t : floats) {
    INFLIGHT_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->is_cpu(),
                   "gated_delta_rule takes contiguous float32 CPU tensors, not ",
                   t->scalar_type());
  }
  INFLIGHT_CHECK(q.dim() == 3 && k.sizes() == q.sizes() && v.dim() == 3 &&
                     v.size(0) == q.size(0) && v.size(1) == q.size(1),
                 "gated_delta_rule: q and k [T, H, K], v [T, H, V], not ", q.sizes(), ", ",
                 k.sizes(), ", ", v.sizes());
  const int64_t T = q.size(0), H = q.size(1), K = q.size(2), V = v.size(2);
  INFLIGHT_CHECK(g.dim() == 2 && g.size(0) == T && g.size(1) == H && beta.sizes() == g.sizes(),
                 "gated_delta_rule: g and beta [T, H], not ", g.sizes(), ", ", beta.sizes());
  INFLIGHT_CHECK(states.dim() == 4 && states.size(1) == H && states.size(2) == K &&
                     states.size(3) == V,
                 "gated_delta_rule: states [rows, ", H, ", ", K, ", ", V, "], not ",
                 states.sizes());
  auto out = at::cpu::empty({T, H, V}, q.options());
  run_rule(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), g.data_ptr<float>(),
           beta.data_ptr<float>(), states, read_rows, write_rows, snapshot_rows, starts, T, H, K,
           V, out.data_ptr<float>());
  return out;
}

at::Tensor gated_delta_net(const at::Tensor& qkvz, const at::Tensor& ba,
                           const at::Tensor& conv_weight, at::Tensor& conv_state,
                           const at::Tensor& taps, const at::Tensor& keep,
                           const at::Tensor& read_rows, const at::Tensor& write_rows,
                           const at::Tensor& snapshot_rows, const std::vector<int64_t>& starts,
                           at::Tensor& states,
                           const at::Tensor& decay_rate, const at::Tensor& dt_bias,
                           const at::Tensor& norm_weight, double eps, int64_t key_heads,
                           bool tiled) {
  INFLIGHT_CHECK(states.dim() == 4 && states.scalar_type() == at::kFloat &&
                     states.is_contiguous(),
                 "gated_delta_net: states [rows, heads, key dim, value dim] float32, contiguous");
  const int64_t H = states.size(1), K = states.size(2), V = states.size(3);
  INFLIGHT_CHECK(key_heads > 0 && H > 0 && H % key_heads == 0,
                 "gated_delta_net: ", H, " value heads over ", key_heads, " key heads");
  const int64_t keys = key_heads * K, values = H * V, W = 2 * keys + values;
  INFLIGHT_CHECK(qkvz.dim() == 2 && qkvz.size(1) == W + values && qkvz.stride(1) == 1 &&
                     (qkvz.scalar_type() == at::kFloat || qkvz.scalar_type() == at::kBFloat16),
                 "gated_delta_net: qkvz [T, ", W + values, "] float32 or bfloat16, rows contiguous");
  const int64_t T = qkvz.size(0);
  INFLIGHT_CHECK(ba.dim() == 2 && ba.size(0) == T && ba.size(1) == 2 * H && ba.stride(1) == 1 &&
                     ba.scalar_type() == qkvz.scalar_type(),
                 "gated_delta_net: ba [T, ", 2 * H, "] in qkvz's dtype, rows contiguous");
  for (const at::Tensor* t : {&decay_rate, &dt_bias}) {
    INFLIGHT_CHECK(t->dim() == 1 && t->size(0) == H && t->scalar_type() == at::kFloat &&
                       t->is_contiguous(),
                   "gated_delta_net: decay_rate and dt_bias [", H, "] float32, contiguous");
  }
  INFLIGHT_CHECK(norm_weight.dim() == 1 && norm_weight.size(0) == V &&
                     norm_weight.scalar_type() == qkvz.scalar_type(),
                 "gated_delta_net: norm_weight [", V, "] in qkvz's dtype");
  const at::Tensor mixed = short_convolution(qkvz.narrow(1, 0, W), conv_weight, conv_state, taps,
                                             keep, read_rows, write_rows, snapshot_rows);
  const auto f32 = qkvz.options().dtype(at::kFloat);
  auto q = at::cpu::empty({T, H, K}, f32), k = at::cpu::empty({T, H, K}, f32);
  auto v = at::cpu::empty({T, H, V}, f32);
  auto g = at::cpu::empty({T, H}, f32), beta = at::cpu::empty({T, H}, f32);
  auto gated = at::cpu::empty({T, values}, qkvz.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, qkvz.scalar_type(), "gated_delta_net", [&] {
    using X = scalar_t;
    rule_inputs<X>(mixed.data_ptr<X>(), ba.data_ptr<X>(), ba.stride(0),
                   decay_rate.data_ptr<float>(), dt_bias.data_ptr<float>(), T, H, key_heads, K,
                   V, tiled, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                   g.data_ptr<float>(), beta.data_ptr<float>());
    auto out = at::cpu::empty({T, H, V}, f32);
    run_rule(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), g.data_ptr<float>(),
             beta.data_ptr<float>(), states, read_rows, write_rows, snapshot_rows, starts, T, H,
             K, V, out.data_ptr<float>());
    const at::Tensor normed = rms_norm(out.to(qkvz.scalar_type()).view({T * H, V}),
                                       norm_weight, eps);
    gate_outputs<X>(normed.data_ptr<X>(), qkvz.data_ptr<X>() + W, qkvz.stride(0), T, values,
                    gated.data_ptr<X>());
  });
  return gated;
}
