// The element types a paged KV cache may hold besides the model's own dtype, and how they
// become float32: bfloat16 (the bits shifted up), and the 8-bit ones (int8 and float8 e4m3),
// stored with a float32 scale per (position, head) as `kv_layout.h` lays out. The attention
// kernels widen a cache element to float32 here and apply the scale to a whole score or
// probability, never per element.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/core/ScalarType.h>
#include "check.h"
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>

#include "vec_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

using fp8 = c10::Float8_e4m3fn;

// The 8-bit caches: a scale per (position, head) comes with every key and value.
template <typename T>
constexpr bool kScaledCache = std::is_same_v<T, int8_t> || std::is_same_v<T, fp8>;

// The largest magnitude each 8-bit type stores: a row's largest |x| maps to it.
template <typename T>
constexpr float kScaledMax = std::is_same_v<T, int8_t> ? 127.f : 448.f;

// e4m3 bits -> float32, exactly: normals by moving the exponent and mantissa into float32's
// fields (bias 7 -> 127), subnormals (exponent 0) as mantissa * 2^-9. The same values as the
// vector loads below (`load8`, `load16`, which go through float16) and as c10's conversion.
inline float fp8_to_float(uint8_t bits) {
  const uint32_t m = bits & 0x7F;
  float magnitude;
  if (m < 8) {
    magnitude = static_cast<float>(m) * 0x1p-9f;
  } else {
    const uint32_t f = (m << 20) + (120u << 23);
    std::memcpy(&magnitude, &f, sizeof f);
  }
  return bits & 0x80 ? -magnitude : magnitude;
}

template <typename T>
inline float widen(T x) {
  if constexpr (std::is_same_v<T, fp8>) {
    return fp8_to_float(x.x);
  } else {
    return static_cast<float>(x);
  }
}

// Float lanes in a cache's type, the same bits as the scalar conversions in `quantize_row`:
// int8 rounded to nearest even and clamped; float8 e4m3 rounded to nearest even as c10 rounds
// (normals by adding just under half a step, plus the kept bit's parity, to the bits; values
// below 2^-6 by a float add that leaves their multiple of 2^-9 in the low bits; from 480 up,
// NaN); bfloat16 as c10 rounds (the same carry into the upper half; NaN as 0x7FC0).
namespace cache_bits {
constexpr int32_t kFp8Nan = 0x7F, kBf16Nan = 0x7FC0;
constexpr int32_t kFp8Bias = static_cast<int32_t>((static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFF);
constexpr int32_t kFp8SmallMagic = 141 << 23;  // 2^14: its last mantissa bit is 2^-9
constexpr int32_t kFp8Smallest = 121 << 23;     // 2^-6, e4m3's smallest normal
constexpr int32_t kFp8Overflow = 1087 << 20;    // 480: rounds past e4m3's largest, 448
}  // namespace cache_bits

#if defined(__AVX2__) && defined(__FMA__)
// 8 int32 lanes (each within [-128, 255]) as 8 bytes, in order.
inline __m128i byte_lanes(__m256i v, bool is_signed) {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  if (is_signed) {
    const __m128i w = _mm_packs_epi32(lo, hi);
    return _mm_packs_epi16(w, w);
  }
  const __m128i w = _mm_packus_epi32(lo, hi);
  return _mm_packus_epi16(w, w);
}
inline __m128i int8_lanes(__m256 y) {
  y = _mm256_min_ps(_mm256_max_ps(y, _mm256_set1_ps(-127.f)), _mm256_set1_ps(127.f));
  return byte_lanes(_mm256_cvtps_epi32(y), true);
}
inline __m128i fp8_lanes(__m256 y) {  // magnitudes (sign cleared) compare as signed
  using namespace cache_bits;
  const __m256i bits = _mm256_castps_si256(y);
  const __m256i sign = _mm256_and_si256(bits, _mm256_set1_epi32(INT32_MIN));
  const __m256i mag = _mm256_xor_si256(bits, sign);
  const __m256i parity = _mm256_and_si256(_mm256_srli_epi32(mag, 20), _mm256_set1_epi32(1));
  const __m256i normal = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(mag, _mm256_set1_epi32(kFp8Bias)), parity), 20);
  const __m256i magic = _mm256_set1_epi32(kFp8SmallMagic);
  const __m256i small = _mm256_sub_epi32(
      _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(mag), _mm256_castsi256_ps(magic))),
      magic);
  __m256i r = _mm256_blendv_epi8(normal, small,
                                 _mm256_cmpgt_epi32(_mm256_set1_epi32(kFp8Smallest), mag));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(kFp8Nan),
                         _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(kFp8Overflow - 1)));
  return byte_lanes(_mm256_or_si256(r, _mm256_srli_epi32(sign, 24)), false);
}
inline __m128i bf16_lanes(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i parity = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), parity), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(cache_bits::kBf16Nan),
                         _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// 8 float lanes stored in a cache's type.
inline void store8(int8_t* out, __m256 y) {
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), int8_lanes(y));
}
inline void store8(fp8* out, __m256 y) {
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), fp8_lanes(y));
}
inline void store8(c10::BFloat16* out, __m256 y) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), bf16_lanes(y));
}
#endif

