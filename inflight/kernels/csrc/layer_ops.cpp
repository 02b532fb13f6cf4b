// Fused element-wise parts of a Llama decoder layer: each reads its input once and writes its
// output once, where PyTorch's unfused ops make 5-8 passes and as many temporaries.
//
// Every kernel rounds where the unfused PyTorch ops round (after each op, to the storage dtype),
// with float32 math in between, so bfloat16 results match the reference ops bit for bit except
// where a float32 sum or exp lands an ulp apart. Loops are written for the compiler's
// vectoriser: bfloat16 conversions are bit operations, and exp is a polynomial without calls.
#include "vec_math.h"
#include "ops.h"

#include <ATen/ops/empty_cpu_dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

template <typename T>
struct Num {  // float16 and others: the library's own conversions
  static inline float load(T v) { return static_cast<float>(v); }
  static inline T store(float f) { return static_cast<T>(f); }
};

template <>
struct Num<float> {
  static inline float load(float v) { return v; }
  static inline float store(float f) { return f; }
};

template <>
struct Num<c10::BFloat16> {  // as c10: widen by a shift; narrow rounding to nearest even
  static inline float load(c10::BFloat16 v) {
    const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  static inline c10::BFloat16 store(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    const uint16_t rounded = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
    return c10::BFloat16(f != f ? uint16_t{0x7FC0} : rounded, c10::BFloat16::from_bits());
  }
};

// float -> storage dtype -> float: the rounding one PyTorch op applies to its result.
template <typename T>
inline float round_to(float f) {
  return Num<T>::load(Num<T>::store(f));
}

// Rows per parallel task: enough elements that a thread's work outweighs waking it.
inline int64_t grain(int64_t row_elems) { return std::max<int64_t>(1, 16384 / row_elems); }

template <typename T>
void rms_norm_row(const T* __restrict x, const T* __restrict w, T* __restrict out, int64_t D,
                  float eps) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < D; ++i) {
    const float v = Num<T>::load(x[i]);
    sum += v * v;
  }
  const float scale = 1.f / std::sqrt(sum / static_cast<float>(D) + eps);
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) {
    const float normed = round_to<T>(Num<T>::load(x[i]) * scale);
    out[i] = Num<T>::store(normed * Num<T>::load(w[i]));
  }
}

void check_rows(const at::Tensor& x, const at::Tensor& weight) {
  INFLIGHT_CHECK(x.dim() == 2 && x.stride(1) == 1, "x must be [T, D] with contiguous rows");
  INFLIGHT_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous(),
              "weight must be [D]");
  INFLIGHT_CHECK(weight.scalar_type() == x.scalar_type(), "x and weight must share a dtype");
}

template <typename T>
void add_rms_norm_rows(const T* xp, int64_t stride, T* rp, const T* wp, T* op, int64_t T_,
                       int64_t D, float eps) {
  at::parallel_for(0, T_, grain(D), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      T* __restrict res = rp + t * D;
      const T* __restrict xr = xp + t * stride;
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) res[i] = Num<T>::store(Num<T>::load(res[i]) + Num<T>::load(xr[i]));
      rms_norm_row(res, wp, op + t * D, D, eps);
    }
  });
}

// act(gate, up) for each element of rows [gate | up] (float32 values of T's), row by row: an
// element's rounding never depends on where its row falls in the step.
template <typename T, typename Act>
void gated_rows(const T* in, int64_t stride, T* op, int64_t T_, int64_t I, Act act) {
  at::parallel_for(0, T_, grain(I), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* __restrict gate = in + t * stride;
      const T* __restrict up = gate + I;
      T* __restrict o = op + t * I;
#pragma omp simd
      for (int64_t i = 0; i < I; ++i) {
        o[i] = Num<T>::store(act(Num<T>::load(gate[i]), Num<T>::load(up[i])));
      }
    }
  });
}

