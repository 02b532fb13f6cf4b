// Linear layers with the activations rounded to 8 or 16 bits, over a GGUF file's blocks
// regrouped eight output columns at a time (AVX2 + FMA + F16C): Q4_0, Q4_1, Q8_0, the 5-bit
// and K-quant formats (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: what Q4_K_M, Q5_K_M and Q6_K files hold)
// and MXFP4 (gpt-oss's experts);
// or, for 16 bits on AVX-512 VNNI, the legacy three sixteen columns at a time too (further
// down; a bf16 engine's decode rows); and for 8 bits, batches of 8 rows or more over two groups'
// quants unpacked side by side, on CPUs with AMX on the tile unit (`run_amx`), on AVX-512 VNNI
// with 64-byte registers (`run_pairs`), both over the same 8-column layout; elsewhere batches of
// several rows multiply from a group's quants unpacked once (`run_unpacked`):
// the `quantized_activations` knob's path; gguf_linear.cpp is the exact one. x and y are
// float32, or bf16 (a bf16 engine's decode rows).
//
// x is rounded per block of 32 (scale dx = max|x| / 127 or / 32767, round half to even; 8 bits
// is llama.cpp's Q8_0 rounding of activations), and each block's dot product is integer. The
// result is the exact product of the dequantized weights with the rounded x, up to float32
// summation: an offset m (Q4_1, Q5_1; a K-quant's -dmin * min) meets dx * (the sum of the
// rounded block), a zero point (Q4_0's 8, Q5_0's 16, Q6_K's 32, MXFP4's 12) is taken off in
// integers, a K-quant sub-block's scale d * sc is exact in float32, and MXFP4's is a power of
// two. Q6_K's scales change every 16 weights, so its two halves are summed apart and scaled
// apart. Rounding x is the only approximation, at
// most dx / 2 per element: 8 bits move greedy output within a few dozen tokens, 16 bits rarely
// (docs/benchmarks.md).
//
// Why regroup: with one column per dot product, every block ends in a horizontal sum and pays
// its scale conversions alone, ~20 instructions per 32 weights, so one row is compute-bound well
// below the memory bandwidth. Here eight columns share each instruction, one per 32-bit lane:
// a 32-byte register holds four consecutive quants of each of 8 columns, multiplied by four of
// x's values broadcast to every lane, and each lane accumulates its column's block dot product;
// the 8 scales convert in one instruction and the outputs store as a vector. About 5
// instructions per 32 weights with 8-bit x (`vpmaddubsw`: bytes times bytes), about 10 with
// 16-bit x (`vpmaddwd`: the quants widened to 16 bits first).
//
// The regrouped layout (`regroup_blocks` in model/gguf_blocks.py, from the file's
// [N, K / 32 or K / 256, block bytes] blocks): [ceil(N / 8) groups][blocks per row][8 columns'
// header fields side by side][sub-blocks' quants], where a sub-block's quants are chunks of 32
// bytes, chunk j holding bytes 4j..4j+3 of each of the 8 columns' 16 nibble bytes in turn (then
// the 5- and 6-bit formats' high bits: `chunk_values`). A nibble byte i holds element i (low
// nibble) and element i + 16 (high), so chunk j's low nibbles are elements 4j..4j+3 and its high
// ones 16+4j..16+4j+3; Q8_0's chunk j is elements 4j..4j+3. gguf_blocks.h has each format's
// header. Columns past N are zero.
//
// Overflow: with 8-bit x, `vpmaddubsw` pairs of nibbles (0-15) times bytes (-127..127) reach
// 3,810, and eight of them add up in 16 bits to at most 30,480 (5-bit values and MXFP4's 0..24:
// 7,874, four of them; 6-bit: 16,002, two); Q8_0's pairs (magnitudes up to 128, signs moved onto x) reach
// 32,512, so they widen to 32 bits at once. With 16-bit x every product is 32-bit: 32 of them
// (quants below 64) stay below 2^27.
//
// Every output is a fixed sequence of operations per row, whatever the batch and its tiling.
//
// Where the CPU has AVX-512 VNNI (with VL, for these 256-bit registers), one instruction does a
// multiply-and-add step's work: `vpdpbusd` (bytes times bytes, four products summed into each
// 32-bit lane) and `vpdpwssd` (16-bit pairs into 32 bits). The integer sums are the same exact
// values either way (nothing saturates, per the bounds above), so are the outputs, bit for bit.
#include "gguf_blocks.h"
#include "ops.h"
#include "vec_math.h"

#include <ATen/ops/empty_cpu_dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <limits>
#include <type_traits>
#include <vector>

#include <sys/syscall.h>
#include <unistd.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

namespace {

constexpr int64_t kLanes = 8;  // columns per group, one float32 lane each

// bytes of one group's block: 8 scales, 8 offsets (Q4_1), the quants
constexpr int64_t group_block_bytes(Format f) { return kLanes * block_bytes(f); }
constexpr int64_t quants_at(Format f) { return kLanes * header_bytes(f); }

// Rounded x's storage, never zeroed where every element is written: a prompt's megabytes of x
// would be written twice.
template <class T>
using Buffer = std::unique_ptr<T[]>;
template <class T>
Buffer<T> buffer(int64_t n) {
  return std::make_unique_for_overwrite<T[]>(n);
}

// x's rows rounded per block of 32 to A (int8_t or int16_t): the integer values, each block's
// scale, the integer sum of its rounded values (Q4_0's correction) and dx times that sum (Q4_1's
// offset term).
template <class A>
struct RoundedRows {
  Buffer<A> q;          // [M, K]
  Buffer<float> scale;  // [M, K / 32]
  Buffer<int32_t> isum;
  Buffer<int32_t> isum_first;  // the sum of each block's first 16 (Q6_K's halves)
  Buffer<float> sum;
};

inline int32_t lane_sum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// A block's scale from its largest |x| (`amax`) and the largest integer `top`.
inline float block_scale(float amax, bool has_nan, float top) {
  float d = amax / top;
  // a denormal scale has no finite inverse: such a block (|x| < 1e-36) rounds to zero
  if (d > 0.0f && 1.0f / d == std::numeric_limits<float>::infinity()) d = 0.0f;
  // max drops NaN, and an infinity leaves no finite scale (x times its inverse would be NaN,
  // whose integer conversion each multiply path would then meet differently): either makes the
  // scale NaN, which carries into the row's outputs as float32 arithmetic carries them (to inf
  // or NaN: rounded x cannot tell which), the same bits on every path
  if (has_nan || std::isinf(d)) d = std::numeric_limits<float>::quiet_NaN();
  return d;
}

// One block of x (32 floats) rounded to A: the integers into `out`; returns the scale and sets
// `isum` to the integers' sum and `first` to that of the first 16.
template <class A>
inline float round_block(const float* xb, A* out, int32_t& isum, int32_t& first) {
  constexpr float kMax = std::is_same_v<A, int8_t> ? 127.0f : 32767.0f;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm256_loadu_ps(xb + 8 * j);
    amax = _mm256_max_ps(amax, _mm256_and_ps(v[j], abs_mask));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[j], v[j], _CMP_UNORD_Q));
  }
  const float d = block_scale(lane_max8(amax), _mm256_movemask_ps(nan) != 0, kMax);
  const __m256 inv = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
  __m256i q[4];
  for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv));  // to even
  first = lane_sum(_mm256_add_epi32(q[0], q[1]));
  isum = first + lane_sum(_mm256_add_epi32(q[2], q[3]));
  // packs interleave the two 128-bit halves; the permutes put the values back in order
  const __m256i lo = _mm256_packs_epi32(q[0], q[1]), hi = _mm256_packs_epi32(q[2], q[3]);
  auto* dst = reinterpret_cast<__m256i*>(out);
  if constexpr (std::is_same_v<A, int8_t>) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256(dst, _mm256_permutevar8x32_epi32(_mm256_packs_epi16(lo, hi), order));
  } else {
    _mm256_storeu_si256(dst, _mm256_permute4x64_epi64(lo, 0xD8));
    _mm256_storeu_si256(dst + 1, _mm256_permute4x64_epi64(hi, 0xD8));
  }
  return d;
}

// `rows` >= M rows of q, those past M zero (the tile unit reads x 16 rows at a time)
template <class A>
RoundedRows<A> round_rows(const float* x, int64_t M, int64_t K, int64_t rows) {
  const int64_t n = M * K / kBlock;
  RoundedRows<A> r{buffer<A>(rows * K), buffer<float>(n), buffer<int32_t>(n), buffer<int32_t>(n),
                   buffer<float>(n)};
  std::fill(r.q.get() + M * K, r.q.get() + rows * K, A{0});
  // blocks round independently: a prompt's rows are split between the threads
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      r.scale[i] = round_block(x + i * kBlock, r.q.get() + i * kBlock, r.isum[i],
                               r.isum_first[i]);
      r.sum[i] = r.scale[i] * static_cast<float>(r.isum[i]);
    }
  });
  return r;
}

template <class A>
struct Problem {
  const RoundedRows<A>* x;
  const uint8_t* w;   // [groups, K / (32 sub-blocks), group block bytes]
  const float* bias;  // [N] or null
  float* y;           // [M, ldy]: this weight's N columns of each row
  int64_t K, N, ldy;
};

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

// acc + the four products of u's bytes (unsigned) and s's (signed) in each 32-bit lane
inline __m256i add_byte_dots(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// acc + the two products of a's and b's 16-bit values in each 32-bit lane
inline __m256i add_pair_dots(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

inline __m256i load_chunk(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// 4 consecutive values of x in every 32-bit (int8) or 64-bit (int16) lane
inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}
inline __m256i broadcast4(const int16_t* p) {
  int64_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm256_set1_epi64x(v);
}

// Chunk j (0-3) of a 4-, 5- or 6-bit sub-block's quants, one byte per value: `low` holds
// elements 4j..4j+3 of each column, `high` elements 16+4j..16+4j+3. The high bits of the
// 5- and 6-bit formats follow the 128 bytes of nibbles, 8 or 16 bytes per chunk: position p of
// the chunk (column p / 4, element p % 4 of its four) has 2 bits (its low and high value's 5th
// bit) at bits 2 (p / 8) of byte p % 8, or 4 bits (low value's two, then high value's) at bits
// 4 (p / 16) of byte p % 16; one variable shift per 64-bit lane brings each position's bits to
// the bottom of its byte.
template <Format F>
inline void chunk_values(const uint8_t* quants, int j, __m256i& low, __m256i& high) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i raw = load_chunk(quants + 32 * j);
  low = _mm256_and_si256(raw, nibble);
  high = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble);
  if constexpr (F == Format::kMXFP4) {  // each nibble's FP4 value, doubled, plus 12
    const __m256i values = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6,
                                            4, 0, 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9,
                                            8, 6, 4, 0);
    low = _mm256_shuffle_epi8(values, low);
    high = _mm256_shuffle_epi8(values, high);
  } else if constexpr (extra_bits(F) == 1) {
    int64_t bits;
    std::memcpy(&bits, quants + 128 + 8 * j, sizeof bits);
    const __m256i t =
        _mm256_srlv_epi64(_mm256_set1_epi64x(bits), _mm256_setr_epi64x(0, 2, 4, 6));
    low = _mm256_or_si256(low, _mm256_slli_epi16(_mm256_and_si256(t, _mm256_set1_epi8(1)), 4));
    high = _mm256_or_si256(high, _mm256_slli_epi16(_mm256_and_si256(t, _mm256_set1_epi8(2)), 3));
  } else if constexpr (extra_bits(F) == 2) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quants + 128 + 16 * j));
    const __m256i t = _mm256_srlv_epi64(_mm256_broadcastsi128_si256(bits),
                                        _mm256_setr_epi64x(0, 0, 4, 4));
    low = _mm256_or_si256(low, _mm256_slli_epi16(_mm256_and_si256(t, _mm256_set1_epi8(3)), 4));
    high = _mm256_or_si256(high, _mm256_slli_epi16(_mm256_and_si256(t, _mm256_set1_epi8(12)), 2));
  }
}

