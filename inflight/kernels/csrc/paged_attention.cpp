// Paged decode attention on the CPU: one query token per request, keys and values read in place
// from the paged KV cache through the block table (no gathered copy), GQA without repeating
// K/V, fp32 accumulation whatever the storage dtype. Parallel over (request, KV head) pairs,
// a long context's cut into parts of 512 positions whose softmaxes are merged (`merge_parts`);
// a request's several rows (drafts, outputs recomputed) attended together where the AVX2 rows
// serve (`decode_rows_avx2`), each row the bits it has alone.
//
//   q            [R, H, D]            one query per request
//   k/v_cache    kv_layout.h          the layer's paged cache
//   block_tables [R, MB] int64        blocks of each request, padded
//   seq_lens     [R] int64            tokens in the cache per request (the query's own included)
//   out          [R, H, D]            softmax(q k^T * scale) v over positions [first, seq_len)
//
// with first = seq_len - window when a sliding window is set (window > 0), else 0. With a
// soft cap c > 0 (Gemma 2's), each score s becomes c tanh(s / c) before the softmax; only the
// generic item computes it (a family that has it takes the plain path). With `sinks` (gpt-oss's,
// float32 [H]), each head's sink logit joins its softmax's denominator and nothing else: a
// position that takes probability from every key.
//
// A (request, KV head) item walks its blocks twice, keys then values, reading each block's run
// (2 KB) whole. Scores are kept for whole blocks: slot i of a head's row is position base + i,
// base = the first block's first position.
//
// The kernel is bound by memory latency, not bandwidth: one core keeps only so many cache misses
// in flight. So while it computes on one run it prefetches, line by line and into L2
// (`attention_avx2::fetch_run_line` says why), the run `kPrefetchRuns` ahead in the order it
// will read them (its keys, its values, then the first keys of the item it takes next), and
// threads take items from a shared counter one ahead so that next item is known. (One burst
// prefetch of the whole next run stalls on full miss buffers; line by line, a few runs ahead,
// cut decode attention time by about a fifth.)
#include "attention_avx2.h"
#include "kv_layout.h"
#include "kv_quant.h"
#include "ops.h"
#include "vec_math.h"

#include <ATen/ops/empty_cpu_dispatch.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

inline float max_of(const float* __restrict x, int64_t n) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// scores[i] = exp(scores[i] - max), in place; returns their sum (the softmax denominator). In
// vectors where the CPU has them, the last one masked, so that every score takes the same exp
// wherever it lies in the row (GCC left the `omp simd` loop of `exp_poly` scalar: a third of
// the time of decode attention over long contexts).
inline float exp_and_sum(float* __restrict scores, int64_t n, float max) {
#if defined(__AVX512F__)
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(lanes, scores + i);
    const __m512 e = _mm512_maskz_mov_ps(lanes, exp512(_mm512_sub_ps(x, _mm512_set1_ps(max))));
    _mm512_mask_storeu_ps(scores + i, lanes, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 sum = _mm256_setzero_ps();
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i lanes =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(std::min<int64_t>(n - i, 8))),
                           lane);
    const __m256 x = _mm256_maskload_ps(scores + i, lanes);
    const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(x, _mm256_set1_ps(max))),
                                   _mm256_castsi256_ps(lanes));
    _mm256_maskstore_ps(scores + i, lanes, e);
    sum = _mm256_add_ps(sum, e);
  }
  return lane_sum8(sum);
#else
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    scores[i] = exp_poly(scores[i] - max);
    sum += scores[i];
  }
  return sum;
#endif
}

// One request's view of the cache for one KV head: positions [first, len), all of its context
// or one part of it. A part's softmax is its own: `stats`, where given, receives each head's max
// and denominator, from which `merge_parts` weighs the parts' outputs.
struct Item {
  const KVLayout* layout;
  const int64_t* table;
  int64_t head, first, len;
  float* stats = nullptr;  // [G][2]
  int64_t first_block() const { return first / layout->block_size; }
  int64_t end_block() const { return (len + layout->block_size - 1) / layout->block_size; }
  int64_t num_blocks() const { return end_block() - first_block(); }
};

// How many runs ahead of the one being computed the decode kernels prefetch.
constexpr int64_t kPrefetchRuns = 3;

// The j-th run `it` reads (its keys block by block, then its values), continuing into `next`'s
// keys; past both, its own last value run (already cached: a harmless target).
template <typename T>
const char* run_in_read_order(const T* k_cache, const T* v_cache, const Item& it,
                              const Item* next, int64_t j) {
  const KVLayout& lay = *it.layout;
  const int64_t n = it.num_blocks(), b0 = it.first_block();
  const T* p;
  if (j < n) {
    p = k_cache + lay.run(it.table[b0 + j], it.head);
  } else if (j < 2 * n) {
    p = v_cache + lay.run(it.table[b0 + j - n], it.head);
  } else if (next != nullptr && j - 2 * n < next->num_blocks()) {
    p = k_cache + lay.run(next->table[next->first_block() + j - 2 * n], next->head);
  } else {
    p = v_cache + lay.run(it.table[b0 + n - 1], it.head);
  }
  return reinterpret_cast<const char*>(p);
}

// Each head's scores [lo, hi) of its row become probabilities, in place (soft-capped first
// where `softcap` > 0; with the G heads' `sinks`, each sink's exp in the denominator); each
// head's max and denominator into `stats` where given.
inline void softmax_rows(float* scores, int64_t G, int64_t row, int64_t lo, int64_t hi,
                         float softcap, const float* sinks, float* stats) {
  for (int64_t g = 0; g < G; ++g) {
    float* s = scores + g * row + lo;
    if (softcap > 0.f)
      for (int64_t i = 0; i < hi - lo; ++i) s[i] = softcap * std::tanh(s[i] / softcap);
    const float max = sinks ? std::max(max_of(s, hi - lo), sinks[g]) : max_of(s, hi - lo);
    float sum = exp_and_sum(s, hi - lo, max);  // (its own position: > 0 without a sink)
    if (sinks) sum += exp_poly(sinks[g] - max);
    if (stats) stats[2 * g] = max, stats[2 * g + 1] = sum;
    const float inv = 1.f / sum;
#pragma omp simd
    for (int64_t i = 0; i < hi - lo; ++i) s[i] *= inv;
  }
}

#ifdef __AVX512BF16__
using bf16 = c10::BFloat16;

