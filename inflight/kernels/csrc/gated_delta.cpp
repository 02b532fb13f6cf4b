// The gated delta rule of Qwen3.5's DeltaNet layers (`model/qwen3_5.gated_delta_rule`, the same
// arithmetic): each request's tokens in turn, each value head's state matrix S [K, V] held in
// the thread's own buffer, two passes over it a token. The first decays S and reads what it
// remembers of the key (S^T k); the second writes the correction k (beta (v - S^T k))^T and
// reads the output S^T q. Rows of S are V floats apart, so each pass is vector code along V.
#include "ops.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty_cpu_dispatch.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

namespace {

// One request's rows [begin, end) of one head: S read from `from`, written to `to`.
void delta_head(const float* q, const float* k, const float* v, const float* g,
                const float* beta, const float* from, float* to, float* out, int64_t begin,
                int64_t end, int64_t H, int64_t h, int64_t K, int64_t V) {
  std::vector<float> s(from, from + K * V), remembered(V), delta(V);
  for (int64_t t = begin; t < end; ++t) {
    const float* kt = k + (t * H + h) * K;
    const float* qt = q + (t * H + h) * K;
    const float* vt = v + (t * H + h) * V;
    const float decay = std::exp(g[t * H + h]), b = beta[t * H + h];
    std::fill(remembered.begin(), remembered.end(), 0.0f);
    for (int64_t i = 0; i < K; ++i) {
      float* row = s.data() + i * V;
      const float ki = kt[i];
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) {
        row[j] *= decay;
        remembered[j] += row[j] * ki;
      }
    }
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) delta[j] = (vt[j] - remembered[j]) * b;
    float* o = out + (t * H + h) * V;
    std::fill(o, o + V, 0.0f);
    for (int64_t i = 0; i < K; ++i) {
      float* row = s.data() + i * V;
      const float ki = kt[i], qi = qt[i];
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) {
        row[j] += ki * delta[j];
        o[j] += row[j] * qi;
      }
    }
  }
  std::memcpy(to, s.data(), sizeof(float) * K * V);
}

}  // namespace

at::Tensor gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& g, const at::Tensor& beta, at::Tensor& states,
                            const at::Tensor& read_rows, const at::Tensor& write_rows,
                            const std::vector<int64_t>& starts) {
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
  auto out = at::cpu::empty({T, H, V}, q.options());
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *gp = g.data_ptr<float>(), *bp = beta.data_ptr<float>();
  float *sp = states.data_ptr<float>(), *op = out.data_ptr<float>();
  const int64_t matrix = K * V;
  at::parallel_for(0, R * H, 1, [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) {
      const int64_t r = item / H, h = item % H;
      delta_head(qp, kp, vp, gp, bp, sp + (reads[r] * H + h) * matrix,
                 sp + (writes[r] * H + h) * matrix, op, starts[r], starts[r + 1], H, h, K, V);
    }
  });
  return out;
}