// A sub-block's integer dot products, one column per 32-bit lane: `first` holds all 32 values'
// (Q6_K: its first 16's, and `second` the last 16's, for their own scales).
template <class V>
struct DotsOf {
  V first, second;
};
using Dots = DotsOf<__m256i>;

// One sub-block's dot products with 8-bit x, one column per 32-bit lane, from its values as
// `chunk_values` gives them: v[2j] chunk j's low values, v[2j + 1] its high ones (4-, 5-, 6-bit
// and MXFP4 formats; Q8_0 has its own sums below).
template <Format F>
inline Dots value_dots(const __m256i* v, const int8_t* xb) {
  const __m256i zero = _mm256_setzero_si256();
  if constexpr (kVnni) {
    // straight into 32 bits, low and high values in two chains each: one `vpdpbusd` waits
    // for the one before it, and few rows leave nothing else to fill that wait
    __m256i low[2] = {zero, zero}, high[2] = {zero, zero};
    for (int j = 0; j < 4; ++j) {
      low[j % 2] = add_byte_dots(low[j % 2], v[2 * j], broadcast4(xb + 4 * j));
      high[j % 2] = add_byte_dots(high[j % 2], v[2 * j + 1], broadcast4(xb + 16 + 4 * j));
    }
    const __m256i l = _mm256_add_epi32(low[0], low[1]), h = _mm256_add_epi32(high[0], high[1]);
    if constexpr (F == Format::kQ6_K) return {l, h};
    return {_mm256_add_epi32(l, h), zero};
  } else {
    // `vpmaddubsw` pairs, summed in 16 bits while that cannot overflow: a pair of quants below
    // 16, 32 or 64 times bytes up to 127 reaches 3,810, 7,874 or 16,002, so 8, 4 or 2 of them
    // (MXFP4's values, at most 24, as the 5-bit formats')
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i pairs[2] = {zero, zero}, sums[2] = {zero, zero};  // elements 0-15, 16-31
    for (int j = 0; j < 4; ++j) {
      pairs[0] = _mm256_add_epi16(pairs[0], _mm256_maddubs_epi16(v[2 * j], broadcast4(xb + 4 * j)));
      pairs[1] = _mm256_add_epi16(pairs[1],
                                  _mm256_maddubs_epi16(v[2 * j + 1], broadcast4(xb + 16 + 4 * j)));
      if (extra_bits(F) == 2 && j % 2 == 1) {
        for (int h = 0; h < 2; ++h) {
          sums[h] = _mm256_add_epi32(sums[h], _mm256_madd_epi16(pairs[h], ones));
          pairs[h] = zero;
        }
      }
    }
    if constexpr (F == Format::kQ6_K) return {sums[0], sums[1]};
    if constexpr (quant_bound(F) == 16) {  // 8 pairs of nibbles: at most 30,480
      return {_mm256_madd_epi16(_mm256_add_epi16(pairs[0], pairs[1]), ones), zero};
    }
    return {_mm256_add_epi32(_mm256_madd_epi16(pairs[0], ones), _mm256_madd_epi16(pairs[1], ones)),
            zero};
  }
}

// One sub-block's dot products with 8-bit x, one column per 32-bit lane.
template <Format F>
inline Dots block_dot(const uint8_t* quants, const int8_t* xb) {
  if constexpr (F == Format::kQ8_0) {
    __m256i dot = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const __m256i w = load_chunk(quants + 32 * j);
      dot = add_byte_dots(dot, _mm256_sign_epi8(w, w), _mm256_sign_epi8(broadcast4(xb + 4 * j), w));
    }
    return {dot, _mm256_setzero_si256()};
  } else {
    __m256i v[8];
    for (int j = 0; j < 4; ++j) chunk_values<F>(quants, j, v[2 * j], v[2 * j + 1]);
    return value_dots<F>(v, xb);
  }
}

// One sub-block's dot products with 16-bit x. `vpmaddwd` multiplies 16-bit pairs, so each
// column's 4 quants of a chunk widen to two 32-bit lanes: unpacklo holds columns 0, 1 | 4, 5 (two
// lanes each), unpackhi columns 2, 3 | 6, 7, and one horizontal add per block puts them back in
// column order.
template <Format F>
inline Dots block_dot(const uint8_t* quants, const int16_t* xb) {
  const __m256i zero = _mm256_setzero_si256();
  // two chains per half (even and odd steps): a VNNI step waits for the one before it. For the
  // nibble formats the even steps are elements 0-15 and the odd ones 16-31.
  __m256i lo[2] = {zero, zero}, hi[2] = {zero, zero};
  int step = 0;
  auto add = [&](__m256i wide_lo, __m256i wide_hi, __m256i x) {
    lo[step] = add_pair_dots(lo[step], wide_lo, x);
    hi[step] = add_pair_dots(hi[step], wide_hi, x);
    step ^= 1;
  };
  if constexpr (F == Format::kQ8_0) {
    for (int j = 0; j < 8; ++j) {  // signed bytes into the high half, shifted down with sign
      const __m256i w = load_chunk(quants + 32 * j);
      add(_mm256_srai_epi16(_mm256_unpacklo_epi8(zero, w), 8),
          _mm256_srai_epi16(_mm256_unpackhi_epi8(zero, w), 8), broadcast4(xb + 4 * j));
    }
  } else {
    for (int j = 0; j < 4; ++j) {
      __m256i low, high;
      chunk_values<F>(quants, j, low, high);
      add(_mm256_unpacklo_epi8(low, zero), _mm256_unpackhi_epi8(low, zero), broadcast4(xb + 4 * j));
      add(_mm256_unpacklo_epi8(high, zero), _mm256_unpackhi_epi8(high, zero),
          broadcast4(xb + 16 + 4 * j));
    }
  }
  if constexpr (F == Format::kQ6_K) {
    return {_mm256_hadd_epi32(lo[0], hi[0]), _mm256_hadd_epi32(lo[1], hi[1])};
  }
  return {_mm256_hadd_epi32(_mm256_add_epi32(lo[0], lo[1]), _mm256_add_epi32(hi[0], hi[1])), zero};
}
inline Dots as_dots(__m256i dot) { return {dot, _mm256_setzero_si256()}; }

// A sub-block's scales, one lane per column: `d` (Q6_K: its first 16 weights'), `d2` (Q6_K: the
// last 16's) and `m`, the offset per unit of x's block sum (d q + m formats). A K-quant's d is
// its super-block's fp16 d times a small integer: exact in float32 (at most 11 + 8 bits), as
// dmin times a min is.
template <class V>
struct ScalesOf {
  V d, m, d2;
};
using SubScales = ScalesOf<__m256>;

inline __m256 halves_at(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
template <bool Signed>
inline __m256 bytes_at(const uint8_t* p) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(Signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
}

// Sub-block j's scales from its block's header (8 columns' fields side by side); the K-quants'
// 6-bit ones through `ScaleReader`.
template <Format F>
inline SubScales sub_scales(const uint8_t* block, int j) {
  const __m256 d = halves_at(block);
  if constexpr (F == Format::kQ6_K) {  // [8 d][16 halves x 8 int8 scales]
    return {_mm256_mul_ps(d, bytes_at<true>(block + 16 + 16 * j)), d,
            _mm256_mul_ps(d, bytes_at<true>(block + 24 + 16 * j))};
  } else if constexpr (has_min(F)) {  // [8 d][8 m]
    return {d, halves_at(block + 16), d};
  } else {
    return {d, d, d};
  }
}
// MXFP4: [8 exponent bytes e] -> 2^(e - 128), exactly: (e - 1) << 23 as float32 bits, or for e
// of 0 and 1 the subnormals 2^-128 and 2^-127 (ggml's `e8m0_to_fp32_half`)
template <>
inline SubScales sub_scales<Format::kMXFP4>(const uint8_t* block, int) {
  const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block)));
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
  const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
  const __m256i is_normal = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
  const __m256 d = _mm256_castsi256_ps(_mm256_blendv_epi8(tiny, normal, is_normal));
  return {d, d, d};
}

// The lane-wise operations of `add_block` on 8 columns, or on 16 (the tile path's two groups
// at once, on AVX-512): the same operation on every lane, so a column's value does not depend
// on the width it was computed at.
inline __m256i lanes_minus(__m256i v, int32_t c) {
  return _mm256_sub_epi32(v, _mm256_set1_epi32(c));
}
inline __m256 lanes_times(__m256 v, float c) { return _mm256_mul_ps(v, _mm256_set1_ps(c)); }
inline __m256 lanes_fmadd(__m256 a, __m256i b, __m256 acc) {
  return _mm256_fmadd_ps(a, _mm256_cvtepi32_ps(b), acc);
}
inline __m256 lanes_fmadd(__m256 a, float b, __m256 acc) {
  return _mm256_fmadd_ps(a, _mm256_set1_ps(b), acc);
}
#ifdef __AVX512F__
inline __m512i lanes_minus(__m512i v, int32_t c) {
  return _mm512_sub_epi32(v, _mm512_set1_epi32(c));
}
inline __m512 lanes_times(__m512 v, float c) { return _mm512_mul_ps(v, _mm512_set1_ps(c)); }
inline __m512 lanes_fmadd(__m512 a, __m512i b, __m512 acc) {
  return _mm512_fmadd_ps(a, _mm512_cvtepi32_ps(b), acc);
}
inline __m512 lanes_fmadd(__m512 a, float b, __m512 acc) {
  return _mm512_fmadd_ps(a, _mm512_set1_ps(b), acc);
}
#endif