// bf16 with AVX-512 BF16, D = 32 * DZ, G query heads per KV head, BS a multiple of 16. Scores:
// vdpbf16ps of a broadcast pair of query dims with a 64-byte key row (16 positions), two
// accumulator chains per head. Values: each 64-dim row widened to fp32 by interleaving with
// zeros (unpacklo/hi), which permutes dims within 128-bit lanes; undone once at the end. Outputs
// in bf16, or float32 for a part of an item (out_t).
template <int DZ, int G, typename out_t>
void decode_item_bf16(const bf16* q, const bf16* k_cache, const bf16* v_cache, const Item& it,
                      const Item* next, float scale, const float* sinks, float* scores,
                      out_t* out) {
  constexpr int D = 32 * DZ, DV = 2 * DZ;
  const KVLayout& lay = *it.layout;
  const int64_t BS = lay.block_size;
  const int64_t b0 = it.first_block(), b1 = it.end_block(), base = b0 * BS, row = (b1 - b0) * BS;
  const auto* q_pairs = reinterpret_cast<const int32_t*>(q);  // [G][D / 2]
  auto ahead = [&](int64_t j) {
    return run_in_read_order(k_cache, v_cache, it, next, j + kPrefetchRuns);
  };
  for (int64_t b = b0; b < b1; ++b) {
    const bf16* k = k_cache + lay.run(it.table[b], it.head);
    const char* pf = ahead(b - b0);  // lines at the same offsets as this run's
    for (int64_t c = 0; c < BS; c += 16) {
      __m512 even[G], odd[G];
      for (int g = 0; g < G; ++g) even[g] = odd[g] = _mm512_setzero_ps();
      for (int i = 0; i < D / 2; i += 2) {
        attention_avx2::fetch_run_line(pf + (i * BS + c) * 4);  // 4 bytes: a pair of bf16
        attention_avx2::fetch_run_line(pf + ((i + 1) * BS + c) * 4);
        const auto k0 = (__m512bh)_mm512_loadu_si512(k + i * BS * 2 + c * 2);
        const auto k1 = (__m512bh)_mm512_loadu_si512(k + (i + 1) * BS * 2 + c * 2);
        for (int g = 0; g < G; ++g) {
          even[g] = _mm512_dpbf16_ps(
              even[g], (__m512bh)_mm512_set1_epi32(q_pairs[g * D / 2 + i]), k0);
          odd[g] = _mm512_dpbf16_ps(
              odd[g], (__m512bh)_mm512_set1_epi32(q_pairs[g * D / 2 + i + 1]), k1);
        }
      }
      for (int g = 0; g < G; ++g)
        _mm512_storeu_ps(scores + g * row + b * BS + c - base,
                         _mm512_mul_ps(_mm512_add_ps(even[g], odd[g]), _mm512_set1_ps(scale)));
    }
  }
  softmax_rows(scores, G, row, it.first - base, it.len - base, 0.f, sinks, it.stats);

  __m512 acc[G][DV];
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < DV; ++j) acc[g][j] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t b = b0; b < b1; ++b) {
    const bf16* v = v_cache + lay.run(it.table[b], it.head);
    const char* pf = ahead(b1 - b0 + b - b0);
    const int64_t t0 = std::max(it.first, b * BS) - b * BS, t1 = std::min(it.len, (b + 1) * BS) - b * BS;
    for (int64_t t = t0; t < t1; ++t) {
      for (int z = 0; z < DZ; ++z) attention_avx2::fetch_run_line(pf + (t * D + z * 32) * 2);
      __m512 vv[DV];
      for (int z = 0; z < DZ; ++z) {
        const __m512i raw = _mm512_loadu_si512(v + t * D + z * 32);
        vv[2 * z] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, raw));
        vv[2 * z + 1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, raw));
      }
      for (int g = 0; g < G; ++g) {
        const __m512 p = _mm512_set1_ps(scores[g * row + b * BS + t - base]);
        for (int j = 0; j < DV; ++j) acc[g][j] = _mm512_fmadd_ps(p, vv[j], acc[g][j]);
      }
    }
  }
  // Lane L of vv[2z] holds dims 32z + 8L + 0..3, of vv[2z + 1] dims 32z + 8L + 4..7.
  for (int g = 0; g < G; ++g) {
    alignas(64) float tmp[D];
    for (int j = 0; j < DV; ++j) _mm512_store_ps(tmp + j * 16, acc[g][j]);
    for (int z = 0; z < DZ; ++z)
      for (int half = 0; half < 2; ++half)
        for (int lane = 0; lane < 4; ++lane)
          for (int e = 0; e < 4; ++e)
            out[g * D + 32 * z + 8 * lane + 4 * half + e] =
                static_cast<out_t>(tmp[(2 * z + half) * 16 + 4 * lane + e]);
  }
}

template <typename out_t>
using ItemFn = void (*)(const bf16*, const bf16*, const bf16*, const Item&, const Item*, float,
                       const float*, float*, out_t*);

template <int DZ, typename out_t>
ItemFn<out_t> pick_g(int64_t G) {
  switch (G) {
    case 1: return decode_item_bf16<DZ, 1, out_t>;
    case 2: return decode_item_bf16<DZ, 2, out_t>;
    case 3: return decode_item_bf16<DZ, 3, out_t>;
    case 4: return decode_item_bf16<DZ, 4, out_t>;
    case 5: return decode_item_bf16<DZ, 5, out_t>;
    case 6: return decode_item_bf16<DZ, 6, out_t>;
    case 7: return decode_item_bf16<DZ, 7, out_t>;
    case 8: return decode_item_bf16<DZ, 8, out_t>;
    default: return nullptr;
  }
}

// The specialised kernel for this shape, or nullptr (then the generic loop runs).
template <typename out_t>
ItemFn<out_t> pick_bf16(int64_t D, int64_t G, int64_t BS) {
  if (BS % 16 != 0) return nullptr;
  if (D == 64) return pick_g<2, out_t>(G);
  if (D == 128) return pick_g<4, out_t>(G);
  return nullptr;
}
#endif