// One row of n values into the cache's type: 8-bit rows scaled so that their largest |x| is the
// type's largest value (the scale is returned; 0 for a row of zeros), others rounded to nearest.
// The division (not a multiply by the reciprocal) is what the PyTorch reference does too. Rows
// of float (and bfloat16, into 8 bits) go 8 at a time through vectors (on AVX-512 CPUs too: the
// write is a small part of a step), the scalar loop taking the tail, with the scalar loop's
// bytes: a maximum is the same in any order, and `_mm256_max_ps`, as std::max, keeps the running
// one over a NaN.
template <typename cache_t, typename src_t>
inline float quantize_row(const src_t* x, int64_t n, cache_t* out) {
  int64_t whole = 0;  // the leading elements the vectors take
#if defined(__AVX2__) && defined(__FMA__)
  constexpr bool kVectors =
      kScaledCache<cache_t>
          ? std::is_same_v<src_t, float> || std::is_same_v<src_t, c10::BFloat16>
          : std::is_same_v<src_t, float> && std::is_same_v<cache_t, c10::BFloat16>;
  if constexpr (kVectors) whole = n / 8 * 8;
#endif
  if constexpr (kScaledCache<cache_t>) {
    float amax = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
    if constexpr (kVectors) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t i = 0; i < whole; i += 8)
        acc = _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), load8(x + i)), acc);
      amax = lane_max8(acc);
    }
#endif
    for (int64_t i = whole; i < n; ++i) amax = std::max(amax, std::fabs(static_cast<float>(x[i])));
    const float scale = amax / kScaledMax<cache_t>;
    if (!(scale > 0.f)) whole = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if constexpr (kVectors)
      for (int64_t i = 0; i < whole; i += 8)
        store8(out + i, _mm256_div_ps(load8(x + i), _mm256_set1_ps(scale)));
#endif
    for (int64_t i = whole; i < n; ++i) {
      const float y = scale > 0.f ? static_cast<float>(x[i]) / scale : 0.f;
      if constexpr (std::is_same_v<cache_t, int8_t>) {
        out[i] = static_cast<int8_t>(std::clamp(std::nearbyint(y), -127.f, 127.f));
      } else {
        out[i] = fp8(y);
      }
    }
    return scale;
  } else {
#if defined(__AVX2__) && defined(__FMA__)
    if constexpr (kVectors)
      for (int64_t i = 0; i < whole; i += 8) store8(out + i, load8(x + i));
#endif
    for (int64_t i = whole; i < n; ++i) out[i] = static_cast<cache_t>(static_cast<float>(x[i]));
    return 1.f;
  }
}

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 load8(const int8_t* p) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
}
// fp8_to_float on 8 lanes: each e4m3 byte's bits moved into float16's fields (the sign to bit
// 15, exponent and mantissa under it) are the value / 2^8 exactly, subnormals included; widened
// by vcvtph2ps (F16C, on every CPU with AVX2 and FMA) and scaled back: five instructions where
// arithmetic on the fields took eleven.
inline __m256 load8(const fp8* p) {
  const __m128i w = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m128i keep = _mm_set1_epi16(static_cast<int16_t>(0xBFFF));  // bit 14: the sign's copy
  const __m128i h = _mm_and_si128(_mm_slli_epi16(w, 7), keep);
  return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.f));
}
#endif

#ifdef __AVX512F__
inline __m512 load16(const int8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
}
inline __m512 load16(const fp8* p) {  // as load8 does, on 16 lanes
  const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i keep = _mm256_set1_epi16(static_cast<int16_t>(0xBFFF));
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(w, 7), keep);
  return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.f));
}
#endif

// Calls f(q_t{}, cache_t{}) for the element types of a query and its cache: the cache in the
// query's own dtype, or (for float32 and bfloat16 queries) in bfloat16, int8 or float8.
template <typename F>
void dispatch_query_and_cache(c10::ScalarType q, c10::ScalarType cache, const char* name, F&& f) {
  auto with_cache = [&](auto q_tag) {
    using q_t = decltype(q_tag);
    if (cache == c10::CppTypeToScalarType<q_t>::value) return f(q_t{}, q_t{});
    if constexpr (std::is_same_v<q_t, float> || std::is_same_v<q_t, c10::BFloat16>) {
      switch (cache) {
        case c10::ScalarType::BFloat16: return f(q_t{}, c10::BFloat16{});
        case c10::ScalarType::Char: return f(q_t{}, int8_t{});
        case c10::ScalarType::Float8_e4m3fn: return f(q_t{}, fp8{});
        default: break;
      }
    }
    INFLIGHT_CHECK(false, name, ": no kernel for ", q, " queries over a ", cache, " cache");
  };
  switch (q) {
    case c10::ScalarType::Float: return with_cache(float{});
    case c10::ScalarType::BFloat16: return with_cache(c10::BFloat16{});
    case c10::ScalarType::Half: return with_cache(c10::Half{});
    default: INFLIGHT_CHECK(false, name, ": unsupported query dtype ", q);
  }
}