// A row's sub-block of 8 (or 16) columns added to its accumulator: the integer dot products
// scaled. Every row path calls this one sequence of float operations, which is what makes their
// outputs the same bits.
template <Format F, class A, class VF, class VI>
inline VF add_block(VF acc, DotsOf<VI> dot, const ScalesOf<VF>& s, const RoundedRows<A>& x,
                    int64_t rb) {
  const float dx = x.scale[rb];
  if constexpr (F == Format::kQ6_K) {  // two halves, each with its scale and its zero point
    const int32_t first = x.isum_first[rb], second = x.isum[rb] - first;
    acc = lanes_fmadd(lanes_times(s.d, dx), lanes_minus(dot.first, zero_point(F) * first), acc);
    return lanes_fmadd(lanes_times(s.d2, dx), lanes_minus(dot.second, zero_point(F) * second),
                       acc);
  }
  // quants are q - zero point
  if constexpr (zero_point(F) != 0) dot.first = lanes_minus(dot.first, zero_point(F) * x.isum[rb]);
  acc = lanes_fmadd(lanes_times(s.d, dx), dot.first, acc);
  if constexpr (has_min(F)) acc = lanes_fmadd(s.m, x.sum[rb], acc);
  return acc;
}

// Row m's outputs of group g (the bias added; columns past N dropped).
template <class A>
inline void store_row(const Problem<A>& p, int64_t m, int64_t g, __m256 acc) {
  alignas(32) float out[kLanes];
  _mm256_store_ps(out, acc);
  const int64_t n0 = g * kLanes, columns = std::min(kLanes, p.N - n0);
  float* y = p.y + m * p.ldy + n0;
  for (int64_t c = 0; c < columns; ++c) y[c] = p.bias ? out[c] + p.bias[n0 + c] : out[c];
}

// Sub-block b (of 32 weights) of a group's blocks: its block's header and its quants.
template <Format F>
struct SubBlock {
  const uint8_t* block;
  const uint8_t* quants;
  int j;  // its index within its block
};
template <Format F>
inline SubBlock<F> sub_block(const uint8_t* wg, int64_t b) {
  constexpr int64_t kSubs = sub_blocks(F);
  const uint8_t* block = wg + (b / kSubs) * group_block_bytes(F);
  const int j = static_cast<int>(b % kSubs);
  return {block, block + quants_at(F) + j * kLanes * quant_bytes(F), j};
}

// A Q4_K / Q5_K super-block's 6-bit scales and mins, 8 columns' of each sub-block as bytes:
// out [8 sub-blocks x 8 scales][8 sub-blocks x 8 mins]. The layout keeps the file's 12 bytes a
// column (gguf_regroup.cpp `place`): at 32, a byte per column and sub-block holding the low
// nibbles of its scale and min; at 96, a byte per column shared by sub-blocks j and j + 4, whose
// nibble j / 4 holds the top 2 bits of the scale and of the min.
inline void unpack_k_scales(const uint8_t* block, uint8_t* out) {
  auto load = [](const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  };
  auto store = [](uint8_t* p, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); };
  const __m256i nibble = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3),
                twelve = _mm256_set1_epi8(12), high = load(block + 96);
  for (int half = 0; half < 2; ++half) {  // sub-blocks 0-3, then 4-7
    const __m256i low = load(block + 32 + 32 * half);
    // (a 16-bit shift: the bits it brings in from the byte above are masked off)
    const __m256i top = _mm256_and_si256(half ? _mm256_srli_epi16(high, 4) : high, nibble);
    store(out + 32 * half,
          _mm256_or_si256(_mm256_and_si256(low, nibble),
                          _mm256_slli_epi16(_mm256_and_si256(top, three), 4)));
    store(out + 64 + 32 * half,
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low, 4), nibble),
                          _mm256_slli_epi16(_mm256_and_si256(top, twelve), 2)));
  }
}

// Each sub-block's scales in turn (`sub_scales`). A K-quant super-block's are unpacked together
// when its first sub-block is read: a few instructions for all eight, where one sub-block's alone
// took a dozen, which one-row decodes felt. The other formats read their header as it is, and
// hold nothing (state they do not use cost the AVX2 build's one-row tiles 15%).
template <Format F, bool kSixBit = F == Format::kQ4_K || F == Format::kQ5_K>
class ScaleReader {
 public:
  SubScales operator()(const SubBlock<F>& sb) { return sub_scales<F>(sb.block, sb.j); }
};
template <Format F>
class ScaleReader<F, true> {
 public:
  SubScales operator()(const SubBlock<F>& sb) {
    if (sb.block != block_) {
      unpack_k_scales(sb.block, fields_);
      block_ = sb.block;
    }
    const __m256 d = halves_at(sb.block);
    const __m256 m =
        _mm256_mul_ps(halves_at(sb.block + 16), bytes_at<false>(fields_ + 64 + 8 * sb.j));
    return {_mm256_mul_ps(d, bytes_at<false>(fields_ + 8 * sb.j)),
            _mm256_xor_ps(m, _mm256_set1_ps(-0.0f)), d};  // the weight is d sc q - dmin m
  }

 private:
  const uint8_t* block_ = nullptr;
  alignas(32) uint8_t fields_[128];
};

constexpr int kMaxRows = 4;  // rows per tile: their accumulators beside the quants in 16 ymm

// A group's sub-blocks' scales, for a panel of several row tiles over its unpacked quants
// (`run_unpacked`): each tile reads them rather than converting them again (a K-quant's
// unpacked once a panel, not once a tile). None (nullptr) where the panel is one tile.
template <Format F, class A>
const SubScales* group_scales(const Problem<A>& p, int64_t rows, int64_t g,
                              std::vector<SubScales>& out) {
  if (rows <= kMaxRows) return nullptr;
  const int64_t blocks = p.K / kBlock;
  const uint8_t* wg = p.w + g * (blocks / sub_blocks(F)) * group_block_bytes(F);
  ScaleReader<F> read;
  out.resize(blocks);
  for (int64_t b = 0; b < blocks; ++b) out[b] = read(sub_block<F>(wg, b));
  return out.data();
}

// A batch of a few rows reads each weight once, from memory: the hardware's prefetcher alone
// left a 4-row tile waiting on DRAM (a 3B-shaped file's layers at 4 rows: 106 -> 152 billion
// multiply-adds a second on Zen 4, one row unchanged). A group's blocks lie in order, so 2 KiB
// ahead of a sub-block's quants is about 14 sub-blocks on; three lines cover a sub-block's
// quants and its share of the headers.
inline void fetch_ahead(const uint8_t* quants) {
  const char* ahead = reinterpret_cast<const char*>(quants) + 2048;
  _mm_prefetch(ahead, _MM_HINT_T0);
  _mm_prefetch(ahead + 64, _MM_HINT_T0);
  _mm_prefetch(ahead + 128, _MM_HINT_T0);
}

// Rows m0..m0+MR-1 of the 8 columns of group g. (Its scales are read here, tile by tile: the
// scales cached for a panel, as `unpacked_tile` takes them, cost the AVX2 build's one-row tiles
// 10-14% with 16-bit x, in cache, though no one-row call reads the cache.)
template <Format F, class A, int MR>
void tile(const Problem<A>& p, int64_t m0, int64_t g) {
  const int64_t blocks = p.K / kBlock;
  const uint8_t* wg = p.w + g * (blocks / sub_blocks(F)) * group_block_bytes(F);
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  ScaleReader<F> scales;
  for (int64_t b = 0; b < blocks; ++b) {
    const SubBlock<F> sb = sub_block<F>(wg, b);
    fetch_ahead(sb.quants);
    const SubScales s = scales(sb);
#pragma GCC unroll 4  // acc[] in registers: GCC kept them in memory, a store and a load each block
    for (int r = 0; r < MR; ++r) {
      const int64_t rb = (m0 + r) * blocks + b;  // this row's block of x
      const A* xb = p.x->q.get() + rb * kBlock;
      acc[r] = add_block<F>(acc[r], block_dot<F>(sb.quants, xb), s, *p.x, rb);
    }
  }
  for (int r = 0; r < MR; ++r) store_row(p, m0 + r, g, acc[r]);
}

// Batches of several rows: `tile` above unpacks a block's quants again for every row tile (to
// 16-bit values, or for 8-bit x to bytes), and that unpacking, not the multiplies, is most of
// its work. Here a group's blocks are unpacked once per panel of rows into a buffer that stays
// in cache (the vectors `block_dot` builds, in its order), and every row of the panel multiplies
// from it. The integer sums are the same exact values and the float operations per block the
// same, so every output is bit for bit the one `tile` computes: which path a batch takes never
// changes a row's value. (Unpacking a group in passes small enough for L1 measured no faster:
// the loads from L2 keep up.)

// The fewest rows from which unpacking once is faster: 16-bit x on AVX2 Zen 3, 8-bit x on
// AVX-512 Zen 4 (which `run_pairs` serves from the same row count: this path remains for CPUs
// without AVX-512 VNNI). Q8_0 under 16-bit x unpacks to twice its bytes for a sign extension
// `tile` does in one instruction per 16 weights, and pays for that only in large batches: on Zen 4,
// AVX2-only build, 4 rows of a 3,072 x 8,192 linear 1.9 -> 1.1 ms from the blocks, SmolLM2's LM
// head 1.6 -> 1.2 ms, level at 16 rows, unpacked faster from 64 (1.2x).
template <Format F, class A>
constexpr int64_t unpack_min_rows() {
  if constexpr (std::is_same_v<A, int8_t>) return 8;
  return F == Format::kQ8_0 ? 16 : 3;
}

// A thread's groups g_begin..g_end-1 over M rows: the rows in panels of 64, every group in turn
// within a panel, so that a group's blocks stay in L1 for each of its row tiles and the panel's x
// in L2 for every group (a 2,048-row prompt read whole for each group came from L3: Q4_K 164
// against 196 billion multiply-adds a second with 8,192 inputs, Zen 4). `group(g)` runs before
// group g's tiles, `tile(rows, m0, g)` for each tile of up to kMaxRows rows from m0.
constexpr int64_t kUnpackPanel = 64;
template <class Group, class Tile>
void over_panels(int64_t M, int64_t g_begin, int64_t g_end, Group&& group, Tile&& tile) {
  for (int64_t panel = 0; panel < M; panel += kUnpackPanel) {
    const int64_t panel_end = std::min(M, panel + kUnpackPanel);
    for (int64_t g = g_begin; g < g_end; ++g) {
      group(g);
      for (int64_t m0 = panel; m0 < panel_end; m0 += kMaxRows) {
        tile(std::min<int64_t>(kMaxRows, panel_end - m0), m0, g);
      }
    }
  }
}

// Vectors per sub-block once unpacked: for 16-bit x each chunk's four unpacked halves (Q8_0's
// two per chunk), for 8-bit x each chunk's low and high values (Q8_0: its 8 chunks, + 128).
template <class A>
constexpr int64_t unpacked_vectors() {
  return std::is_same_v<A, int8_t> ? 8 : 16;
}