#ifdef __AVX512F__
// 8-bit caches (int8, float8) with AVX-512, D = 64, 128 or 256, G <= 8 query heads per KV head,
// BS a multiple of 16. Keys: each pair row of a 16-position tile (32 bytes: dims 2i and 2i+1 of
// each position) widened to two float32 vectors of 8 positions x 2 dims and multiplied by the
// query's dims (2i, 2i+1) broadcast in pairs; each position's two lanes are added at the end of
// the tile (the even dims' sum plus the odd dims'), times its key scale. Values: 16 dims of a
// position at a time, widened, weighed by its probability times its value scale into float32
// accumulators held in registers across a block. The widening is the only work beside the
// multiply-adds: the AVX2 item's key tile through memory and 8-lane vectors made an int8 cache,
// half the bytes of bf16, 1.2-1.3x slower to read.
template <typename q_t, typename cache_t, int D, int G, typename out_t>
void decode_item_8bit(const q_t* q, const cache_t* k_cache, const cache_t* v_cache,
                      const Item& it, const Item* next, float scale, float softcap,
                      const float* sinks, float* scores, out_t* out) {
  constexpr int kChains = G <= 2 ? 2 : 1;   // accumulators per head and half: FMA latency
  constexpr int kValueVecs = G <= 4 ? 4 : 2;  // 16-dim vectors of values per pass
  const KVLayout& lay = *it.layout;
  const int64_t BS = lay.block_size;
  const int64_t b0 = it.first_block(), b1 = it.end_block(), base = b0 * BS, row = (b1 - b0) * BS;
  auto ahead = [&](int64_t j) {
    return run_in_read_order(k_cache, v_cache, it, next, j + kPrefetchRuns);
  };
  alignas(64) float qf[G][D];  // scaled; dims 2i and 2i+1 read as one 8-byte pair
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < D; ++d) qf[g][d] = static_cast<float>(q[g * D + d]) * scale;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t b = b0; b < b1; ++b) {
    const cache_t* k = k_cache + lay.run(it.table[b], it.head);
    const char* pf = ahead(b - b0);
    for (int64_t line = 0; line < BS * 4; line += 64)  // the key scales' lines
      attention_avx2::fetch_run_line(pf + D * BS + line);
    for (int64_t c = 0; c < BS; c += 16) {
      __m512 lo[G][kChains], hi[G][kChains];
      for (int g = 0; g < G; ++g)
        for (int h = 0; h < kChains; ++h) lo[g][h] = hi[g][h] = _mm512_setzero_ps();
      for (int i = 0; i < D / 2; ++i) {
        const int64_t at = i * BS * 2 + c * 2;  // this pair row's 32 bytes of the tile
        if ((at & 63) < 32) attention_avx2::fetch_run_line(pf + at);
        const __m512 k_lo = load16(k + at), k_hi = load16(k + at + 16);
        for (int g = 0; g < G; ++g) {
          double pair;
          std::memcpy(&pair, &qf[g][2 * i], sizeof pair);
          const __m512 qp = _mm512_castpd_ps(_mm512_set1_pd(pair));
          lo[g][i % kChains] = _mm512_fmadd_ps(qp, k_lo, lo[g][i % kChains]);
          hi[g][i % kChains] = _mm512_fmadd_ps(qp, k_hi, hi[g][i % kChains]);
        }
      }
      const __m512 key_scale = _mm512_loadu_ps(lay.key_scales(k) + c);
      for (int g = 0; g < G; ++g) {
        __m512 l = lo[g][0], h = hi[g][0];
        if constexpr (kChains == 2) l = _mm512_add_ps(l, lo[g][1]), h = _mm512_add_ps(h, hi[g][1]);
        const __m512 sum = _mm512_add_ps(_mm512_permutex2var_ps(l, even, h),
                                         _mm512_permutex2var_ps(l, odd, h));
        _mm512_storeu_ps(scores + g * row + b * BS + c - base, _mm512_mul_ps(sum, key_scale));
      }
    }
  }
  softmax_rows(scores, G, row, it.first - base, it.len - base, softcap, sinks, it.stats);

  alignas(64) float acc[G][D] = {};
  const int64_t value_row = lay.value_row();
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t t0 = std::max(it.first, b * BS) - b * BS;
    const int64_t t1 = std::min(it.len, (b + 1) * BS) - b * BS;
    const cache_t* run = v_cache + lay.run(it.table[b], it.head);
    float* p = scores + b * BS - base;  // head g's at p + g * row
    for (int64_t t = t0; t < t1; ++t) {  // the probabilities are not needed unscaled again
      const float v_scale = lay.value_scale(run, t);
      for (int g = 0; g < G; ++g) p[g * row + t] *= v_scale;
    }
    const char* pf = ahead(b1 - b0 + b - b0);
    for (int j0 = 0; j0 < D; j0 += 16 * kValueVecs) {
      __m512 a[G][kValueVecs];
      for (int g = 0; g < G; ++g)
        for (int j = 0; j < kValueVecs; ++j) a[g][j] = _mm512_load_ps(&acc[g][j0 + 16 * j]);
      for (int64_t t = t0; t < t1; ++t) {
        const cache_t* v = run + t * value_row + j0;
        attention_avx2::fetch_run_line(pf + t * value_row + j0);
        if (j0 + 16 * kValueVecs == D)  // the row's scale and the next row's start
          attention_avx2::fetch_run_line(pf + t * value_row + value_row - 1);
        __m512 vv[kValueVecs];
        for (int j = 0; j < kValueVecs; ++j) vv[j] = load16(v + 16 * j);
        for (int g = 0; g < G; ++g) {
          const __m512 pt = _mm512_set1_ps(p[g * row + t]);
          for (int j = 0; j < kValueVecs; ++j) a[g][j] = _mm512_fmadd_ps(pt, vv[j], a[g][j]);
        }
      }
      for (int g = 0; g < G; ++g)
        for (int j = 0; j < kValueVecs; ++j) _mm512_store_ps(&acc[g][j0 + 16 * j], a[g][j]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < D; ++d) out[g * D + d] = static_cast<out_t>(acc[g][d]);
}

template <typename q_t, typename cache_t, typename out_t>
using Item8Fn = void (*)(const q_t*, const cache_t*, const cache_t*, const Item&, const Item*,
                         float, float, const float*, float*, out_t*);

template <typename q_t, typename cache_t, int D, typename out_t, int... Gs>
Item8Fn<q_t, cache_t, out_t> pick_8bit_g(int64_t G, std::integer_sequence<int, Gs...>) {
  Item8Fn<q_t, cache_t, out_t> fn = nullptr;
  ((G == Gs + 1 ? (fn = decode_item_8bit<q_t, cache_t, D, Gs + 1, out_t>, 0) : 0), ...);
  return fn;
}

// The 8-bit item for this shape, or nullptr (then the AVX2 or generic item runs).
template <typename q_t, typename cache_t, typename out_t>
Item8Fn<q_t, cache_t, out_t> pick_8bit(int64_t D, int64_t G, int64_t BS) {
  constexpr auto heads = std::make_integer_sequence<int, 8>();
  if (BS % 16 != 0) return nullptr;
  if (D == 64) return pick_8bit_g<q_t, cache_t, 64, out_t>(G, heads);
  if (D == 128) return pick_8bit_g<q_t, cache_t, 128, out_t>(G, heads);
  if (D == 256) return pick_8bit_g<q_t, cache_t, 256, out_t>(G, heads);
  return nullptr;
}
#endif

