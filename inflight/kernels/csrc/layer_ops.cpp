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

template <typename T>
void silu_and_mul_rows(const T* in, int64_t stride, T* op, int64_t T_, int64_t I) {
  at::parallel_for(0, T_, grain(I), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* __restrict gate = in + t * stride;
      const T* __restrict up = gate + I;
      T* __restrict o = op + t * I;
#pragma omp simd
      for (int64_t i = 0; i < I; ++i) {
        const float g = Num<T>::load(gate[i]);
        const float silu = round_to<T>(g / (1.f + exp_poly(-g)));
        o[i] = Num<T>::store(silu * Num<T>::load(up[i]));
      }
    }
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