template <typename T>
void silu_and_mul_rows(const T* in, int64_t stride, T* op, int64_t T_, int64_t I) {
  gated_rows(in, stride, op, T_, I, [](float g, float u) {
    return round_to<T>(g / (1.f + exp_poly(-g))) * u;
  });
}

// gpt-oss's expert activation: (clamp(up, +-limit) + 1) * g * sigmoid(alpha g), g = min(gate,
// limit), each op rounded as PyTorch rounds it (ATen's sigmoid over a whole tensor rounds its
// vector lanes otherwise than its scalar tail, so it is not called)
template <typename T>
void clamped_swiglu_rows(const T* in, int64_t stride, T* op, int64_t T_, int64_t I, float limit,
                         float alpha) {
  const float low = round_to<T>(-limit), high = round_to<T>(limit);
  gated_rows(in, stride, op, T_, I, [=](float g, float u) {
    g = g > high ? high : g;  // (a NaN passes through both clamps, as at::clamp's)
    u = u < low ? low : (u > high ? high : u);
    const float sigmoid = round_to<T>(1.f / (1.f + exp_poly(-round_to<T>(g * alpha))));
    return round_to<T>(u + 1.f) * round_to<T>(g * sigmoid);
  });
}

template <typename T>
void rope_rows(T* xp, int64_t stride, const T* cp, const T* sp, int64_t T_, int64_t num_heads,
               int64_t head_dim, int64_t half) {
  at::parallel_for(0, T_, grain(num_heads * head_dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* __restrict c = cp + t * half;
      const T* __restrict s = sp + t * half;
      for (int64_t h = 0; h < num_heads; ++h) {
        T* __restrict lo = xp + t * stride + h * head_dim;
        T* __restrict hi = lo + half;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {  // [lo, hi] -> [lo c - hi s, hi c + lo s]
          const float a = Num<T>::load(lo[i]), b = Num<T>::load(hi[i]);
          const float cf = Num<T>::load(c[i]), sf = Num<T>::load(s[i]);
          lo[i] = Num<T>::store(round_to<T>(a * cf) - round_to<T>(b * sf));
          hi[i] = Num<T>::store(round_to<T>(b * cf) + round_to<T>(a * sf));
        }
      }
    }
  });
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, weight);
  auto out = at::cpu::empty(x.sizes(), x.options());
  const int64_t T = x.size(0), D = x.size(1), stride = x.stride(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, T, grain(D), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        rms_norm_row(xp + t * stride, wp, op + t * D, D, static_cast<float>(eps));
    });
  });
  return out;
}

at::Tensor add_rms_norm(const at::Tensor& x, at::Tensor& residual,
                           const at::Tensor& weight, double eps) {
  check_rows(x, weight);
  INFLIGHT_CHECK(residual.sizes() == x.sizes() && residual.is_contiguous() &&
                  residual.scalar_type() == x.scalar_type(),
              "residual must be a contiguous tensor shaped and typed like x");
  auto out = at::cpu::empty(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    add_rms_norm_rows(x.data_ptr<scalar_t>(), x.stride(0), residual.data_ptr<scalar_t>(),
                      weight.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), x.size(0),
                      x.size(1), static_cast<float>(eps));
  });
  return out;
}

at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  INFLIGHT_CHECK(gate_up.dim() == 2 && gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
              "gate_up must be [T, 2 * I] with contiguous rows");
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = at::cpu::empty({T, I}, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "silu_mul", [&] {
    silu_and_mul_rows(gate_up.data_ptr<scalar_t>(), gate_up.stride(0), out.data_ptr<scalar_t>(),
                      T, I);
  });
  return out;
}

at::Tensor clamped_swiglu(const at::Tensor& gate_up, double limit, double alpha) {
  INFLIGHT_CHECK(gate_up.dim() == 2 && gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
                 "gate_up must be [T, 2 * I] with contiguous rows");
  INFLIGHT_CHECK(limit > 0.0 && std::isfinite(limit) && std::isfinite(alpha),
                 "clamped_swiglu: a positive finite limit and a finite alpha");
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = at::cpu::empty({T, I}, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "swiglu", [&] {
    clamped_swiglu_rows(gate_up.data_ptr<scalar_t>(), gate_up.stride(0),
                        out.data_ptr<scalar_t>(), T, I, static_cast<float>(limit),
                        static_cast<float>(alpha));
  });
  return out;
}