// Whether A-bit x over F's blocks multiplies from unpacked quants. 8-bit x: where unpacking
// costs more than splitting nibbles (which measured no faster unpacked once: Q4_0, Q4_1, Q4_K),
// and Q8_0's signed quants become unsigned (w + 128, x's block sum times 128 taken off after)
// only where `vpdpbusd` adds its products in 32 bits: `vpmaddubsw`'s 16-bit pairs would
// saturate.
template <Format F, class A>
constexpr bool unpacks() {
  if constexpr (std::is_same_v<A, int16_t>) return true;
  if constexpr (F == Format::kQ8_0) return kVnni;
  return extra_bits(F) > 0 || F == Format::kMXFP4;
}

// x's offset within a block for widened vector pair s (low and high unpack of one step)
template <Format F>
constexpr int64_t widened_x_offset(int s) {
  if constexpr (F == Format::kQ8_0) return 4 * s;
  return (s % 2 ? 16 : 0) + 4 * (s / 2);
}

// The group's blocks [blocks][unpacked_vectors<A>], as `block_dot` builds them for A-bit x.
template <Format F, class A>
void unpack_group(const uint8_t* wg, int64_t blocks, __m256i* out) {
  const __m256i zero = _mm256_setzero_si256();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* quants = sub_block<F>(wg, b).quants;
    __m256i* v = out + b * unpacked_vectors<A>();
    if constexpr (std::is_same_v<A, int8_t>) {
      if constexpr (F == Format::kQ8_0) {
        const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
        for (int j = 0; j < 8; ++j) v[j] = _mm256_xor_si256(load_chunk(quants + 32 * j), bias);
      } else {
        for (int j = 0; j < 4; ++j) chunk_values<F>(quants, j, v[2 * j], v[2 * j + 1]);
      }
    } else if constexpr (F == Format::kQ8_0) {
      for (int j = 0; j < 8; ++j) {
        const __m256i w = load_chunk(quants + 32 * j);
        v[2 * j] = _mm256_srai_epi16(_mm256_unpacklo_epi8(zero, w), 8);
        v[2 * j + 1] = _mm256_srai_epi16(_mm256_unpackhi_epi8(zero, w), 8);
      }
    } else {
      for (int j = 0; j < 4; ++j) {
        __m256i low, high;
        chunk_values<F>(quants, j, low, high);
        v[4 * j] = _mm256_unpacklo_epi8(low, zero);
        v[4 * j + 1] = _mm256_unpackhi_epi8(low, zero);
        v[4 * j + 2] = _mm256_unpacklo_epi8(high, zero);
        v[4 * j + 3] = _mm256_unpackhi_epi8(high, zero);
      }
    }
  }
}

// Rows m0..m0+MR-1 of the 8 columns of group g, from its widened blocks `wv` (16-bit x).
template <Format F, int MR, bool kCached>
void unpacked_tile(const Problem<int16_t>& p, const __m256i* wv, int64_t m0, int64_t g,
                   const SubScales* cached) {
  // Q6_K keeps its two halves (the even and the odd steps) apart, for their own scales
  constexpr int kHalves = F == Format::kQ6_K ? 2 : 1;
  const int64_t blocks = p.K / kBlock;
  const uint8_t* wg = p.w + g * (blocks / sub_blocks(F)) * group_block_bytes(F);
  const int16_t* xq = p.x->q.get() + m0 * p.K;
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  ScaleReader<F> scales;
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256i* v = wv + b * unpacked_vectors<int16_t>();
    Dots dots[MR];
    // row by row, the widened quants read from L1 as operands: the integer multiplies, not
    // the loads, are the limit, and holding quants in registers across rows spills
    for (int r = 0; r < MR; ++r) {
      const int16_t* xb = xq + r * p.K + b * kBlock;
      __m256i l[kHalves], h[kHalves];
      for (int c = 0; c < kHalves; ++c) l[c] = h[c] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int s = 0; s < 8; ++s) {
        const __m256i x4 = broadcast4(xb + widened_x_offset<F>(s));
        const int c = s % kHalves;
        l[c] = add_pair_dots(l[c], _mm256_load_si256(v + 2 * s), x4);
        h[c] = add_pair_dots(h[c], _mm256_load_si256(v + 2 * s + 1), x4);
        // keeps each step's sum in its register: left free, GCC computes all 16 products
        // first and spills them to the stack before adding
        asm("" : "+x"(l[c]), "+x"(h[c]));
      }
      if constexpr (kHalves == 2) {
        dots[r] = {_mm256_hadd_epi32(l[0], h[0]), _mm256_hadd_epi32(l[1], h[1])};
      } else {
        dots[r] = as_dots(_mm256_hadd_epi32(l[0], h[0]));
      }
    }
    const SubBlock<F> sb = sub_block<F>(wg, b);
    SubScales s;
    if constexpr (kCached) {
      s = cached[b];
    } else {
      s = scales(sb);
    }
    for (int r = 0; r < MR; ++r) {
      const int64_t rb = (m0 + r) * blocks + b;  // this row's block of x
      acc[r] = add_block<F>(acc[r], dots[r], s, *p.x, rb);
    }
  }
  for (int r = 0; r < MR; ++r) store_row(p, m0 + r, g, acc[r]);
}

// The same with 8-bit x, from the group's unpacked bytes `wv`.
template <Format F, int MR, bool kCached>
void unpacked_tile(const Problem<int8_t>& p, const __m256i* wv, int64_t m0, int64_t g,
                   const SubScales* cached) {
  const int64_t blocks = p.K / kBlock;
  const uint8_t* wg = p.w + g * (blocks / sub_blocks(F)) * group_block_bytes(F);
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  ScaleReader<F> scales;
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256i* v = wv + b * unpacked_vectors<int8_t>();
    const SubBlock<F> sb = sub_block<F>(wg, b);
    SubScales s;
    if constexpr (kCached) {
      s = cached[b];
    } else {
      s = scales(sb);
    }
#pragma GCC unroll 4  // acc[] in registers: GCC kept them in memory, a store and a load each block
    for (int r = 0; r < MR; ++r) {
      const int64_t rb = (m0 + r) * blocks + b;  // this row's block of x
      const int8_t* xb = p.x->q.get() + rb * kBlock;
      Dots dots;
      if constexpr (F == Format::kQ8_0) {  // sum (w + 128) x - 128 sum x: w x, exactly
        __m256i dot = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) dot = add_byte_dots(dot, v[j], broadcast4(xb + 4 * j));
        dots = as_dots(lanes_minus(dot, 128 * p.x->isum[rb]));
      } else {
        dots = value_dots<F>(v, xb);
      }
      acc[r] = add_block<F>(acc[r], dots, s, *p.x, rb);
    }
  }
  for (int r = 0; r < MR; ++r) store_row(p, m0 + r, g, acc[r]);
}

template <Format F, class A>
void run_unpacked(const Problem<A>& p, int64_t M) {
  using TileFn = void (*)(const Problem<A>&, const __m256i*, int64_t, int64_t, const SubScales*);
  static constexpr TileFn kTiles[2][kMaxRows] = {
      {&unpacked_tile<F, 1, false>, &unpacked_tile<F, 2, false>, &unpacked_tile<F, 3, false>,
       &unpacked_tile<F, 4, false>},
      {&unpacked_tile<F, 1, true>, &unpacked_tile<F, 2, true>, &unpacked_tile<F, 3, true>,
       &unpacked_tile<F, 4, true>}};
  const int64_t groups = (p.N + kLanes - 1) / kLanes, blocks = p.K / kBlock;
  const int64_t group_bytes = (blocks / sub_blocks(F)) * group_block_bytes(F);
  at::parallel_for(0, groups, 1, [&](int64_t g_begin, int64_t g_end) {
    // 32-byte aligned (C++17 new)
    std::vector<__m256i> unpacked(blocks * unpacked_vectors<A>());
    std::vector<SubScales> scales;
    const SubScales* cached = nullptr;
    over_panels(
        M, g_begin, g_end,
        [&](int64_t g) {
          unpack_group<F, A>(p.w + g * group_bytes, blocks, unpacked.data());
          cached = group_scales<F>(p, M, g, scales);
        },
        [&](int64_t rows, int64_t m0, int64_t g) {
          kTiles[cached != nullptr][rows - 1](p, unpacked.data(), m0, g, cached);
        });
  });
}

constexpr int64_t kAmxRows = 16;     // rows per tile: the tile unit's most
constexpr int64_t kAmxMinRows = 8;   // from here the tile unit beats the vector path (Xeon)

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// The paths that multiply 16 columns at once over 8-bit x (the tile unit; `vpdpbusd` on 64-byte
// registers) take two groups' quants unpacked side by side, and their scales joined.
constexpr int64_t kPairBytes = 2 * kLanes * kBlock;  // a sub-block of two groups, unpacked
constexpr int64_t kPanelBytes = 1 << 20;  // x's rows per panel: half of a core's L2

// The quants of groups g and g + 1 (`second` null past the last group: zeros) as bytes,
// [sub-blocks][8 rows][2 groups][32 bytes].
template <Format F>
void unpack_pair(const uint8_t* first, const uint8_t* second, int64_t blocks, uint8_t* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    auto* rows = reinterpret_cast<__m256i*>(out + b * kPairBytes);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* wg = h == 0 ? first : second;
      if (wg == nullptr) {
        for (int r = 0; r < 8; ++r) _mm256_store_si256(rows + 2 * r + h, _mm256_setzero_si256());
        continue;
      }
      const uint8_t* quants = sub_block<F>(wg, b).quants;
      for (int j = 0; j < 4; ++j) {
        __m256i low, high;
        if constexpr (F == Format::kQ8_0) {
          low = load_chunk(quants + 32 * j);
          high = load_chunk(quants + 32 * (4 + j));
        } else {
          chunk_values<F>(quants, j, low, high);
        }
        _mm256_store_si256(rows + 2 * j + h, low);
        _mm256_store_si256(rows + 2 * (4 + j) + h, high);
      }
    }
  }
}

using PairScales = ScalesOf<__m512>;  // a sub-block's scales of a pair's 16 columns

// Groups g and g + 1 made ready for 16 columns at once: their quants unpacked into `wq` and
// each sub-block's scales at scales[b * stride]; a group at or past `end` has none (zero scales,
// its quants left unwritten).
template <Format F>
void prepare_pair(const Problem<int8_t>& p, int64_t g, int64_t end, uint8_t* wq,
                  PairScales* scales, int64_t stride) {
  const int64_t blocks = p.K / kBlock;
  const int64_t group_bytes = (blocks / sub_blocks(F)) * group_block_bytes(F);
  const uint8_t* groups[2] = {g < end ? p.w + g * group_bytes : nullptr,
                              g + 1 < end ? p.w + (g + 1) * group_bytes : nullptr};
  if (groups[0] != nullptr) unpack_pair<F>(groups[0], groups[1], blocks, wq);
  const __m256 zero = _mm256_setzero_ps();
  ScaleReader<F> readers[2];
  for (int64_t b = 0; b < blocks; ++b) {
    SubScales half[2] = {{zero, zero, zero}, {zero, zero, zero}};
    for (int h = 0; h < 2; ++h) {
      if (groups[h] != nullptr) half[h] = readers[h](sub_block<F>(groups[h], b));
    }
    auto join = [](__m256 lo, __m256 hi) {
      return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
    };
    scales[b * stride] = {join(half[0].d, half[1].d), join(half[0].m, half[1].m),
                          join(half[0].d2, half[1].d2)};
  }
}
#endif

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && \
    defined(__AVX512DQ__)