// Any dtype and shape: each block's keys widened into an fp32 tile [D][BS] that stays in L1, so
// the inner loop runs over the block's positions, contiguous, without horizontal sums. Scales of
// an 8-bit cache multiply whole scores (keys) and probabilities (values). Where the block is whole
// runs of 16 positions (and the head whole runs of 64 dims), each run's sums stay in registers
// across the dims (the positions) instead of going through memory at every step: the same
// products added in the same order (the heads the vector items do not take: blocks of other
// than multiples of 16 positions, widths of other than multiples of 32).
constexpr int64_t kGenericPositions = 16, kGenericDims = 64, kGenericHeads = 4;

// Scores of a block of an unscaled cache, read from its pairs of dims in place (no widened tile),
// kGenericHeads query heads at a time over each run of 16 positions: head g's score of position
// t at out[g * row + t]. Each score adds its dims' products in ascending order, as the tile's
// loop does.
template <typename cache_t>
void score_block_in_runs(const cache_t* k, const float* qf, int64_t G, int64_t D, int64_t BS,
                         float* out, int64_t row) {
  constexpr int64_t P = kGenericPositions, NH = kGenericHeads;
  for (int64_t g0 = 0; g0 < G; g0 += NH) {
    for (int64_t t0 = 0; t0 < BS; t0 += P) {
      float s[NH][P] = {};
      for (int64_t i = 0; i < D / 2; ++i) {  // dims 2i and 2i + 1 of positions t0..t0 + P
        const cache_t* __restrict kp = k + (i * BS + t0) * 2;
        float even[P], odd[P];
#pragma omp simd
        for (int64_t t = 0; t < P; ++t) even[t] = widen(kp[2 * t]), odd[t] = widen(kp[2 * t + 1]);
        for (int64_t h = 0; h < NH; ++h) {
          const float q0 = qf[(g0 + h) * D + 2 * i], q1 = qf[(g0 + h) * D + 2 * i + 1];
#pragma omp simd
          for (int64_t t = 0; t < P; ++t)
            s[h][t] = std::fma(q1, odd[t], std::fma(q0, even[t], s[h][t]));
        }
      }
      for (int64_t h = 0; h < NH && g0 + h < G; ++h)
        for (int64_t t = 0; t < P; ++t) out[(g0 + h) * row + t0 + t] = s[h][t];
    }
  }
}
template <typename q_t, typename cache_t, typename out_t>
void decode_item_generic(const q_t* q, const cache_t* k_cache, const cache_t* v_cache,
                         const Item& it, int64_t G, float scale, float softcap,
                         const float* sinks, float* scores, out_t* out, std::vector<float>& qf,
                         std::vector<float>& tile, std::vector<float>& acc) {
  const KVLayout& lay = *it.layout;
  const int64_t BS = lay.block_size, D = lay.head_dim;
  const int64_t b0 = it.first_block(), b1 = it.end_block(), base = b0 * BS, row = (b1 - b0) * BS;
  // (query heads padded to whole groups of kGenericHeads with zeros: their scores are unused)
  qf.assign((G + kGenericHeads - 1) / kGenericHeads * kGenericHeads * D, 0.f);
  tile.resize(D * BS);
  acc.assign(G * D, 0.f);
  for (int64_t i = 0; i < G * D; ++i) qf[i] = static_cast<float>(q[i]) * scale;
  for (int64_t b = b0; b < b1; ++b) {
    const cache_t* k = k_cache + lay.run(it.table[b], it.head);
    if constexpr (!kScaledCache<cache_t>) {
      if (BS % kGenericPositions == 0) {
        score_block_in_runs(k, qf.data(), G, D, BS, scores + b * BS - base, row);
        continue;
      }
    }
    for (int64_t d = 0; d < D; ++d)
      for (int64_t t = 0; t < BS; ++t) tile[d * BS + t] = widen(k[lay.key_in_run(t, d)]);
    for (int64_t g = 0; g < G; ++g) {
      float* __restrict sg = scores + g * row + b * BS - base;
      const float* __restrict qg = qf.data() + g * D;
      if (BS % kGenericPositions == 0) {  // each run of positions' sums held in registers
        for (int64_t t0 = 0; t0 < BS; t0 += kGenericPositions) {
          float s[kGenericPositions] = {};
          for (int64_t d = 0; d < D; ++d) {
            const float* __restrict kd = tile.data() + d * BS + t0;
#pragma omp simd
            for (int64_t t = 0; t < kGenericPositions; ++t) s[t] = std::fma(qg[d], kd[t], s[t]);
          }
          for (int64_t t = 0; t < kGenericPositions; ++t) sg[t0 + t] = s[t];
        }
      } else {
        for (int64_t t = 0; t < BS; ++t) sg[t] = 0.f;
        for (int64_t d = 0; d < D; ++d) {
          const float* __restrict kd = tile.data() + d * BS;
#pragma omp simd
          for (int64_t t = 0; t < BS; ++t) sg[t] = std::fma(qg[d], kd[t], sg[t]);
        }
      }
      if constexpr (kScaledCache<cache_t>)
        for (int64_t t = 0; t < BS; ++t) sg[t] *= lay.key_scale(k, t);
    }
  }
  softmax_rows(scores, G, row, it.first - base, it.len - base, softcap, sinks, it.stats);
  for (int64_t b = b0; b < b1; ++b) {  // acc[g, :] += p[g, pos] * v[pos, :]
    const cache_t* v = v_cache + lay.run(it.table[b], it.head);
    const int64_t t0 = std::max(it.first, b * BS) - b * BS, t1 = std::min(it.len, (b + 1) * BS) - b * BS;
    if (D % kGenericDims == 0) {  // a run of each head's dims held in registers over the block
      for (int64_t d0 = 0; d0 < D; d0 += kGenericDims) {  // (the run's values stay in L1)
        for (int64_t g = 0; g < G; ++g) {
          const float* pg = scores + g * row + b * BS - base;
          float* __restrict ag = acc.data() + g * D + d0;
          float a[kGenericDims];
          for (int64_t j = 0; j < kGenericDims; ++j) a[j] = ag[j];
          for (int64_t t = t0; t < t1; ++t) {
            const cache_t* __restrict vt = v + lay.value_in_run(t) + d0;
            // (the scale's run-time branch, left in this loop, kept GCC from vectorizing it)
            const float p = kScaledCache<cache_t> ? pg[t] * lay.value_scale(v, t) : pg[t];
#pragma omp simd
            for (int64_t j = 0; j < kGenericDims; ++j) a[j] = std::fma(p, widen(vt[j]), a[j]);
          }
          for (int64_t j = 0; j < kGenericDims; ++j) ag[j] = a[j];
        }
      }
      continue;
    }
    for (int64_t t = t0; t < t1; ++t) {
      const cache_t* __restrict vt = v + lay.value_in_run(t);
      const float v_scale = lay.value_scale(v, t);
      for (int64_t g = 0; g < G; ++g) {
        const float p = scores[g * row + b * BS + t - base] * v_scale;
        float* __restrict ag = acc.data() + g * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) ag[d] = std::fma(p, widen(vt[d]), ag[d]);
      }
    }
  }
  for (int64_t i = 0; i < G * D; ++i) out[i] = static_cast<out_t>(acc[i]);
}