void rope_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
           int64_t num_heads, int64_t head_dim) {
  INFLIGHT_CHECK(x.dim() == 2 && x.stride(1) == 1 && num_heads * head_dim <= x.size(1),
              "x must be [T, >= num_heads * head_dim] with contiguous rows");
  const int64_t T = x.size(0);
  // cos and sin [T, R / 2]: the first R <= head_dim dimensions of each head rotate (R < head_dim:
  // partial rotary embeddings), the rest pass through
  INFLIGHT_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 2 && cos.size(0) == T &&
                  cos.size(1) >= 1 && 2 * cos.size(1) <= head_dim && cos.is_contiguous() &&
                  sin.is_contiguous(),
              "cos and sin must be contiguous [T, R / 2], R <= head_dim");
  INFLIGHT_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type(),
              "cos, sin and x must share a dtype");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rope_", [&] {
    rope_rows(x.data_ptr<scalar_t>(), x.stride(0), cos.data_ptr<scalar_t>(),
              sin.data_ptr<scalar_t>(), T, num_heads, head_dim, cos.size(1));
  });
}

namespace {

// A step's convolution over its table of inputs (`short_convolution`): the step's rows of x,
// then each request's previous inputs (`prev`: `kernel - 1` rows a request, oldest first, already
// rounded to x's dtype as `.to(x.dtype)` rounds them). `w` is the kernel transposed, [kernel, C]:
// each tap's weights side by side, so every loop below runs along the channels.
template <typename T>
void short_convolution_rows(const T* x, int64_t x_stride, int64_t rows, const float* prev,
                            const float* w, int64_t taps_per_row, int64_t C, const int64_t* taps,
                            T* out) {
  const int64_t back = taps_per_row - 1;
  at::parallel_for(0, rows, grain(C * taps_per_row), [&](int64_t begin, int64_t end) {
    std::vector<float> acc(C);
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t k = 0; k <= back; ++k) {  // oldest tap first, each product and sum rounded
        const int64_t i = taps[k * rows + t];
        const float* wk = w + k * C;
        auto add_tap = [&](const auto* src) {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            const float tap = round_to<T>(Num<T>::load(src[c]) * wk[c]);
            acc[c] = k == 0 ? tap : round_to<T>(acc[c] + tap);
          }
        };
        if (i < rows) {
          add_tap(x + i * x_stride);
        } else {
          add_tap(prev + (i - rows) * C);
        }
      }
      for (int64_t c = 0; c < C; ++c) out[t * C + c] = Num<T>::store(acc[c]);
    }
  });
}

void check_indices(const at::Tensor& t, int64_t numel, int64_t bound, const char* what) {
  INFLIGHT_CHECK(t.scalar_type() == at::kLong && t.is_contiguous() && t.numel() == numel, what,
                 ": ", numel, " int64 indices, contiguous");
  const int64_t* p = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < numel; ++i) {
    INFLIGHT_CHECK(p[i] >= 0 && p[i] < bound, what, " ", p[i], " out of range (", bound, ")");
  }
}

}  // namespace

const int64_t* snapshot_rows_of(const at::Tensor& snapshot_rows, int64_t T, int64_t rows) {
  if (snapshot_rows.numel() == 0) return nullptr;
  INFLIGHT_CHECK(snapshot_rows.scalar_type() == at::kLong && snapshot_rows.is_contiguous() &&
                     snapshot_rows.numel() == T,
                 "snapshot_rows: ", T, " int64 rows (-1: none), contiguous, or none");
  const int64_t* p = snapshot_rows.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    INFLIGHT_CHECK(-1 <= p[t] && p[t] < rows, "snapshot row ", p[t], " out of range (", rows, ")");
  }
  return p;
}