// Batches of many rows with 8-bit x on CPUs with AMX: the tile unit computes a sub-block's
// integer dot products for 16 rows and 16 columns (two groups) in one instruction (`tdpbsud`:
// x's signed bytes times the quants' unsigned ones; `tdpbssd` for Q8_0's signed ones), and each
// row's sums per group of 8 columns then meet `add_block`, the float sequence every other path
// runs. The sums are the same exact integers the vector path computes, so a row's outputs are
// the same bits in any batch. A pass covers 32 rows and 32 columns: four independent products
// per sub-block, so that the tile unit works while earlier sums are stored. A pass's quants are
// unpacked once to bytes in the tile unit's order (row k / 4 of a sub-block holds values
// k..k+3 of 16 columns: `chunk_values`' low and high vectors of two groups side by side) and
// serve every row of a panel of x (1 MiB of its rows, in L2). Q6_K multiplies each half of a
// sub-block (16 values) apart, for its own scale. Every sub-block's sums go through memory to
// be scaled, which bounds the speed far below the tile unit's peak (docs/benchmarks.md).
// Tiles 0, 3, 6, 7: the sums of (row tile, pair) (0, 0), (0, 1), (1, 0), (1, 1); 1, 4: the two
// row tiles' x; 2, 5: the two pairs' quants. A step multiplies `step` values of x (32, or a
// Q6_K half's 16).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  explicit TileConfig(uint16_t step) {
    for (int t : {0, 3, 6, 7}) colsb[t] = 64, rows[t] = 16;
    for (int t : {1, 4}) colsb[t] = step, rows[t] = 16;
    for (int t : {2, 5}) colsb[t] = 64, rows[t] = static_cast<uint8_t>(step / 4);
  }
};

// Linux hands the tile registers' state to a process only on request. INFLIGHT_NO_AMX=1 keeps
// the vector path: for comparisons, or on a machine whose tiles misbehave.
bool amx_permitted() {
  static const bool permitted = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (std::getenv("INFLIGHT_NO_AMX")) return false;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return permitted;
}

// [halves][row tiles][pairs][16 rows][16 columns] of one sub-block
using TileSums = int32_t[2][2][2][16][2 * kLanes];

// One step of a sub-block: x's values at `xq` (row tile 1's 16 rows after), the quants at `wq`
// (pair 1's `pair_bytes` after), the sums of each (row tile, pair) into `out`.
template <Format F>
inline void tile_step(const int8_t* xq, int64_t ldx, const uint8_t* wq, int64_t pair_bytes,
                      bool two_tiles, bool two_pairs, int32_t (*out)[2][16][2 * kLanes]) {
// the tile intrinsics take their registers' numbers as literals
#define INFLIGHT_TILE_DOT(c, a, b)   \
  if constexpr (F == Format::kQ8_0) { \
    _tile_dpbssd(c, a, b);            \
  } else {                            \
    _tile_dpbsud(c, a, b);            \
  }
  _tile_zero(0);
  _tile_loadd(1, xq, ldx);
  _tile_loadd(2, wq, 64);
  INFLIGHT_TILE_DOT(0, 1, 2)
  if (two_pairs) {
    _tile_zero(3);
    _tile_loadd(5, wq + pair_bytes, 64);
    INFLIGHT_TILE_DOT(3, 1, 5)
  }
  if (two_tiles) {
    _tile_zero(6);
    _tile_loadd(4, xq + 16 * ldx, ldx);
    INFLIGHT_TILE_DOT(6, 4, 2)
    if (two_pairs) {
      _tile_zero(7);
      INFLIGHT_TILE_DOT(7, 4, 5)
    }
  }
#undef INFLIGHT_TILE_DOT
  _tile_stored(0, out[0][0], 64);
  if (two_pairs) _tile_stored(3, out[0][1], 64);
  if (two_tiles) _tile_stored(6, out[1][0], 64);
  if (two_tiles && two_pairs) _tile_stored(7, out[1][1], 64);
}

constexpr int64_t kPassRows = 32;         // rows per pass: two row tiles
constexpr int64_t kChunk = 2;             // sub-blocks summed before they are scaled: in L1

// Rows m0..m0+rows-1 of a pass's two pairs (columns past the last output have zero scales and
// quants, and are not stored): their quants unpacked at `wq` (the second pair `pair_bytes`
// after the first) and their scales [sub-blocks][2 pairs] at `scales`. Each row's two
// accumulators stay in registers over a chunk of sub-blocks.
template <Format F>
void amx_pass(const Problem<int8_t>& p, const uint8_t* wq, int64_t pair_bytes,
              const PairScales* scales, int64_t m0, int64_t rows, int64_t g0, int64_t groups) {
  const int64_t blocks = p.K / kBlock;
  const int8_t* xq = p.x->q.get() + m0 * p.K;
  const bool two_tiles = rows > 16, two_pairs = groups > 2;
  alignas(64) TileSums sums[kChunk];
  // a lone pair's partner is scaled too (zero scales, zero sums), so that the loop over pairs
  // has a fixed count and its accumulators stay in registers
  if (!two_pairs) std::memset(sums, 0, sizeof sums);
  __m512 acc[kPassRows][2];
  for (auto& row : acc) row[0] = row[1] = _mm512_setzero_ps();
  for (int64_t b0 = 0; b0 < blocks; b0 += kChunk) {
    const int64_t chunk = std::min(kChunk, blocks - b0);
    for (int64_t i = 0; i < chunk; ++i) {
      const int8_t* xb = xq + (b0 + i) * kBlock;
      const uint8_t* wb = wq + (b0 + i) * kPairBytes;
      tile_step<F>(xb, p.K, wb, pair_bytes, two_tiles, two_pairs, sums[i][0]);
      if constexpr (F == Format::kQ6_K) {
        tile_step<F>(xb + 16, p.K, wb + kPairBytes / 2, pair_bytes, two_tiles, two_pairs,
                     sums[i][1]);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      __m512 a[2] = {acc[r][0], acc[r][1]};
      for (int64_t i = 0; i < chunk; ++i) {
        for (int q = 0; q < 2; ++q) {
          DotsOf<__m512i> dot{_mm512_load_si512(sums[i][0][r / 16][q][r % 16]),
                              _mm512_setzero_si512()};
          if constexpr (F == Format::kQ6_K) {
            dot.second = _mm512_load_si512(sums[i][1][r / 16][q][r % 16]);
          }
          a[q] = add_block<F>(a[q], dot, scales[(b0 + i) * 2 + q], *p.x,
                              (m0 + r) * blocks + b0 + i);
        }
      }
      acc[r][0] = a[0];
      acc[r][1] = a[1];
    }
  }
  for (int64_t q = 0; q < groups; ++q) {
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 v = acc[r][q / 2];
      store_row(p, m0 + r, g0 + q,
                q % 2 ? _mm512_extractf32x8_ps(v, 1) : _mm512_castps512_ps256(v));
    }
  }
}

// A pass's columns made ready: groups g0..g0+count-1 (at most 4) unpacked into `wq` (the
// second pair `pair_bytes` after the first) and their scales into `scales` [sub-blocks][2 pairs],
// zero past the last group.
template <Format F>
void prepare_pass(const Problem<int8_t>& p, int64_t g0, int64_t count, uint8_t* wq,
                  int64_t pair_bytes, PairScales* scales) {
  for (int64_t pair = 0; pair < 2; ++pair) {
    prepare_pair<F>(p, g0 + 2 * pair, g0 + count, wq + pair * pair_bytes, scales + pair, 2);
  }
}

template <Format F>
void run_amx(const Problem<int8_t>& p, int64_t M) {
  const int64_t groups = (p.N + kLanes - 1) / kLanes, blocks = p.K / kBlock;
  const int64_t pair_bytes = blocks * kPairBytes;
  const int64_t panel_rows = std::max(kPassRows, kPanelBytes / p.K / kPassRows * kPassRows);
  // Threads split the passes' columns (four groups each); a panel of x's rows stays in L2 while
  // a thread's passes go over it.
  at::parallel_for(0, (groups + 3) / 4, 1, [&](int64_t begin, int64_t end) {
    const TileConfig config(F == Format::kQ6_K ? 16 : 32);
    _tile_loadconfig(&config);
    std::vector<__m256i> unpacked(2 * pair_bytes / 32);  // 32-byte aligned (C++17 new)
    auto* wq = reinterpret_cast<uint8_t*>(unpacked.data());
    std::vector<PairScales> scales(blocks * 2);  // 64-byte aligned
    for (int64_t panel = 0; panel < M; panel += panel_rows) {
      const int64_t panel_end = std::min(M, panel + panel_rows);
      for (int64_t pass = begin; pass < end; ++pass) {
        const int64_t g0 = 4 * pass, count = std::min<int64_t>(4, groups - g0);
        prepare_pass<F>(p, g0, count, wq, pair_bytes, scales.data());
        for (int64_t m0 = panel; m0 < panel_end; m0 += kPassRows) {
          amx_pass<F>(p, wq, pair_bytes, scales.data(), m0, std::min(kPassRows, panel_end - m0),
                      g0, count);
        }
      }
    }
    _tile_release();
  });
}
constexpr bool kAmx = true;
#else
constexpr bool kAmx = false;
bool amx_permitted() { return false; }
template <Format F>
void run_amx(const Problem<int8_t>&, int64_t) {}
#endif

// Whether a batch of M rows with `bits`-bit x goes through the tile unit.
inline bool uses_amx(int64_t bits, int64_t M) {
  return kAmx && bits == 8 && M >= kAmxMinRows && amx_permitted();
}

template <class A>
int64_t groups_of(const Problem<A>& p) {
  return (p.N + kLanes - 1) / kLanes;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
// Batches of 8-bit x on AVX-512 VNNI without the tile unit: two groups' quants unpacked side by
// side (`prepare_pair`, the tile unit's order), so that one `vpdpbusd` on a 64-byte register
// multiplies a 4-value step of 16 columns by x's broadcast bytes. A sub-block's 8 steps stay in
// registers for every row of a tile, where the 8-column unpacked path loads each step again
// for each row and pays each row's scaling per 8 columns. The sums are the same exact integers
// and `add_block` the same float sequence per column, so the outputs are the same bits.
constexpr bool kPairs8 = true;
constexpr int kPairTileRows = 4;

inline __m512i broadcast4_wide(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

// Row m's 16 outputs of pair `pair` (the bias added; columns past N dropped).
inline void store_pair_row(const Problem<int8_t>& p, int64_t m, int64_t pair, __m512 acc) {
  const int64_t n0 = pair * 2 * kLanes, columns = std::min(2 * kLanes, p.N - n0);
  const __mmask16 mask = static_cast<__mmask16>((1u << columns) - 1);
  if (p.bias) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mask, p.bias + n0));
  _mm512_mask_storeu_ps(p.y + m * p.ldy + n0, mask, acc);
}