#if defined(__AVX2__) && defined(__FMA__)
// The most query heads whose values one `add_values` call weighs (its registers' limit).
constexpr int64_t kValueHeads = 6;

// Values v (n rows, `value_row` apart) weighed into NR heads' accumulators at once: head r's
// probabilities at p + r * row, its accumulator at acc + r * D.
template <int64_t D, int NR, typename cache_t>
void add_head_values(const float* p, int64_t row, const cache_t* v, int64_t value_row, int64_t n,
                     float* acc, const char* ahead, int64_t dims) {
  const float* probabilities[NR];
  float keep[NR];
  float* accumulators[NR];
  for (int r = 0; r < NR; ++r)
    probabilities[r] = p + r * row, keep[r] = 1.f, accumulators[r] = acc + r * dims;
  attention_avx2::add_values<D, NR>(probabilities, keep, v, value_row, n, accumulators, ahead,
                                    dims);
}

// AVX2 (and the float32 path of AVX-512 machines), D = 64, 128 or 256, or 0 for any head of a
// multiple of 32 dims known at run time (wide heads: DeepSeek's 576), BS a multiple of 16:
// each 16 positions of a block become a key tile (`attention_avx2.h`) scored against up to 4
// query heads at once (the heads padded with zeros to a multiple of 4); values are weighted into
// up to 6 heads at a time (each value widened once for all of them), a block at a time, their
// accumulators in registers across its positions.
// An 8-bit cache's key scales multiply each tile's scores, its value scales the probabilities.
// The runs ahead are prefetched line by line as in the bf16 kernel: 1.1-1.5x at 16 and 64
// requests on Zen 4 (a lone request whose cache sits in L2: ~15% slower, the prefetches' cost).
// T rows of one request (a token and its drafts: `its` share a block table and a head, each
// over its own positions) share each key tile's widening and each block's reads; every row
// goes through the operations it has alone (T = 1), so its bits are those. 4 rows of 1,500 to
// 4,000 positions: 1.1-1.4x faster than apart (Zen 4).
template <typename q_t, typename cache_t, int64_t D, typename out_t>
void decode_rows_avx2(const q_t* const* q, const cache_t* k_cache, const cache_t* v_cache,
                      const Item* its, int64_t T, const Item* next, int64_t G, float scale,
                      float softcap, const float* const* sinks, std::vector<float>& scores,
                      out_t* const* out, std::vector<float>& qf, std::vector<float>& tile,
                      std::vector<float>& acc) {
  using attention_avx2::kTile;
  const KVLayout& lay = *its[0].layout;
  const int64_t BS = lay.block_size, dims = D > 0 ? D : lay.head_dim;
  // the rows' blocks together: [b0, b1), each row's within them
  int64_t b0 = its[0].first_block(), b1 = its[0].end_block();
  for (int64_t t = 1; t < T; ++t)
    b0 = std::min(b0, its[t].first_block()), b1 = std::max(b1, its[t].end_block());
  const Item whole{&lay, its[0].table, its[0].head, b0 * BS, b1 * BS};
  auto ahead = [&](int64_t j) {
    return run_in_read_order(k_cache, v_cache, whole, next, j + kPrefetchRuns);
  };
  const int64_t base = b0 * BS, row = (b1 - b0) * BS, padded = (G + 3) / 4 * 4;
  scores.resize(T * G * row);
  qf.assign(T * padded * dims, 0.f);
  tile.resize(dims * kTile);
  acc.assign(T * G * dims, 0.f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < G * dims; ++i)
      qf[t * padded * dims + i] = static_cast<float>(q[t][i]) * scale;
  auto covers = [&](int64_t t, int64_t b) {
    return its[t].first_block() <= b && b < its[t].end_block();
  };
  // row t's positions [t0, t1) within block b, counted from the block's first
  auto span = [&](int64_t t, int64_t b) {
    return std::pair<int64_t, int64_t>{std::max(its[t].first, b * BS) - b * BS,
                                       std::min(its[t].len, (b + 1) * BS) - b * BS};
  };
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t run = lay.run(whole.table[b], whole.head);
    for (int64_t c = 0; c < BS; c += kTile) {
      attention_avx2::key_tile(k_cache + run + c * 2, BS, dims, tile.data(),
                               ahead(b - b0) + c * 2 * sizeof(cache_t));
      __m256 key_scale[2] = {_mm256_set1_ps(1.f), _mm256_set1_ps(1.f)};
      if constexpr (kScaledCache<cache_t>) {
        const float* scales = lay.key_scales(k_cache + run) + c;
        key_scale[0] = _mm256_loadu_ps(scales);
        key_scale[1] = _mm256_loadu_ps(scales + 8);
      }
      for (int64_t t = 0; t < T; ++t) {
        if (!covers(t, b)) continue;
        for (int64_t g0 = 0; g0 < G; g0 += 4) {
          __m256 tile_scores[4][2];
          attention_avx2::scores<D, 4>(qf.data() + (t * padded + g0) * dims, tile.data(),
                                       tile_scores, dims);
          for (int64_t g = g0; g < std::min(G, g0 + 4); ++g) {
            float* dst = scores.data() + (t * G + g) * row + b * BS + c - base;
            _mm256_storeu_ps(dst, _mm256_mul_ps(tile_scores[g - g0][0], key_scale[0]));
            _mm256_storeu_ps(dst + 8, _mm256_mul_ps(tile_scores[g - g0][1], key_scale[1]));
          }
        }
      }
    }
  }
  for (int64_t t = 0; t < T; ++t)
    softmax_rows(scores.data() + t * G * row, G, row, its[t].first - base, its[t].len - base,
                 softcap, sinks[t], its[t].stats);
  // n value rows, `value_row` elements apart, weighed into row t's heads' accumulators: each
  // value widened once per group of heads
  auto weigh = [&](int64_t t, const auto* values, int64_t value_row, int64_t n,
                   const float* probs, const char* pf) {
    for (int64_t g = 0; g < G; g += kValueHeads) {
      const float* pg = probs + g * row;
      float* ag = acc.data() + (t * G + g) * dims;
      const char* ahead_g = g == 0 ? pf : nullptr;
      switch (std::min(kValueHeads, G - g)) {
        case 1: add_head_values<D, 1>(pg, row, values, value_row, n, ag, ahead_g, dims); break;
        case 2: add_head_values<D, 2>(pg, row, values, value_row, n, ag, ahead_g, dims); break;
        case 3: add_head_values<D, 3>(pg, row, values, value_row, n, ag, ahead_g, dims); break;
        case 4: add_head_values<D, 4>(pg, row, values, value_row, n, ag, ahead_g, dims); break;
        case 5: add_head_values<D, 5>(pg, row, values, value_row, n, ag, ahead_g, dims); break;
        default: add_head_values<D, 6>(pg, row, values, value_row, n, ag, ahead_g, dims); break;
      }
    }
  };
  for (int64_t b = b0; b < b1; ++b) {  // acc[g, :] += p[g, pos] * v[pos, :]
    const int64_t offset = lay.run(whole.table[b], whole.head);  // the block's run in either cache
    const cache_t* run = v_cache + offset;
    const char* pf = ahead(b1 - b0 + b - b0);
    if constexpr (kScaledCache<cache_t>) {  // the probabilities are not needed unscaled again
      for (int64_t t = 0; t < T; ++t) {
        if (!covers(t, b)) continue;
        const auto [t0, t1] = span(t, b);
        float* p = scores.data() + t * G * row + b * BS - base;
        for (int64_t i = t0; i < t1; ++i) {
          const float v_scale = lay.value_scale(run, i);
          for (int64_t g = 0; g < G; ++g) p[g * row + i] *= v_scale;
        }
      }
    }
    if (lay.values_in_keys) {  // each 16 positions' values out of their keys' pairs
      const cache_t* key_run = k_cache + offset;
      for (int64_t c = 0; c < BS; c += kTile) {
        bool tiled = false;  // widened once, for the first row that reads it
        for (int64_t t = 0; t < T; ++t) {
          const auto [t0, t1] = span(t, b);
          const int64_t lo = std::max(t0, c), hi = std::min(t1, c + kTile);
          if (!covers(t, b) || lo >= hi) continue;
          if (!tiled) {
            attention_avx2::value_tile(key_run + c * 2, BS, dims, tile.data(),
                                       pf + c * 2 * sizeof(cache_t));  // (the keys of 3 blocks on)
            tiled = true;
          }
          float* p = scores.data() + t * G * row + b * BS - base;  // head g's at p + g * row
          weigh(t, tile.data() + (lo - c) * dims, dims, hi - lo, p + lo, nullptr);
        }
      }
      continue;
    }
    for (int64_t t = 0; t < T; ++t) {
      if (!covers(t, b)) continue;
      const auto [t0, t1] = span(t, b);
      float* p = scores.data() + t * G * row + b * BS + t0 - base;  // head g's at p + g * row
      weigh(t, run + lay.value_in_run(t0), lay.value_row(), t1 - t0, p,
            t == 0 ? pf + lay.value_in_run(t0) * sizeof(cache_t) : nullptr);
    }
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < G * dims; ++i) out[t][i] = static_cast<out_t>(acc[t * G * dims + i]);
}