at::Tensor short_convolution(const at::Tensor& x, const at::Tensor& weight, at::Tensor& state,
                             const at::Tensor& taps, const at::Tensor& keep,
                             const at::Tensor& read_rows, const at::Tensor& write_rows,
                             const at::Tensor& snapshot_rows) {
  INFLIGHT_CHECK(x.dim() == 2 && x.stride(1) == 1, "x: [T, channels] with contiguous rows");
  const int64_t T = x.size(0), C = x.size(1);
  INFLIGHT_CHECK(weight.dim() == 2 && weight.size(0) == C && weight.size(1) >= 2 &&
                     weight.scalar_type() == x.scalar_type(),
                 "weight: [channels, kernel >= 2] in x's dtype");
  const int64_t back = weight.size(1) - 1;
  INFLIGHT_CHECK(state.dim() == 3 && state.size(1) == back && state.size(2) == C &&
                     state.is_contiguous(),
                 "state: [rows, kernel - 1, channels], contiguous");
  const int64_t R = read_rows.numel();
  check_indices(read_rows, R, state.size(0), "read_rows");
  check_indices(write_rows, R, state.size(0), "write_rows");
  check_indices(taps, (back + 1) * T, T + R * back, "taps");
  check_indices(keep, R * back, T + R * back, "keep");
  const int64_t* snap = snapshot_rows_of(snapshot_rows, T, state.size(0));
  auto out = at::cpu::empty({T, C}, x.options());
  const int64_t *tp = taps.data_ptr<int64_t>(), *kp = keep.data_ptr<int64_t>(),
                *rp = read_rows.data_ptr<int64_t>(), *wp = write_rows.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "short_convolution", [&] {
    using X = scalar_t;
    const X* xp = x.data_ptr<X>();
    const X* kernel = weight.data_ptr<X>();
    std::vector<float> w((back + 1) * C), prev(R * back * C);
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t k = 0; k <= back; ++k) {
        w[k * C + c] = Num<X>::load(kernel[c * weight.stride(0) + k * weight.stride(1)]);
      }
    }
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, state.scalar_type(), "conv_state", [&] {
      using S = scalar_t;
      S* sp = state.data_ptr<S>();
      for (int64_t r = 0; r < R; ++r) {  // each request's earlier inputs, in x's dtype
        const S* row = sp + rp[r] * back * C;
        for (int64_t i = 0; i < back * C; ++i) {
          prev[r * back * C + i] = round_to<X>(Num<S>::load(row[i]));
        }
      }
      short_convolution_rows(xp, x.stride(0), T, prev.data(), w.data(), back + 1, C, tp,
                             out.data_ptr<X>());
      // every request's last inputs, all read before any is written
      std::vector<float> kept(R * back * C);
      for (int64_t i = 0; i < R * back; ++i) {
        for (int64_t c = 0; c < C; ++c) {
          kept[i * C + c] = kp[i] < T ? Num<X>::load(xp[kp[i] * x.stride(0) + c])
                                      : prev[(kp[i] - T) * C + c];
        }
      }
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t i = 0; i < back * C; ++i) {
          sp[wp[r] * back * C + i] = Num<S>::store(kept[r * back * C + i]);
        }
      }
      // a snapshot after token t: its last `back` inputs, taps 1..back of t (oldest first)
      for (int64_t t = 0; snap != nullptr && t < T; ++t) {
        if (snap[t] < 0) continue;
        for (int64_t i = 0; i < back; ++i) {
          const int64_t from = tp[(i + 1) * T + t];
          S* row = sp + (snap[t] * back + i) * C;
          for (int64_t c = 0; c < C; ++c) {
            row[c] = Num<S>::store(from < T ? Num<X>::load(xp[from * x.stride(0) + c])
                                            : prev[(from - T) * C + c]);
          }
        }
      }
    });
  });
  return out;
}