// Rows m0..m0+MR-1 of pair `pair`'s 16 columns, from its unpacked quants `wq` and scales.
template <Format F, int MR>
void pair_tile(const Problem<int8_t>& p, const uint8_t* wq, const PairScales* scales, int64_t m0,
               int64_t pair) {
  const int64_t blocks = p.K / kBlock;
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const auto* wb = reinterpret_cast<const __m512i*>(wq + b * kPairBytes);
    __m512i w[8];  // step i: values 4i..4i+3 of the 16 columns
    for (int i = 0; i < 8; ++i) {
      w[i] = _mm512_load_si512(wb + i);
      // Q8_0's signed quants as w + 128 (`vpdpbusd` takes unsigned bytes); 128 x's sum off below
      if constexpr (F == Format::kQ8_0) w[i] = _mm512_xor_si512(w[i], _mm512_set1_epi8(-128));
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const int64_t rb = (m0 + r) * blocks + b;  // this row's block of x
      const int8_t* xb = p.x->q.get() + rb * kBlock;
      // four chains: steps 0-3 (values 0-15) and 4-7 (16-31) apart, for Q6_K's two halves
      __m512i c[4] = {zero, zero, zero, zero};
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        c[i / 4 * 2 + i % 2] =
            _mm512_dpbusd_epi32(c[i / 4 * 2 + i % 2], w[i], broadcast4_wide(xb + 4 * i));
      }
      DotsOf<__m512i> dot{_mm512_add_epi32(c[0], c[1]), _mm512_add_epi32(c[2], c[3])};
      if constexpr (F != Format::kQ6_K) dot = {_mm512_add_epi32(dot.first, dot.second), zero};
      if constexpr (F == Format::kQ8_0) dot.first = lanes_minus(dot.first, 128 * p.x->isum[rb]);
      acc[r] = add_block<F>(acc[r], dot, scales[b], *p.x, rb);
    }
  }
  for (int r = 0; r < MR; ++r) store_pair_row(p, m0 + r, pair, acc[r]);
}

template <Format F, int... R>
constexpr auto pair_tiles(std::integer_sequence<int, R...>) {
  using TileFn = void (*)(const Problem<int8_t>&, const uint8_t*, const PairScales*, int64_t,
                          int64_t);
  return std::array<TileFn, sizeof...(R)>{&pair_tile<F, R + 1>...};
}

template <Format F>
void run_pairs(const Problem<int8_t>& p, int64_t M) {
  static constexpr auto kTiles = pair_tiles<F>(std::make_integer_sequence<int, kPairTileRows>());
  const int64_t groups = groups_of(p), blocks = p.K / kBlock;
  const int64_t panel_rows =
      std::max(kUnpackPanel, kPanelBytes / p.K / kPairTileRows * kPairTileRows);
  // Threads split the pairs; a pair's quants are unpacked once per panel of x's rows (1 MiB,
  // in L2: 64-row panels unpacked 2-9% of the time again, Zen 4)
  at::parallel_for(0, (groups + 1) / 2, 1, [&](int64_t begin, int64_t end) {
    std::vector<__m512i> unpacked(blocks * kPairBytes / 64);  // 64-byte aligned (C++17 new)
    std::vector<PairScales> scales(blocks);
    auto* wq = reinterpret_cast<uint8_t*>(unpacked.data());
    for (int64_t panel = 0; panel < M; panel += panel_rows) {
      const int64_t panel_end = std::min(M, panel + panel_rows);
      for (int64_t pair = begin; pair < end; ++pair) {
        prepare_pair<F>(p, 2 * pair, groups, wq, scales.data(), 1);
        for (int64_t m0 = panel; m0 < panel_end; m0 += kPairTileRows) {
          kTiles[std::min<int64_t>(kPairTileRows, panel_end - m0) - 1](p, wq, scales.data(), m0,
                                                                     pair);
        }
      }
    }
  });
}
#else
constexpr bool kPairs8 = false;
template <Format F>
void run_pairs(const Problem<int8_t>&, int64_t) {}
#endif

// The fewest rows from which 8-bit x takes `run_pairs`: on Zen 4, 3,072-wide linears of every
// format 1.07-1.4x faster there than over 8 columns, 1.3-1.5x from 32 rows; at 5 rows level for
// Q4_K and Q5_0, and at 1-3 rows slower (one row reads each unpacked step once).
constexpr int64_t kPairMinRows = 8;

// Whether a batch of M rows with `bits`-bit x goes through `run_pairs`.
inline bool uses_pairs(int64_t bits, int64_t M) {
  return kPairs8 && bits == 8 && M >= kPairMinRows && !uses_amx(bits, M);
}

// Column groups g_begin..g_end-1 of M rows, tile by tile: a thread's share of `run`'s batch
// of a few rows.
template <Format F, class A>
void run_tiles(const Problem<A>& p, int64_t M, int64_t g_begin, int64_t g_end) {
  using TileFn = void (*)(const Problem<A>&, int64_t, int64_t);
  static constexpr TileFn kTiles[kMaxRows] = {&tile<F, A, 1>, &tile<F, A, 2>, &tile<F, A, 3>,
                                              &tile<F, A, 4>};
  over_panels(M, g_begin, g_end, [](int64_t) {},
              [&](int64_t rows, int64_t m0, int64_t g) { kTiles[rows - 1](p, m0, g); });
}

template <Format F, class A>
void run(const Problem<A>& p, int64_t M) {
  if constexpr (std::is_same_v<A, int8_t>) {
    if (uses_amx(8, M)) return run_amx<F>(p, M);
    if (uses_pairs(8, M)) return run_pairs<F>(p, M);
  }
  if constexpr (unpacks<F, A>()) {
    if (M >= unpack_min_rows<F, A>()) return run_unpacked<F>(p, M);
  }
  // Threads split the column groups
  at::parallel_for(0, groups_of(p), 4, [&](int64_t g_begin, int64_t g_end) {
    run_tiles<F>(p, M, g_begin, g_end);
  });
}

// Whether `run` multiplies M rows of A-bit x over F's blocks with `run_tiles` (the few rows of
// a decode), where the tile unit and unpacking once take larger batches.
template <Format F, class A>
bool runs_tiles(int64_t M) {
  if (uses_amx(sizeof(A) * 8, M) || uses_pairs(sizeof(A) * 8, M)) return false;
  if constexpr (unpacks<F, A>()) return M < unpack_min_rows<F, A>();
  return true;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// 16-bit x on AVX-512 VNNI: sixteen columns at a time, one per 32-bit lane of a 64-byte
// register, in a layout of their own (`regroup_blocks(..., columns=16)`): per block, 16 fp16 d,
// 16 fp16 m (Q4_1), then the quants in 64-byte chunks laid out so that unpacking a chunk's bytes
// to 16 bits within each 128-bit lane (`vpunpck[lh]bw`) yields, lane c, column c's k pair. Each
// `vpdpwssd` then multiplies a k pair of 16 columns by x's pair broadcast from memory: 32
// multiply-adds for one instruction, where the 8-column layout above spends a broadcast and a
// horizontal add on half as many; that is what makes batches of dozens to hundreds of rows
// compute-bound at the vector units' rate rather than at the shuffles'.
// Chunk q of a 4-bit block: byte i of 128-bit lane L is column 4L + (i % 8) / 2; its low nibble
// is k = 8q + 2 (i / 8) + i % 2 and its high nibble that k + 4. Q8_0's chunk q: byte i of lane L
// is column 4L + (i % 8) / 2 at k = 4q + 2 (i / 8) + i % 2.
// x is rounded as above (`round_block16`), then stored tile-major (a tile's rows one after
// another for each block), so that one pointer and constant offsets reach every row of a tile.
// The per-block sums are the same integers as the 8-column kernel's and the float operations the
// same per column, so the outputs are bit for bit the same too.
constexpr int64_t kWideLanes = 16;
constexpr int kWideRows = 8;        // rows per tile: 8 int and 8 float accumulators + 4 quants
constexpr int64_t kWidePanel = 64;  // rows per pass over a thread's columns (x's stay in L2)
constexpr int64_t kPairs = kBlock / 2;  // k pairs of a block: one 64-byte register of a row

constexpr int64_t wide_block_bytes(Format f) { return kWideLanes * block_bytes(f); }

// x rounded to 16 bits per block of 32, tile-major: [tiles][K / 32 blocks][8 rows][16 pairs]
// and [tiles][K / 32 blocks][8 rows]. Rows past M are left unwritten: no tile reads them.
struct TiledRows {
  Buffer<int32_t> pairs;  // two 16-bit values of one row
  Buffer<float> scale, sum;
  Buffer<int32_t> isum;
};

// A block of x (32 values) as two registers of float32: bf16 widens exactly.
inline void load_block16(const float* xb, __m512& lo, __m512& hi) {
  lo = _mm512_loadu_ps(xb);
  hi = _mm512_loadu_ps(xb + 16);
}
inline void load_block16(const c10::BFloat16* xb, __m512& lo, __m512& hi) {
  const __m512i raw = _mm512_loadu_si512(xb);
  auto widen = [](__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  };
  lo = widen(_mm512_castsi512_si256(raw));
  hi = widen(_mm512_extracti64x4_epi64(raw, 1));
}

// `round_block`'s rounding to 16 bits on 64-byte registers (the same scale, integers and sum),
// the 32 integers stored in order as 16 pairs.
template <class In>
inline float round_block16(const In* xb, int32_t* out, int32_t& isum) {
  __m512 lo, hi;
  load_block16(xb, lo, hi);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
  const bool nan =
      _mm512_cmp_ps_mask(lo, lo, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(hi, hi, _CMP_UNORD_Q);
  const float d = block_scale(amax, nan, 32767.0f);
  const __m512 inv = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
  const __m512i q_lo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));  // to even
  const __m512i q_hi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
  isum = _mm512_reduce_add_epi32(_mm512_add_epi32(q_lo, q_hi));
  const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtsepi32_epi16(q_lo)),
                                       _mm512_cvtsepi32_epi16(q_hi), 1);
  _mm512_storeu_si512(out, q);
  return d;
}