// The AVX2 rows for this head size, or nullptr (then the generic item runs).
template <typename q_t, typename cache_t, typename out_t>
auto pick_rows_avx2(int64_t D, int64_t BS) {
  using Fn = decltype(&decode_rows_avx2<q_t, cache_t, 64, out_t>);
  if constexpr (std::is_same_v<cache_t, c10::Half>) {
    return Fn(nullptr);
  } else {
    if (BS % attention_avx2::kTile || D % 32) return Fn(nullptr);
    return D == 64    ? &decode_rows_avx2<q_t, cache_t, 64, out_t>
           : D == 128 ? &decode_rows_avx2<q_t, cache_t, 128, out_t>
           : D == 256 ? &decode_rows_avx2<q_t, cache_t, 256, out_t>
                      : &decode_rows_avx2<q_t, cache_t, 0, out_t>;
  }
}
#endif

// A request's positions are attended in parts of at most this many, cut at its positions that
// are multiples of it, and the parts' softmaxes merged: so that a few long
// requests (one request of a model with one KV head) keep every thread busy. The cuts depend on
// the request alone, never on its batch, so a row's value does not either.
constexpr int64_t kPartPositions = 512;

// One part of a (request, KV head) item; `slot` >= 0 indexes the parts' outputs and softmax
// stats of an item cut in several, -1 marks an item in one part (written to `out` at once).
struct Part {
  int64_t request, head, first, len, slot;
};

// The item's output from its parts' (each normalised by its own softmax, in float32): weights
// sum_p exp(max_p - max) / (sum over parts of sum_p exp(max_p - max), a sink's exp included).
template <typename q_t>
void merge_parts(const float* part_out, const float* part_stats, int64_t first_slot,
                 int64_t parts, int64_t G, int64_t D, const float* sinks, q_t* out,
                 std::vector<float>& acc) {
  acc.resize(D);
  for (int64_t g = 0; g < G; ++g) {
    auto stats = [&](int64_t p) { return part_stats + (first_slot + p) * 2 * G + 2 * g; };
    float max = sinks ? sinks[g] : -3.0e38f;
    for (int64_t p = 0; p < parts; ++p) max = std::max(max, stats(p)[0]);
    float total = sinks ? exp_poly(sinks[g] - max) : 0.f;
    for (int64_t p = 0; p < parts; ++p) total += stats(p)[1] * exp_poly(stats(p)[0] - max);
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t p = 0; p < parts; ++p) {
      const float* __restrict src = part_out + ((first_slot + p) * G + g) * D;
      const float w = stats(p)[1] * exp_poly(stats(p)[0] - max) / total;
      float* __restrict a = acc.data();
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) a[d] = std::fma(w, src[d], a[d]);
    }
    for (int64_t d = 0; d < D; ++d) out[g * D + d] = static_cast<q_t>(acc[d]);
  }
}