template <class In>
TiledRows round_rows_tiled(const In* x, int64_t M, int64_t K) {
  const int64_t blocks = K / kBlock, tiles = (M + kWideRows - 1) / kWideRows;
  const int64_t n = tiles * blocks * kWideRows;
  TiledRows t{buffer<int32_t>(n * kPairs), buffer<float>(n), buffer<float>(n), buffer<int32_t>(n)};
  at::parallel_for(0, M * blocks, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t m = i / blocks, b = i % blocks;
      const int64_t tile = m / kWideRows, r = m % kWideRows;
      const int64_t at = (tile * blocks + b) * kWideRows + r;
      int32_t isum;
      const float d = round_block16(x + i * kBlock, t.pairs.get() + at * kPairs, isum);
      t.scale[at] = d;
      t.isum[at] = isum;
      t.sum[at] = d * static_cast<float>(isum);
    }
  });
  return t;
}

template <class Out>
struct WideProblem {
  const TiledRows* x;
  const uint8_t* w;   // [groups of 16, K / 32, wide block bytes]
  const float* bias;  // [N] or null
  Out* y;             // [M, ldy]: this weight's N columns of each row
  int64_t K, N, ldy;
};

// 16 float32 outputs (the first `mask` lanes) to float32 or bf16 storage.
inline void store16(float* y, __mmask16 mask, __m512 v) { _mm512_mask_storeu_ps(y, mask, v); }
#ifdef __AVX512BF16__
inline void store16(c10::BFloat16* y, __mmask16 mask, __m512 v) {
  _mm256_mask_storeu_epi16(y, mask, (__m256i)_mm512_cvtneps_pbh(v));
}
#endif

// Rows 8 tile .. 8 tile + MR - 1 of the 16 columns of group g.
template <Format F, class Out, int MR>
void wide_tile(const WideProblem<Out>& p, int64_t tile, int64_t g) {
  constexpr int64_t kBytes = wide_block_bytes(F);
  // independent chains of `vpdpwssd` per row, so that few rows still fill the pipeline
  constexpr int kChains = MR == 1 ? 4 : (MR == 2 ? 2 : 1);
  const int64_t blocks = p.K / kBlock;
  const uint8_t* wg = p.w + g * blocks * kBytes;
  const int64_t row_blocks = tile * blocks * kWideRows;  // this tile's scales and sums
  const int32_t* xp = p.x->pairs.get() + row_blocks * kPairs;
  const float* scales = p.x->scale.get() + row_blocks;
  const float* sums = p.x->sum.get() + row_blocks;
  const int32_t* isums = p.x->isum.get() + row_blocks;
  const __m512i nibble = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
  __m512 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = wg + b * kBytes;
    const uint8_t* quants = block + kWideLanes * header_bytes(F);
    const int32_t* xb = xp + b * kWideRows * kPairs;
    __m512i dot[MR][kChains];
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < kChains; ++c) dot[r][c] = zero;
    // four k pairs of the 16 columns at a time (w[i]: pair `first + i`), every row in turn
    auto four_pairs = [&](const __m512i (&w)[4], int first) __attribute__((always_inline)) {
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          __m512i& acc_ri = dot[r][i % kChains];
          acc_ri = _mm512_dpwssd_epi32(acc_ri, w[i],
                                       _mm512_set1_epi32(xb[r * kPairs + first + i]));
        }
      }
    };
    if constexpr (F == Format::kQ8_0) {  // signed bytes into the high half, shifted down
#pragma GCC unroll 4
      for (int q = 0; q < 8; q += 2) {
        const __m512i raw0 = _mm512_loadu_si512(quants + 64 * q);
        const __m512i raw1 = _mm512_loadu_si512(quants + 64 * q + 64);
        const __m512i w[4] = {_mm512_srai_epi16(_mm512_unpacklo_epi8(zero, raw0), 8),
                              _mm512_srai_epi16(_mm512_unpackhi_epi8(zero, raw0), 8),
                              _mm512_srai_epi16(_mm512_unpacklo_epi8(zero, raw1), 8),
                              _mm512_srai_epi16(_mm512_unpackhi_epi8(zero, raw1), 8)};
        four_pairs(w, 2 * q);
      }
    } else {
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) {
        const __m512i raw = _mm512_loadu_si512(quants + 64 * q);
        const __m512i low = _mm512_and_si512(raw, nibble);
        const __m512i high = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
        const __m512i w[4] = {_mm512_unpacklo_epi8(low, zero), _mm512_unpackhi_epi8(low, zero),
                              _mm512_unpacklo_epi8(high, zero), _mm512_unpackhi_epi8(high, zero)};
        four_pairs(w, 4 * q);
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
    const int64_t rb = b * kWideRows;  // this block's row scalars
    for (int r = 0; r < MR; ++r) {
      __m512i sum = dot[r][0];
      for (int c = 1; c < kChains; ++c) sum = _mm512_add_epi32(sum, dot[r][c]);
      if constexpr (F == Format::kQ4_0) {  // quants are q - 8
        sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(8 * isums[rb + r]));
      }
      const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(scales[rb + r]));
      acc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sum), acc[r]);
      if constexpr (F == Format::kQ4_1) {
        const __m512 m = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2 * kWideLanes)));
        acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(sums[rb + r]), acc[r]);
      }
    }
  }
  const int64_t n0 = g * kWideLanes, columns = std::min(kWideLanes, p.N - n0);
  const __mmask16 mask = static_cast<__mmask16>((1u << columns) - 1);
  for (int r = 0; r < MR; ++r) {
    __m512 out = acc[r];
    if (p.bias) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(mask, p.bias + n0));
    store16(p.y + (tile * kWideRows + r) * p.ldy + n0, mask, out);
  }
}

template <Format F, class Out, int... R>
constexpr auto wide_tiles(std::integer_sequence<int, R...>) {
  using TileFn = void (*)(const WideProblem<Out>&, int64_t, int64_t);
  return std::array<TileFn, sizeof...(R)>{&wide_tile<F, Out, R + 1>...};
}

template <Format F, class Out>
void run_wide(const WideProblem<Out>& p, int64_t M) {
  static constexpr auto kTiles =
      wide_tiles<F, Out>(std::make_integer_sequence<int, kWideRows>());
  const int64_t groups = (p.N + kWideLanes - 1) / kWideLanes;
  // Threads split the column groups; a group's blocks stay in L1 for every row tile of a panel.
  at::parallel_for(0, groups, 1, [&](int64_t g_begin, int64_t g_end) {
    for (int64_t panel = 0; panel < M; panel += kWidePanel) {
      const int64_t panel_end = std::min(M, panel + kWidePanel);
      for (int64_t g = g_begin; g < g_end; ++g) {
        for (int64_t m0 = panel; m0 < panel_end; m0 += kWideRows) {
          kTiles[std::min<int64_t>(kWideRows, panel_end - m0) - 1](p, m0 / kWideRows, g);
        }
      }
    }
  });
}

// y = x W^T (+ bias) for x of In and y of Out storage (float or bf16).
template <class In, class Out>
void round_and_run_wide(const In* x, int64_t M, int64_t K, const uint8_t* w, const float* bias,
                        Out* y, int64_t N, Format format) {
  const TiledRows rounded = round_rows_tiled(x, M, K);
  const WideProblem<Out> p{&rounded, w, bias, y, K, N, N};
  with_legacy_format(format, [&](auto f) { run_wide<f.value>(p, M); });
}
constexpr bool kWide16 = true;
#else
constexpr bool kWide16 = false;
#endif

// Columns per group of the widest layout that `bits`-bit x multiplies over on this build.
constexpr int64_t columns_for(int64_t bits) { return kWide16 && bits == 16 ? 16 : kLanes; }

// Columns per group of `packed`'s layout: 16 for a legacy format's 16-column layout with
// 16-bit x on a build that has it, else 8. The two layouts' group sizes never coincide for a
// legacy format (16 x 18, 20 or 34 bytes against 8 x any format's bytes), so the shape says
// which one a caller regrouped into: the 8-column one serves every format on every build.
int64_t lanes_of(const at::Tensor& packed, int64_t bits) {
  if (kWide16 && bits == 16 && packed.dim() == 3 && packed.size(2) % 16 == 0) {
    const std::optional<Format> f = format_of(packed.size(2) / 16);
    if (f && is_legacy(*f)) return 16;
  }
  return kLanes;
}

// A run of a weight's output columns in one format: its groups' blocks at `w`.
struct Segment {
  const uint8_t* w;
  Format format;
  int64_t n0, N, K;  // its first column, its columns, and in_features
};

// The packing's segments: one for a [groups, blocks, group block bytes] tensor; for a fused
// weight whose parts came in different formats (a Q4_K_M file's q, k and v), the 1-D packing
// `model/gguf_blocks.py` writes: int64 [segments, then per segment: columns, blocks per row,
// group block bytes, byte offset], then the segments' blocks.
std::vector<Segment> segments_of(const at::Tensor& packed, int64_t lanes) {
  INFLIGHT_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  (packed.dim() == 3 || packed.dim() == 1),
              "packed: uint8 [ceil(out_features / ", lanes,
              "), in_features / (32 or 256), group block bytes], or a 1-D mixed packing");
  const uint8_t* base = packed.data_ptr<uint8_t>();
  auto format_for = [&](int64_t bytes) {
    const std::optional<Format> f = bytes % lanes ? std::nullopt : format_of(bytes / lanes);
    INFLIGHT_CHECK(f, "group blocks of ", bytes, " bytes: none of Q4_0 (", lanes * 18, "), Q4_1 (",
                lanes * 20, "), Q8_0 (", lanes * 34, "), Q5_0 (", lanes * 22, "), Q5_1 (",
                lanes * 24, "), Q4_K (", lanes * 148, "), Q5_K (", lanes * 180, "), Q6_K (",
                lanes * 210, ") or MXFP4 (", lanes * 17, ")");
    return *f;
  };
  if (packed.dim() == 3) {
    const Format f = format_for(packed.size(2));
    const int64_t K = packed.size(1) * sub_blocks(f) * kBlock;
    return {{base, f, 0, packed.size(0) * lanes, K}};
  }
  const int64_t total = packed.numel();
  auto field = [&](int64_t i) {
    INFLIGHT_CHECK((i + 1) * 8 <= total, "mixed packing: truncated header");
    int64_t v;
    std::memcpy(&v, base + 8 * i, sizeof v);
    return v;
  };
  const int64_t count = field(0);
  INFLIGHT_CHECK(count > 0 && count <= 64, "mixed packing: ", count, " segments");
  std::vector<Segment> segments;
  int64_t n0 = 0;
  for (int64_t s = 0; s < count; ++s) {
    const int64_t N = field(1 + 4 * s), blocks = field(2 + 4 * s), bytes = field(3 + 4 * s),
                  offset = field(4 + 4 * s);
    const Format f = format_for(bytes);
    const int64_t groups = (N + lanes - 1) / lanes;
    INFLIGHT_CHECK(N > 0 && N < (int64_t{1} << 31) && blocks > 0 && blocks < (int64_t{1} << 31) &&
                    offset >= 0 && offset % 64 == 0 &&
                    offset + groups * blocks * bytes <= total,
                "mixed packing: segment ", s, " runs past the packing");
    segments.push_back({base + offset, f, n0, N, blocks * sub_blocks(f) * kBlock});
    n0 += N;
  }
  return segments;
}

// y = x W^T (+ bias): x rounded once, then each segment's columns.
template <class A>
void round_and_run(const float* x, int64_t M, int64_t K, const std::vector<Segment>& segments,
                   const float* bias, float* y, int64_t ldy) {
  const int64_t rows = uses_amx(sizeof(A) * 8, M) ? (M + kAmxRows - 1) / kAmxRows * kAmxRows : M;
  const RoundedRows<A> rounded = round_rows<A>(x, M, K, rows);
  for (const Segment& s : segments) {
    const Problem<A> p{&rounded, s.w, bias ? bias + s.n0 : nullptr, y + s.n0, K, s.N, ldy};
    with_format(s.format, [&](auto f) { run<f.value>(p, M); });
  }
}

// The packing's segments for y [rows, out_features] = x [rows, K] W^T (+ bias), every argument
// checked against them (`lanes`: `lanes_of` the packing).
std::vector<Segment> checked_segments(const at::Tensor& x, const at::Tensor& packed,
                                      const c10::optional<at::Tensor>& bias, int64_t out_features,
                                      int64_t activation_bits, int64_t lanes, const at::Tensor& y) {
  INFLIGHT_CHECK(activation_bits == 8 || activation_bits == 16,
              "activation_bits must be 8 or 16, got ", activation_bits);
  std::vector<Segment> segments = segments_of(packed, lanes);
  const int64_t K = segments[0].K;
  for (const Segment& s : segments) {
    INFLIGHT_CHECK(s.K == K, "mixed packing: segments of ", s.K, " and ", K, " in_features");
    INFLIGHT_CHECK(is_legacy(s.format) || lanes == kLanes,
                "5-bit, K-quant and MXFP4 blocks are laid in groups of 8 columns only");
  }
  const int64_t columns = segments.back().n0 + segments.back().N;
  if (packed.dim() == 3) {  // its last group may end in padding
    INFLIGHT_CHECK(out_features > 0 && out_features > columns - lanes && out_features <= columns,
                "out_features ", out_features, " does not match the packing's ",
                columns / lanes, " groups of ", lanes);
    segments[0].N = out_features;
  } else {
    INFLIGHT_CHECK(out_features == columns, "out_features ", out_features,
                " does not match the mixed packing's ", columns, " columns");
  }
  INFLIGHT_CHECK(x.dim() == 2 && x.size(1) == K &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "x: [rows, ", K, "] float32 or bfloat16");
  INFLIGHT_CHECK(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == out_features),
              "bias: [", out_features, "]");
  INFLIGHT_CHECK(y.dim() == 2 && y.size(0) == x.size(0) && y.size(1) == out_features &&
                  y.scalar_type() == x.scalar_type() && y.is_contiguous(),
              "y: [rows, out_features] in x's dtype, contiguous");
  return segments;
}

}  // namespace

bool gguf_int_linear_available() { return true; }

int64_t gguf_int_linear_columns(int64_t activation_bits) { return columns_for(activation_bits); }

int64_t gguf_int_linear_tile_rows() { return kAmx && amx_permitted() ? kAmxMinRows : 0; }

bool gguf_int_linear_byte_dots() { return kVnni; }

at::Tensor gguf_int_linear(const at::Tensor& x, const at::Tensor& packed,
                           const c10::optional<at::Tensor>& bias, int64_t out_features,
                           int64_t activation_bits) {
  auto y = at::cpu::empty({x.dim() == 2 ? x.size(0) : 0, out_features}, x.options());
  gguf_int_linear_into(x, packed, bias, out_features, activation_bits, y);
  return y;
}

void gguf_int_linear_into(const at::Tensor& x_in, const at::Tensor& packed,
                          const c10::optional<at::Tensor>& bias, int64_t out_features,
                          int64_t activation_bits, at::Tensor& y) {
  const int64_t lanes = lanes_of(packed, activation_bits);
  const std::vector<Segment> segments =
      checked_segments(x_in, packed, bias, out_features, activation_bits, lanes, y);
  const int64_t K = segments[0].K;
  const at::Tensor bias_f32 = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const float* bias_p = bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr;
  const int64_t M = x_in.size(0);
  if (M == 0) return;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  if (lanes == kWideLanes) {  // x read and y written in their own dtype
    INFLIGHT_CHECK(segments.size() == 1, "the 16-column layout has no mixed packing");
    const uint8_t* w = segments[0].w;
    const Format format = segments[0].format;
    const at::Tensor x = x_in.contiguous();
    if (x.scalar_type() == at::kFloat) {
      round_and_run_wide(x.data_ptr<float>(), M, K, w, bias_p, y.data_ptr<float>(),
                         out_features, format);
      return;
    }
#ifdef __AVX512BF16__
    round_and_run_wide(x.data_ptr<c10::BFloat16>(), M, K, w, bias_p,
                       y.data_ptr<c10::BFloat16>(), out_features, format);
#else
    auto y_f32 = at::cpu::empty({M, out_features}, x.options().dtype(at::kFloat));
    round_and_run_wide(x.data_ptr<c10::BFloat16>(), M, K, w, bias_p, y_f32.data_ptr<float>(),
                       out_features, format);
    y.copy_(y_f32);
#endif
    return;
  }
#endif
  // bf16 x widens exactly to float32, and y rounds back once at the end
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  auto y_f32 = x_in.scalar_type() == at::kFloat ? y : at::cpu::empty({M, out_features}, x.options());
  if (activation_bits == 8) {
    round_and_run<int8_t>(x.data_ptr<float>(), M, K, segments, bias_p, y_f32.data_ptr<float>(),
                          out_features);
  } else {
    round_and_run<int16_t>(x.data_ptr<float>(), M, K, segments, bias_p, y_f32.data_ptr<float>(),
                           out_features);
  }
  if (!y_f32.is_same(y)) y.copy_(y_f32);
}

namespace {

// `gguf_int_linear_many`'s: one packing's segment of columns over one rounded x.
template <class A>
struct Job {
  Problem<A> p;
  int64_t M;
  Format format;
};

template <class A>
void run_many(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& packed,
              const std::vector<int64_t>& out_features, std::vector<at::Tensor>& ys) {
  std::vector<RoundedRows<A>> rounded;
  rounded.reserve(xs.size());  // the jobs point into it
  std::vector<Job<A>> jobs;
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t bits = sizeof(A) * 8, M = xs[i].size(0);
    const int64_t lanes = lanes_of(packed[i], bits);
    const std::vector<Segment> segments =
        checked_segments(xs[i], packed[i], c10::nullopt, out_features[i], bits, lanes, ys[i]);
    bool tiles = lanes == kLanes && xs[i].scalar_type() == at::kFloat && xs[i].is_contiguous();
    for (const Segment& s : segments) {
      with_format(s.format, [&](auto f) { tiles = tiles && runs_tiles<f.value, A>(M); });
    }
    if (!tiles) {  // a batch for the tile unit or for unpacking: a region of its own
      gguf_int_linear_into(xs[i], packed[i], c10::nullopt, out_features[i], bits, ys[i]);
      continue;
    }
    if (M == 0) continue;
    const int64_t K = segments[0].K;
    rounded.push_back(round_rows<A>(xs[i].data_ptr<float>(), M, K, M));
    for (const Segment& s : segments) {
      const Problem<A> p{&rounded.back(), s.w, nullptr, ys[i].data_ptr<float>() + s.n0, K, s.N,
                         out_features[i]};
      jobs.push_back({p, M, s.format});
    }
  }
  std::vector<int64_t> first{0};  // each job's first group in the region's numbering
  for (const Job<A>& j : jobs) first.push_back(first.back() + groups_of(j.p));
  at::parallel_for(0, first.back(), 4, [&](int64_t begin, int64_t end) {
    size_t j = std::upper_bound(first.begin(), first.end(), begin) - first.begin() - 1;
    for (int64_t g = begin; g < end; ++j) {
      const int64_t stop = std::min(end, first[j + 1]);
      with_format(jobs[j].format, [&](auto f) {
        run_tiles<f.value>(jobs[j].p, jobs[j].M, g - first[j], stop - first[j]);
      });
      g = stop;
    }
  });
}

}  // namespace

void gguf_int_linear_many(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& packed,
                          const std::vector<int64_t>& out_features, std::vector<at::Tensor>& ys,
                          int64_t activation_bits) {
  INFLIGHT_CHECK(packed.size() == xs.size() && out_features.size() == xs.size() &&
                     ys.size() == xs.size(),
                 "one packing, one out_features and one output per x");
  INFLIGHT_CHECK(activation_bits == 8 || activation_bits == 16,
                 "activation_bits must be 8 or 16, got ", activation_bits);
  if (activation_bits == 8) {
    run_many<int8_t>(xs, packed, out_features, ys);
  } else {
    run_many<int16_t>(xs, packed, out_features, ys);
  }
}

#else  // the compiler does not target AVX2, FMA and F16C: callers keep the exact paths

bool gguf_int_linear_available() { return false; }

int64_t gguf_int_linear_columns(int64_t) { return 8; }

int64_t gguf_int_linear_tile_rows() { return 0; }

bool gguf_int_linear_byte_dots() { return false; }

at::Tensor gguf_int_linear(const at::Tensor&, const at::Tensor&,
                           const c10::optional<at::Tensor>&, int64_t, int64_t) {
  INFLIGHT_CHECK(false, "gguf_int_linear needs AVX2, FMA and F16C");
}

void gguf_int_linear_into(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
                          int64_t, int64_t, at::Tensor&) {
  INFLIGHT_CHECK(false, "gguf_int_linear needs AVX2, FMA and F16C");
}

void gguf_int_linear_many(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                          const std::vector<int64_t>&, std::vector<at::Tensor>&, int64_t) {
  INFLIGHT_CHECK(false, "gguf_int_linear needs AVX2, FMA and F16C");
}

#endif

// Each head's rows through its own weight (DeepSeek's per-head latent projections: 16-128 small
// matrices a layer), in one call: a Python call per head costs more than the head's multiply.
at::Tensor gguf_int_linear_heads(const at::Tensor& x, const std::vector<at::Tensor>& packed,
                                 int64_t out_features, int64_t activation_bits) {
  INFLIGHT_CHECK(x.dim() == 3 && x.size(1) == static_cast<int64_t>(packed.size()),
                 "x: [rows, heads, in_features] with one packing a head, got ", x.sizes(),
                 " and ", packed.size(), " packings");
  auto y = at::cpu::empty({x.size(1), x.size(0), out_features}, x.options());
  // the threads share the heads; each head's multiply then runs on its thread alone (ATen runs
  // a parallel region's inner parallel_for inline), which spares a fork and join per head
  at::parallel_for(0, x.size(1), 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      at::Tensor y_h = y.select(0, h);
      gguf_int_linear_into(x.select(1, h), packed[h], c10::nullopt, out_features,
                           activation_bits, y_h);
    }
  });
  return y;
}