// Whether an AVX-512 item (bf16, 8-bit) attends these dtypes and shape; else the AVX2 rows do
// where `pick_rows_avx2` has them, else the generic item (`attend`'s order).
template <typename q_t, typename cache_t>
bool avx512_item_takes(int64_t D, int64_t G, int64_t BS, float softcap, bool own_values) {
#ifdef __AVX512BF16__
  if constexpr (std::is_same_v<q_t, bf16> && std::is_same_v<cache_t, bf16>)
    if (softcap <= 0.f && own_values && pick_bf16<float>(D, G, BS)) return true;
#endif
#ifdef __AVX512F__
  if constexpr (kScaledCache<cache_t>)
    if (own_values && pick_8bit<q_t, cache_t, float>(D, G, BS)) return true;
#endif
  return false;
}

// One item (or part) through the fastest kernel for its dtypes and shape, its output to `out`.
template <typename q_t, typename cache_t, typename out_t>
void attend(const q_t* q, const cache_t* k_cache, const cache_t* v_cache, const Item& it,
            const Item* next, int64_t G, float scale, float softcap, const float* sinks,
            std::vector<float>& score_rows, out_t* out, std::vector<float>& qf,
            std::vector<float>& tile, std::vector<float>& acc) {
  const int64_t D = it.layout->head_dim, BS = it.layout->block_size;
  score_rows.resize(G * it.num_blocks() * BS);
  float* scores = score_rows.data();
  const bool own_values = !it.layout->values_in_keys;  // (else the AVX2 item reads them)
#ifdef __AVX512BF16__
  if constexpr (std::is_same_v<q_t, bf16> && std::is_same_v<cache_t, bf16>) {
    // (its scores never reach memory: the soft cap takes the AVX2 item)
    if (ItemFn<out_t> fn = softcap <= 0.f && own_values ? pick_bf16<out_t>(D, G, BS) : nullptr) {
      fn(q, k_cache, v_cache, it, next, scale, sinks, scores, out);
      return;
    }
  }
#endif
#ifdef __AVX512F__
  if constexpr (kScaledCache<cache_t>) {
    if (auto fn = own_values ? pick_8bit<q_t, cache_t, out_t>(D, G, BS) : nullptr) {
      fn(q, k_cache, v_cache, it, next, scale, softcap, sinks, scores, out);
      return;
    }
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (auto fn = pick_rows_avx2<q_t, cache_t, out_t>(D, BS)) {
    fn(&q, k_cache, v_cache, &it, 1, next, G, scale, softcap, &sinks, score_rows, &out, qf,
       tile, acc);
    return;
  }
#endif
  decode_item_generic(q, k_cache, v_cache, it, G, scale, softcap, sinks, scores, out, qf, tile,
                      acc);
}

// Rows that read one cache: a request's verified drafts or recomputed outputs, consecutive rows
// whose block tables agree over the earlier row's blocks (a later one reads further).
inline bool same_cache(const int64_t* block_tables, const int64_t* seq_lens, int64_t MB,
                       int64_t BS, int64_t a, int64_t b) {
  if (seq_lens[b] < seq_lens[a]) return false;
  const int64_t* ta = block_tables + a * MB;
  return std::equal(ta, ta + (seq_lens[a] + BS - 1) / BS, block_tables + b * MB);
}

template <typename q_t, typename cache_t>
void decode(const q_t* q, const cache_t* k_cache, const cache_t* v_cache,
            const KVLayout& lay, const int64_t* block_tables, const int64_t* seq_lens,
            q_t* out, int64_t R, int64_t H, int64_t MB, float scale, int64_t window,
            float softcap, const float* sinks) {
  const int64_t KVH = lay.kv_heads, D = lay.head_dim, BS = lay.block_size;
  const int64_t G = H / KVH;  // query heads per KV head
  // Where the AVX2 rows attend, the parts of rows that read one cache (`same_cache`) at one
  // head over one span of kPartPositions are a unit, attended together: each key tile scored
  // once for all of them, each row's operations those it has alone.
  [[maybe_unused]] const bool grouped =
      !avx512_item_takes<q_t, cache_t>(D, G, BS, softcap, !lay.values_in_keys)
#if defined(__AVX2__) && defined(__FMA__)
      && pick_rows_avx2<q_t, cache_t, float>(D, BS) != nullptr;
#else
      && false;
#endif
  std::vector<Part> parts;
  std::vector<std::array<int64_t, 3>> merges;  // (request, head, first slot) of items cut up
  std::vector<std::array<int64_t, 3>> keys;  // (first row of its group, head, span) a part
  int64_t slots = 0;
  for (int64_t g0 = 0, g1; g0 < R; g0 = g1) {  // rows [g0, g1) read one cache
    g1 = g0 + 1;
    while (grouped && g1 < R && same_cache(block_tables, seq_lens, MB, BS, g1 - 1, g1)) ++g1;
    for (int64_t h = 0; h < KVH; ++h) {
      for (int64_t r = g0; r < g1; ++r) {
        const int64_t len = seq_lens[r];
        const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
        if ((len - 1) / kPartPositions == first / kPartPositions) {  // one part
          parts.push_back({r, h, first, len, -1});
          keys.push_back({g0, h, first / kPartPositions});
          continue;
        }
        merges.push_back({r, h, slots});
        for (int64_t lo = first; lo < len; lo = (lo / kPartPositions + 1) * kPartPositions) {
          parts.push_back({r, h, lo, std::min(len, (lo / kPartPositions + 1) * kPartPositions),
                           slots++});
          keys.push_back({g0, h, lo / kPartPositions});
        }
      }
    }
  }
  // Units: runs of parts of one key, in row order.
  std::vector<int64_t> order(parts.size());
  std::iota(order.begin(), order.end(), 0);
  if (grouped)  // (apart, each row its own group: the parts come in key order already)
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
  std::vector<std::pair<int64_t, int64_t>> units;  // [begin, end) in `order`
  for (size_t i = 0; i < order.size(); ++i) {
    if (i > 0 && keys[order[i]] == keys[order[i - 1]]) units.back().second += 1;
    else units.push_back({int64_t(i), int64_t(i) + 1});
  }
  // too few units to keep every thread busy (a lone short request's rows): a part each, as
  // ungrouped rows run (Gemma 3's 4 rows of 300 positions took 1.7x as long on one thread)
  if (static_cast<int64_t>(units.size()) < 2 * omp_get_max_threads() &&
      units.size() < parts.size()) {
    units.clear();
    for (size_t i = 0; i < order.size(); ++i) units.push_back({int64_t(i), int64_t(i) + 1});
  }
  auto cost = [&](const std::pair<int64_t, int64_t>& u) {
    int64_t c = 0;
    for (int64_t i = u.first; i < u.second; ++i) c += parts[order[i]].len - parts[order[i]].first;
    return c;
  };
  // Longest first, handed out one at a time: a unit costs its parts' lengths, and contexts
  // differ by 10x in one batch (an even split left one thread idle ~10% of a step).
  std::stable_sort(units.begin(), units.end(),
                   [&](const auto& a, const auto& b) { return cost(a) > cost(b); });
  std::unique_ptr<float[]> part_out(new float[slots * G * D]);  // (unset: each is written)
  std::unique_ptr<float[]> part_stats(new float[slots * 2 * G]);
  auto item = [&](int64_t i) {
    const Part& pt = parts[i];
    return Item{&lay, block_tables + pt.request * MB, pt.head, pt.first, pt.len,
                pt.slot < 0 ? nullptr : part_stats.get() + pt.slot * 2 * G};
  };
  auto query = [&](int64_t i) { return (parts[i].request * H + parts[i].head * G) * D; };
  // a sink joins the whole item's softmax: merge_parts adds it to a cut item's
  auto item_sinks = [&](int64_t i) {
    return sinks && parts[i].slot < 0 ? sinks + parts[i].head * G : nullptr;
  };
  const int64_t num_units = static_cast<int64_t>(units.size());
  // Thread t starts with unit t, then takes the rest in order from a shared counter, one ahead
  // (so that it knows which runs to prefetch): taking two at once from the start, the first
  // thread to wake took both parts of a request cut in two.
  std::atomic<int64_t> taken{0};
#pragma omp parallel if (num_units > 1)
  {
    const int64_t threads = omp_get_num_threads();
    std::vector<float> scores, qf, tile, acc, rows_out;
    std::vector<Item> its;
    std::vector<const q_t*> qs;
    std::vector<const float*> row_sinks;
    std::vector<float*> outs;
    for (int64_t u = omp_get_thread_num(); u < num_units;) {
      const int64_t u_next = threads + taken.fetch_add(1);
      const auto [begin, end] = units[u];
      const std::optional<Item> next =
          u_next < num_units ? std::optional<Item>(item(order[units[u_next].first]))
                             : std::nullopt;
      const Item* ahead = next ? &*next : nullptr;
#if defined(__AVX2__) && defined(__FMA__)
      if (end - begin > 1) {  // (grouped: the AVX2 rows, in float32, for the merge or `out`)
        const int64_t T = end - begin;
        its.clear(), qs.clear(), row_sinks.clear(), outs.clear();
        rows_out.resize(T * G * D);
        for (int64_t t = 0; t < T; ++t) {
          const int64_t i = order[begin + t];
          its.push_back(item(i));
          qs.push_back(q + query(i));
          row_sinks.push_back(item_sinks(i));
          outs.push_back(parts[i].slot < 0 ? rows_out.data() + t * G * D
                                           : part_out.get() + parts[i].slot * G * D);
        }
        pick_rows_avx2<q_t, cache_t, float>(D, BS)(qs.data(), k_cache, v_cache, its.data(), T,
                                                   ahead, G, scale, softcap, row_sinks.data(),
                                                   scores, outs.data(), qf, tile, acc);
        for (int64_t t = 0; t < T; ++t) {  // a row in one part: its output, as `attend` rounds it
          const int64_t i = order[begin + t];
          if (parts[i].slot < 0)
            for (int64_t j = 0; j < G * D; ++j)
              out[query(i) + j] = static_cast<q_t>(rows_out[t * G * D + j]);
        }
        u = u_next;
        continue;
      }
#endif
      const int64_t i = order[begin];
      if (parts[i].slot < 0)
        attend(q + query(i), k_cache, v_cache, item(i), ahead, G, scale, softcap, item_sinks(i),
               scores, out + query(i), qf, tile, acc);
      else  // in float32, for the merge
        attend(q + query(i), k_cache, v_cache, item(i), ahead, G, scale, softcap, item_sinks(i),
               scores, part_out.get() + parts[i].slot * G * D, qf, tile, acc);
      u = u_next;
    }
    if (!merges.empty()) {
#pragma omp barrier
#pragma omp for schedule(static)
      for (size_t m = 0; m < merges.size(); ++m) {
        const auto [r, h, first_slot] = merges[m];
        const int64_t end_slot = m + 1 < merges.size() ? merges[m + 1][2] : slots;
        merge_parts(part_out.get(), part_stats.get(), first_slot, end_slot - first_slot, G, D,
                    sinks ? sinks + h * G : nullptr, out + (r * H + h * G) * D, acc);
      }
    }
  }
}

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                     const at::Tensor& v_cache,
                                     const at::Tensor& block_tables,
                                     const at::Tensor& seq_lens, double scale,
                                     int64_t window, double softcap,
                                     const c10::optional<at::Tensor>& sinks) {
  const KVLayout lay = kv_layout(k_cache, v_cache);
  INFLIGHT_CHECK(q.dim() == 3 && q.is_contiguous(), "q must be contiguous [R, H, D]");
  INFLIGHT_CHECK(block_tables.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kLong,
              "block_tables and seq_lens must be int64");
  const int64_t R = q.size(0), H = q.size(1);
  INFLIGHT_CHECK(q.size(2) == lay.head_dim && H % lay.kv_heads == 0, "head sizes do not match");
  check_values_in_keys(lay, k_cache.scalar_type());
  INFLIGHT_CHECK(block_tables.dim() == 2 && block_tables.size(0) == R && seq_lens.size(0) == R,
              "one row per request");
  auto tables = block_tables.contiguous();
  auto lens = seq_lens.contiguous();
  const int64_t MB = tables.size(1);
  const int64_t* lp = lens.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r)
    INFLIGHT_CHECK(lp[r] >= 1 && lp[r] <= MB * lay.block_size, "request ", r, " has ", lp[r],
                " tokens: outside its block table");
  const float* sink_p = sink_logits(sinks, H);
  auto out = at::cpu::empty(q.sizes(), q.options());
  dispatch_query_and_cache(q.scalar_type(), k_cache.scalar_type(), "paged_decode", [&](auto q_tag,
                                                                                     auto c_tag) {
    using q_t = decltype(q_tag);
    using cache_t = decltype(c_tag);
    decode<q_t, cache_t>(q.data_ptr<q_t>(), static_cast<const cache_t*>(k_cache.data_ptr()),
                         static_cast<const cache_t*>(v_cache.data_ptr()), lay,
                         tables.data_ptr<int64_t>(), lp, out.data_ptr<q_t>(), R, H, MB,
                         static_cast<float>(scale), window, static_cast<float>(softcap), sink_p);
  });
  return out;
}
