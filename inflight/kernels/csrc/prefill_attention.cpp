// Paged prefill attention on the CPU: the query tokens of prompt chunks attend causally to
// every earlier token of their request, keys and values read in place from the paged cache
// (the chunk's own K/V are written there first), flash-style: 16 keys at a time with an online
// softmax, so nothing of size queries x keys is ever stored and the masked half of the causal
// square is skipped, not computed. fp32 math whatever the storage dtype.
//
//   q            [T, H, D]           rows may be strided (a view into the fused QKV output)
//   k/v_cache    kv_layout.h         the layer's paged cache, the chunks' tokens included
//   chunks       [C, 3] int64        (first flat row, query tokens, cached tokens before them)
//   block_tables [C, MB] int64       each chunk's blocks
//   out          [T, H, D]           written for the chunks' rows only
//
// Work items are (chunk, KV head, tile of 16 query tokens): the G query heads of one KV head
// share every key tile they read. With a soft cap c > 0 (Gemma 2's), each score s becomes
// c tanh(s / c) before the softmax; the AVX2 and generic items compute it (a capped layer never
// takes the AVX-512 item). With `sinks` (gpt-oss's, float32 [H]), each row's online softmax
// starts from its head's sink logit, as if a key of that score and a zero value came first:
// every item takes them. Items run longest first under dynamic scheduling (causal tiles late in
// a prompt read more keys).
#include "attention_avx2.h"
#include "kv_layout.h"
#include "kv_quant.h"
#include "ops.h"
#include "vec_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t KT = 16;  // keys per tile: one vector of 16 floats of scores per query row
constexpr int64_t QT = 16;  // query tokens per work item

struct Item {
  int64_t chunk, kv_head, first_token, num_tokens, cost;
};

// The first key an item whose first query is at `first_q` reads: the first of its window's
// tile, a multiple of KT. Every item then reads the same aligned tiles, slices of blocks, and a
// row's online softmax takes its keys in the same groups whatever chunk or item its query falls
// in (from the window's own first key, the groups would shift with the chunk's start, and a
// token's bits with its batch); the masks drop the keys before the window.
inline int64_t first_key_tile(int64_t first_q, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, first_q - window + 1) / KT * KT : 0;
}

struct Scratch {
  std::vector<float> q, acc, max, sum, kt, v;
  std::vector<int32_t> q_pairs;  // bf16 queries as pairs of dims, for vdpbf16ps scores
  std::vector<c10::BFloat16> key_pairs;  // an 8-bit cache's key tile as bf16 pairs of dims
  std::vector<c10::BFloat16> value_pairs;  // the value tile as bf16 pairs of positions
};

// exp(old_max - new_max): what a row's running sums are multiplied by as its online softmax
// moves to a higher max. A row's max stops rising after its first tiles, and then the factor is
// 1, which exp_poly(0) gives exactly: taken without the polynomial, whose chain of dependent
// scalar operations per row and tile, taken every time, costs a fifth of a long prompt's
// attention time (Zen 4).
inline float max_correction(float old_max, float new_max) {
  return new_max == old_max ? 1.f : exp_poly(old_max - new_max);
}

// Resets the scratch for an item of `rows` query rows (row r: token r / G, query head r % G),
// `padded` of them with rows past `rows` zero, and copies its queries in, scaled, as fp32. A
// row's softmax starts empty, or from its head's sink (a running max of the sink's logit and a
// denominator of its exp, 1).
template <typename scalar_t>
void start_item(const Item& it, const scalar_t* q, int64_t q_stride, int64_t G, int64_t D,
                float scale, const float* sinks, int64_t rows, int64_t padded, Scratch& s) {
  s.q.assign(padded * D, 0.f);
  s.acc.assign(padded * D, 0.f);
  s.max.assign(padded, -3.0e38f);  // below every score, and no inf - inf
  s.sum.assign(padded, 0.f);
  if (sinks) {
    for (int64_t r = 0; r < rows; ++r) {
      s.max[r] = sinks[it.kv_head * G + r % G];
      s.sum[r] = 1.f;
    }
  }
  s.kt.resize(D * KT);
  s.v.resize(KT * D);
  for (int64_t r = 0; r < rows; ++r) {
    const scalar_t* src = q + (it.first_token + r / G) * q_stride + (it.kv_head * G + r % G) * D;
    for (int64_t d = 0; d < D; ++d) s.q[r * D + d] = static_cast<float>(src[d]) * scale;
  }
}

// Keys k0 .. k0 + n - 1 of the item's head, gathered position by position into s.kt [D][KT]
// (transposed) and s.v [KT][D] as fp32 (an 8-bit cache's scales applied), zero past n: for
// tiles that are not one aligned slice of a block, or dtypes and shapes without a vector path
// (never a cache whose values are its keys: its blocks are whole tiles, `check_values_in_keys`).
template <typename cache_t>
void gather_tile(const Item& it, const cache_t* k_cache, const cache_t* v_cache,
                 const int64_t* table, const KVLayout& lay, int64_t D, int64_t k0, int64_t n,
                 Scratch& s) {
  const int64_t BS = lay.block_size;
  for (int64_t t = 0; t < KT; ++t) {
    if (t < n) {
      const int64_t pos = k0 + t;
      const int64_t run = lay.run(table[pos / BS], it.kv_head), offset = pos % BS;
      const float k_scale = lay.key_scale(k_cache + run, offset);
      const float v_scale = lay.value_scale(v_cache + run, offset);
      for (int64_t d = 0; d < D; ++d) {
        s.kt[d * KT + t] = widen(k_cache[run + lay.key_in_run(offset, d)]) * k_scale;
        s.v[t * D + d] = widen(v_cache[run + lay.value_in_run(offset) + d]) * v_scale;
      }
    } else {
      for (int64_t d = 0; d < D; ++d) s.kt[d * KT + t] = s.v[t * D + d] = 0.f;
    }
  }
}

// The item's outputs: each row's accumulator over its softmax denominator (> 0: every query
// sees at least its own key).
template <typename scalar_t>
void finish_item(const Item& it, scalar_t* out, int64_t out_stride, int64_t G, int64_t D,
                 int64_t rows, const Scratch& s) {
  for (int64_t r = 0; r < rows; ++r) {
    scalar_t* dst = out + (it.first_token + r / G) * out_stride + (it.kv_head * G + r % G) * D;
    const float inv = 1.f / s.sum[r];
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<scalar_t>(s.acc[r * D + d] * inv);
  }
}

// Wide heads the vector items do not take keep a run of each row's dims in registers across a
// tile's values (the same products added in the same order as one dim at a time through memory).
constexpr int64_t kGenericDims = 64;

template <typename q_t, typename cache_t, int kD>
void prefill_item(const Item& it, const q_t* q, int64_t q_stride, const cache_t* k_cache,
                  const cache_t* v_cache, const int64_t* table, const KVLayout& lay,
                  int64_t G, int64_t D_runtime, int64_t first_pos, float scale, int64_t window,
                  float softcap, const float* sinks, q_t* out, int64_t out_stride, Scratch& s) {
  const int64_t D = kD > 0 ? kD : D_runtime;
  const int64_t rows = it.num_tokens * G;
  start_item(it, q, q_stride, G, D, scale, sinks, rows, rows, s);
  const int64_t first_q = first_pos + it.first_token;  // positions of the item's query tokens
  const int64_t last_q = first_q + it.num_tokens - 1;
  const int64_t lo = first_key_tile(first_q, window);

  for (int64_t k0 = lo; k0 <= last_q; k0 += KT) {
    const int64_t n = std::min(KT, last_q + 1 - k0);
    gather_tile(it, k_cache, v_cache, table, lay, D, k0, n, s);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t qpos = first_q + r / G;
      if (k0 > qpos || (window > 0 && k0 + n - 1 <= qpos - window)) continue;  // all masked
      float score[KT] = {};
      const float* __restrict qr = s.q.data() + r * D;
      for (int64_t d = 0; d < D; ++d) {
        const float qd = qr[d];
        const float* __restrict kd = s.kt.data() + d * KT;
#pragma omp simd
        for (int64_t t = 0; t < KT; ++t) score[t] = std::fma(qd, kd[t], score[t]);
      }
      if (softcap > 0.f)
        for (int64_t t = 0; t < KT; ++t) score[t] = softcap * std::tanh(score[t] / softcap);
      float tile_max = -std::numeric_limits<float>::infinity();
      bool valid[KT];
      for (int64_t t = 0; t < KT; ++t) {
        const int64_t kpos = k0 + t;
        valid[t] = t < n && kpos <= qpos && (window <= 0 || kpos > qpos - window);
        if (valid[t]) tile_max = std::max(tile_max, score[t]);
      }
      const float new_max = std::max(s.max[r], tile_max);
      const float correction = max_correction(s.max[r], new_max);  // ~0 on the first tile: acc is 0
      float p[KT], p_sum = 0.f;
#pragma omp simd reduction(+ : p_sum)
      for (int64_t t = 0; t < KT; ++t) {
        p[t] = valid[t] ? exp_poly(score[t] - new_max) : 0.f;
        p_sum += p[t];
      }
      s.max[r] = new_max;
      s.sum[r] = s.sum[r] * correction + p_sum;
      float* __restrict acc = s.acc.data() + r * D;
      if (D % kGenericDims == 0) {  // a run of dims held in registers over the tile's keys
        for (int64_t d0 = 0; d0 < D; d0 += kGenericDims) {
          float a[kGenericDims];
#pragma omp simd
          for (int64_t j = 0; j < kGenericDims; ++j) a[j] = acc[d0 + j] * correction;
          for (int64_t t = 0; t < n; ++t) {
            const float pt = p[t];
            const float* __restrict vt = s.v.data() + t * D + d0;
#pragma omp simd
            for (int64_t j = 0; j < kGenericDims; ++j) a[j] = std::fma(pt, vt[j], a[j]);
          }
          for (int64_t j = 0; j < kGenericDims; ++j) acc[d0 + j] = a[j];
        }
        continue;
      }
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[d] *= correction;
      for (int64_t t = 0; t < n; ++t) {
        const float pt = p[t];
        const float* __restrict vt = s.v.data() + t * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) acc[d] = std::fma(pt, vt[d], acc[d]);
      }
    }
  }
  finish_item(it, out, out_stride, G, D, rows, s);
}

#ifdef __AVX512F__
// The AVX-512 item: RB query rows at a time keep their 16 scores and their whole accumulator in
// registers (DV vectors of 16 floats per head: DV = 4 for head_dim 64), so each transposed key
// row and each value row loaded serves RB rows, and nothing round-trips through memory per key.
// With bf16 and AVX-512 BF16, a tile of 16 keys that is one aligned slice of a block is scored
// in place: each 64-byte row of the block's keys holds a pair of dims for those 16 positions,
// so a `vdpbf16ps` with a broadcast query pair adds both dims' products to 16 scores at once
// (the decode kernel's scheme), and no fp32 copy of the keys is made. An 8-bit cache's tile
// (bf16 queries, AVX-512 BF16) is first widened into the same pairs of bf16 (exactly: every
// int8 and e4m3 value is a bf16 one), its key scales multiplying the scores and its value
// scales the widened values.
template <typename scalar_t, typename cache_t, int DV, int RB>
void prefill_item_avx512(const Item& it, const scalar_t* q, int64_t q_stride,
                         const cache_t* k_cache, const cache_t* v_cache, const int64_t* table,
                         const KVLayout& lay, int64_t G, int64_t first_pos, float scale,
                         int64_t window, const float* sinks, scalar_t* out, int64_t out_stride,
                         Scratch& s) {
  using bf16 = c10::BFloat16;
  constexpr bool kScaled = kScaledCache<cache_t>;
  constexpr int64_t D = DV * 16;
  const int64_t rows = it.num_tokens * G;
  const int64_t padded = (rows + RB - 1) / RB * RB;  // rows past `rows` are never stored
  const int64_t BS = lay.block_size;
  start_item(it, q, q_stride, G, D, scale, sinks, rows, padded, s);
#ifdef __AVX512BF16__
  constexpr bool kPairScores = std::is_same_v<scalar_t, c10::BFloat16>;
  if constexpr (kPairScores) {  // padded rows repeat the last real one (never stored)
    s.q_pairs.resize(padded * D / 2);
    for (int64_t r = 0; r < padded; ++r) {
      const int64_t src_r = std::min(r, rows - 1);
      const scalar_t* src =
          q + (it.first_token + src_r / G) * q_stride + (it.kv_head * G + src_r % G) * D;
      std::memcpy(s.q_pairs.data() + r * D / 2, src, D * sizeof(scalar_t));
    }
  }
#else
  constexpr bool kPairScores = false;
#endif
  static_assert(kPairScores || !kScaled, "an 8-bit cache's keys are scored as bf16 pairs");
  if constexpr (kScaled) s.key_pairs.resize(D * KT);
  const int64_t first_q = first_pos + it.first_token;
  const int64_t last_q = first_q + it.num_tokens - 1;
  const int64_t lo = first_key_tile(first_q, window);
  alignas(64) float p[RB][KT];
  // With bf16 queries the probabilities times the values go through vdpbf16ps too: each
  // row's probabilities rounded to bf16 (as a bf16 sdpa rounds them) in pairs of positions,
  // against the tile's values as bf16 pairs [KT / 2][D][2], two products an instruction.
  alignas(64) c10::BFloat16 p_bf16[RB][KT];
  constexpr bool kPairValues = kPairScores;
  if constexpr (kPairValues) s.value_pairs.resize(KT * D);

  for (int64_t k0 = lo; k0 <= last_q; k0 += KT) {
    const int64_t n = std::min(KT, last_q + 1 - k0);
    // K transposed [D][KT] and V [KT][D], zero past n (or, for keys read a block row at a time,
    // whatever the cache holds there: those lanes are masked out of every score)
    const int64_t k0_offset = k0 % BS;
    const bool whole_rows = (std::is_same_v<cache_t, bf16> || kScaled) && BS % KT == 0 &&
                            k0_offset % KT == 0;
    // the tile's keys: row i = dims (2i, 2i+1) of its 16 positions, 64 bytes of bf16, in place
    // (`key_stride` elements apart) or, from an 8-bit cache, widened into `key_pairs`
    const bf16* key_rows = nullptr;
    int64_t key_stride = BS * 2;
    __m512 key_scale = _mm512_set1_ps(1.f);
    if (whole_rows) {
      const cache_t* run = k_cache + lay.run(table[k0 / BS], it.kv_head);
      if constexpr (kScaled) {
#ifdef __AVX512BF16__
        for (int64_t i = 0; i < D / 2; ++i) {
          const cache_t* row = run + i * BS * 2 + k0_offset * 2;
          const __m512bh pairs = _mm512_cvtne2ps_pbh(load16(row + 16), load16(row));
          _mm512_storeu_si512(s.key_pairs.data() + i * KT * 2, (__m512i)pairs);
        }
        key_rows = s.key_pairs.data();
        key_stride = KT * 2;
        key_scale = _mm512_loadu_ps(lay.key_scales(run) + k0_offset);
#endif
      } else if constexpr (std::is_same_v<cache_t, bf16>) {
        key_rows = run + k0_offset * 2;
      }
    }
    const bool pair_scores = kPairScores && whole_rows;
    if (whole_rows && !pair_scores) {  // widened into the fp32 tile
      const __m512i high = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
      for (int64_t i = 0; i < D / 2; ++i) {
        const __m512i pairs = _mm512_loadu_si512(key_rows + i * key_stride);
        _mm512_storeu_si512(s.kt.data() + 2 * i * KT, _mm512_slli_epi32(pairs, 16));
        _mm512_storeu_si512(s.kt.data() + (2 * i + 1) * KT, _mm512_and_si512(pairs, high));
      }
    }
    for (int64_t t = 0; t < KT; ++t) {
      if (t < n) {
        const int64_t pos = k0 + t;
        const int64_t run = lay.run(table[pos / BS], it.kv_head), offset = pos % BS;
        const cache_t* v = v_cache + run + lay.value_in_run(offset);
        const __m512 v_scale = _mm512_set1_ps(lay.value_scale(v_cache + run, offset));
        for (int j = 0; j < DV; ++j) {
          const __m512 vj = load16(v + j * 16);
          _mm512_storeu_ps(s.v.data() + t * D + j * 16, kScaled ? _mm512_mul_ps(vj, v_scale) : vj);
        }
        if (!whole_rows) {
          const float k_scale = lay.key_scale(k_cache + run, offset);
          for (int64_t d = 0; d < D; ++d)
            s.kt[d * KT + t] = widen(k_cache[run + lay.key_in_run(offset, d)]) * k_scale;
        }
      } else {
        for (int64_t d = 0; d < D; ++d) s.kt[d * KT + t] = s.v[t * D + d] = 0.f;
      }
    }
#ifdef __AVX512BF16__
    if constexpr (kPairValues) {  // positions t and t + 1 of dims 16j.. interleaved
      const __m512i interleave = _mm512_set_epi16(
          31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
          23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);  // fmt: skip
      for (int64_t t = 0; t < n; t += 2)
        for (int j = 0; j < DV; ++j) {
          const float* v = s.v.data() + t * D + j * 16;  // and the next position's at + D
          const __m512bh two = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(v + D), _mm512_loadu_ps(v));
          _mm512_storeu_si512(s.value_pairs.data() + (t * D + j * 32),
                              _mm512_permutexvar_epi16(interleave, (__m512i)two));
        }
    }
#endif
    for (int64_t r0 = 0; r0 < padded; r0 += RB) {
      // keys k0 .. k0+n-1 that each row may see: a contiguous run of lanes
      __mmask16 mask[RB];
      bool any = false;
      for (int b = 0; b < RB; ++b) {
        const int64_t qpos = first_q + std::min(r0 + b, rows - 1) / G;
        const int64_t hi = std::min<int64_t>(n - 1, qpos - k0);  // causal
        const int64_t from = window > 0 ? std::max<int64_t>(0, qpos - window + 1 - k0) : 0;
        mask[b] = hi < from ? 0 : static_cast<__mmask16>(((2u << hi) - 1) & ~((1u << from) - 1));
        any |= mask[b] != 0;
      }
      if (!any) continue;
      __m512 score[RB];
      for (int b = 0; b < RB; ++b) score[b] = _mm512_setzero_ps();
#ifdef __AVX512BF16__
      if (pair_scores) {  // two chains per row: even and odd pairs of dims
        __m512 odd[RB];
        for (int b = 0; b < RB; ++b) odd[b] = _mm512_setzero_ps();
        const int32_t* qp = s.q_pairs.data() + r0 * D / 2;
        for (int64_t i = 0; i < D / 2; i += 2) {
          const auto k_even = (__m512bh)_mm512_loadu_si512(key_rows + i * key_stride);
          const auto k_odd = (__m512bh)_mm512_loadu_si512(key_rows + (i + 1) * key_stride);
          for (int b = 0; b < RB; ++b) {
            score[b] = _mm512_dpbf16_ps(
                score[b], (__m512bh)_mm512_set1_epi32(qp[b * D / 2 + i]), k_even);
            odd[b] = _mm512_dpbf16_ps(
                odd[b], (__m512bh)_mm512_set1_epi32(qp[b * D / 2 + i + 1]), k_odd);
          }
        }
        for (int b = 0; b < RB; ++b)
          score[b] = _mm512_mul_ps(
              _mm512_mul_ps(_mm512_add_ps(score[b], odd[b]), _mm512_set1_ps(scale)), key_scale);
      } else
#endif
      {
        const float* qr = s.q.data() + r0 * D;
        for (int64_t d = 0; d < D; ++d) {
          const __m512 kd = _mm512_loadu_ps(s.kt.data() + d * KT);
          for (int b = 0; b < RB; ++b)
            score[b] = _mm512_fmadd_ps(_mm512_set1_ps(qr[b * D + d]), kd, score[b]);
        }
      }
      __m512 acc[RB][DV];
      for (int b = 0; b < RB; ++b) {
        const int64_t r = r0 + b;
        const float tile_max =
            mask[b] ? _mm512_mask_reduce_max_ps(mask[b], score[b]) : s.max[r];
        const float new_max = std::max(s.max[r], tile_max);
        const float correction = max_correction(s.max[r], new_max);
        const __m512 pv =
            _mm512_maskz_mov_ps(mask[b], exp512(_mm512_sub_ps(score[b], _mm512_set1_ps(new_max))));
        if constexpr (kPairValues) {
#ifdef __AVX512BF16__
          const __m256i rounded = (__m256i)_mm512_cvtneps_pbh(pv);
          _mm256_store_si256(reinterpret_cast<__m256i*>(p_bf16[b]), rounded);
#endif
        } else {
          _mm512_store_ps(p[b], pv);
        }
        s.max[r] = new_max;
        s.sum[r] = s.sum[r] * correction + _mm512_reduce_add_ps(pv);
        for (int j = 0; j < DV; ++j)
          acc[b][j] = _mm512_mul_ps(_mm512_loadu_ps(s.acc.data() + r * D + j * 16),
                                    _mm512_set1_ps(correction));
      }
      if constexpr (kPairValues) {
#ifdef __AVX512BF16__
        for (int64_t t = 0; t < n; t += 2) {  // past n: zero probabilities and values
          __m512bh vt[DV];
          for (int j = 0; j < DV; ++j)
            vt[j] = (__m512bh)_mm512_loadu_si512(s.value_pairs.data() + (t * D + j * 32));
          for (int b = 0; b < RB; ++b) {
            int32_t pair;
            std::memcpy(&pair, &p_bf16[b][t], sizeof pair);
            const auto pt = (__m512bh)_mm512_set1_epi32(pair);
            for (int j = 0; j < DV; ++j) acc[b][j] = _mm512_dpbf16_ps(acc[b][j], pt, vt[j]);
          }
        }
#endif
      } else {
        for (int64_t t = 0; t < n; ++t) {
          __m512 vt[DV];
          for (int j = 0; j < DV; ++j) vt[j] = _mm512_loadu_ps(s.v.data() + t * D + j * 16);
          for (int b = 0; b < RB; ++b) {
            const __m512 pt = _mm512_set1_ps(p[b][t]);
            for (int j = 0; j < DV; ++j) acc[b][j] = _mm512_fmadd_ps(pt, vt[j], acc[b][j]);
          }
        }
      }
      for (int b = 0; b < RB; ++b)
        for (int j = 0; j < DV; ++j)
          _mm512_storeu_ps(s.acc.data() + (r0 + b) * D + j * 16, acc[b][j]);
    }
  }
  finish_item(it, out, out_stride, G, D, rows, s);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// The AVX2 item: the AVX-512 one's plan in 8-float vectors (`attention_avx2.h`). Scores of RB
// rows build up in registers; values are weighted into two rows at a time. A tile of 16 keys
// that is one aligned slice of a block is read in place: its keys split into even and odd dims
// by shuffles, its values used where they lie (an 8-bit cache's key scales multiply the scores,
// its value scales the probabilities). On AVX-512 machines it serves the caches the AVX-512
// item does not read (another dtype than the queries': bf16 under float32 queries, 8-bit under
// float32 ones or without AVX-512 BF16), and heads of 256.
template <typename q_t, typename cache_t, int DV, int RB>
void prefill_item_avx2(const Item& it, const q_t* q, int64_t q_stride, const cache_t* k_cache,
                       const cache_t* v_cache, const int64_t* table, const KVLayout& lay,
                       int64_t G, int64_t first_pos, float scale, int64_t window,
                       float softcap, const float* sinks, q_t* out, int64_t out_stride,
                       Scratch& s) {
  static_assert(DV % 4 == 0 && RB % 2 == 0, "values go 2 rows x 4 vectors at a time");
  constexpr int64_t kD = DV * 8;  // 0: the head's dims, known at run time
  const int64_t D = kD > 0 ? kD : lay.head_dim;
  const int64_t rows = it.num_tokens * G;
  const int64_t padded = (rows + RB - 1) / RB * RB;  // rows past `rows` are never stored
  const int64_t BS = lay.block_size;
  start_item(it, q, q_stride, G, D, scale, sinks, rows, padded, s);
  const int64_t first_q = first_pos + it.first_token;
  const int64_t last_q = first_q + it.num_tokens - 1;
  const int64_t lo = first_key_tile(first_q, window);
  const __m256i lanes_lo = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i lanes_hi = _mm256_add_epi32(lanes_lo, _mm256_set1_epi32(8));
  alignas(32) float p[RB][KT];

  for (int64_t k0 = lo; k0 <= last_q; k0 += KT) {
    const int64_t n = std::min(KT, last_q + 1 - k0);
    const int64_t k0_offset = k0 % BS;
    // K transposed [D][KT], and V [KT][D] in place or copied. Lanes past n hold zeros, or for
    // a tile read in place whatever the block holds there: they are masked out of every score.
    const cache_t* values_in_place = nullptr;
    __m256 key_scale[2] = {_mm256_set1_ps(1.f), _mm256_set1_ps(1.f)};
    __m256 value_scale[2] = {key_scale[0], key_scale[0]};
    if (BS % KT == 0 && k0_offset % KT == 0) {
      const int64_t run = lay.run(table[k0 / BS], it.kv_head);
      attention_avx2::key_tile(k_cache + run + k0_offset * 2, BS, D, s.kt.data());
      if (lay.values_in_keys)
        attention_avx2::value_tile(k_cache + run + k0_offset * 2, BS, D, s.v.data());
      else
        values_in_place = v_cache + run + lay.value_in_run(k0_offset);
      if constexpr (kScaledCache<cache_t>) {
        alignas(32) float vs[KT];
        for (int64_t t = 0; t < KT; ++t) vs[t] = lay.value_scale(v_cache + run, k0_offset + t);
        const float* ks = lay.key_scales(k_cache + run) + k0_offset;
        key_scale[0] = _mm256_loadu_ps(ks);
        key_scale[1] = _mm256_loadu_ps(ks + 8);
        value_scale[0] = _mm256_load_ps(vs);
        value_scale[1] = _mm256_load_ps(vs + 8);
      }
    } else {
      gather_tile(it, k_cache, v_cache, table, lay, D, k0, n, s);
    }
    for (int64_t r0 = 0; r0 < padded; r0 += RB) {
      // keys k0 + from .. k0 + hi that each row may see, as lane masks
      __m256 mask[RB][2];
      bool any = false;
      for (int b = 0; b < RB; ++b) {
        const int64_t qpos = first_q + std::min(r0 + b, rows - 1) / G;
        const int64_t hi = std::min<int64_t>(n - 1, qpos - k0);  // causal
        // at most KT (no lane) before the 32-bit compare, however long the context
        const int64_t from =
            window > 0 ? std::clamp<int64_t>(qpos - window + 1 - k0, 0, KT) : 0;
        const __m256i above = _mm256_set1_epi32(static_cast<int32_t>(from - 1));
        const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(hi + 1));
        mask[b][0] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(lanes_lo, above),
                                                          _mm256_cmpgt_epi32(below, lanes_lo)));
        mask[b][1] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(lanes_hi, above),
                                                          _mm256_cmpgt_epi32(below, lanes_hi)));
        any |= hi >= from;
      }
      if (!any) continue;
      __m256 score[RB][2];
      attention_avx2::scores<kD, RB>(s.q.data() + r0 * D, s.kt.data(), score, D);
      if constexpr (kScaledCache<cache_t>)
        for (int b = 0; b < RB; ++b)
          for (int h = 0; h < 2; ++h) score[b][h] = _mm256_mul_ps(score[b][h], key_scale[h]);
      if (softcap > 0.f)
        for (int b = 0; b < RB; ++b)
          for (int h = 0; h < 2; ++h) score[b][h] = soft_cap(score[b][h], softcap);
      float correction[RB];
      for (int b = 0; b < RB; ++b) {
        const int64_t r = r0 + b;
        const __m256 floor = _mm256_set1_ps(-3.0e38f);  // below every score
        const float tile_max =
            lane_max8(_mm256_max_ps(_mm256_blendv_ps(floor, score[b][0], mask[b][0]),
                                     _mm256_blendv_ps(floor, score[b][1], mask[b][1])));
        const float new_max = std::max(s.max[r], tile_max);
        correction[b] = max_correction(s.max[r], new_max);
        const __m256 m = _mm256_set1_ps(new_max);
        const __m256 p_lo = _mm256_and_ps(mask[b][0], exp256(_mm256_sub_ps(score[b][0], m)));
        const __m256 p_hi = _mm256_and_ps(mask[b][1], exp256(_mm256_sub_ps(score[b][1], m)));
        s.max[r] = new_max;
        s.sum[r] = s.sum[r] * correction[b] + lane_sum8(_mm256_add_ps(p_lo, p_hi));
        _mm256_store_ps(p[b], _mm256_mul_ps(p_lo, value_scale[0]));  // weights of stored values
        _mm256_store_ps(p[b] + 8, _mm256_mul_ps(p_hi, value_scale[1]));
      }
      for (int b = 0; b < RB; b += 2) {
        const float* const rows_p[2] = {p[b], p[b + 1]};
        const float keep[2] = {correction[b], correction[b + 1]};
        float* const rows_acc[2] = {s.acc.data() + (r0 + b) * D, s.acc.data() + (r0 + b + 1) * D};
        if (values_in_place)
          attention_avx2::add_values<kD, 2>(rows_p, keep, values_in_place, lay.value_row(), n,
                                            rows_acc, nullptr, D);
        else
          attention_avx2::add_values<kD, 2>(rows_p, keep, s.v.data(), D, n, rows_acc, nullptr, D);
      }
    }
  }
  finish_item(it, out, out_stride, G, D, rows, s);
}
#endif

#ifdef __AVX512F__
// Whether the AVX-512 item takes these queries and cache: the queries' own dtype (float32 or
// bf16), or an 8-bit cache under bf16 queries where AVX-512 BF16 scores its keys as pairs.
template <typename q_t, typename cache_t>
constexpr bool avx512_item() {
  if constexpr (std::is_same_v<q_t, cache_t>)
    return std::is_same_v<q_t, float> || std::is_same_v<q_t, c10::BFloat16>;
#ifdef __AVX512BF16__
  return std::is_same_v<q_t, c10::BFloat16> && kScaledCache<cache_t>;
#else
  return false;
#endif
}
#endif

template <typename q_t, typename cache_t, int kD>
void prefill(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
             const int64_t* chunks, int64_t C, const int64_t* tables, int64_t MB,
             at::Tensor& out, float scale, int64_t window, float softcap, const float* sinks) {
  const KVLayout lay = kv_layout(k_cache, v_cache);
  const int64_t H = q.size(1), D = q.size(2), KVH = lay.kv_heads;
  const int64_t G = H / KVH;
  std::vector<Item> items;
  for (int64_t c = 0; c < C; ++c) {
    const int64_t num_q = chunks[c * 3 + 1], cached = chunks[c * 3 + 2];
    for (int64_t i0 = 0; i0 < num_q; i0 += QT)
      for (int64_t h = 0; h < KVH; ++h) {
        const int64_t n = std::min(QT, num_q - i0), keys = cached + i0 + n;
        items.push_back({c, h, i0, n, n * (window > 0 ? std::min(keys, window) : keys)});
      }
  }
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.cost > b.cost; });
  const q_t* qp = q.data_ptr<q_t>();
  const auto* kp = static_cast<const cache_t*>(k_cache.data_ptr());
  const auto* vp = static_cast<const cache_t*>(v_cache.data_ptr());
  q_t* op = out.data_ptr<q_t>();
  const int64_t num_items = static_cast<int64_t>(items.size());
#pragma omp parallel
  {
    Scratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < num_items; ++w) {
      const Item& it = items[w];
      const int64_t first_row = chunks[it.chunk * 3];
      const q_t* q_rows = qp + first_row * q.stride(0);
      q_t* out_rows = op + first_row * out.stride(0);
      const int64_t* table = tables + it.chunk * MB;
      const int64_t cached = chunks[it.chunk * 3 + 2];
      // (the AVX-512 item takes no soft cap, and reads values where they are their own)
      const bool fast = softcap <= 0.f && !lay.values_in_keys;
#ifdef __AVX512F__
      if constexpr ((kD == 64 || kD == 128) && avx512_item<q_t, cache_t>()) {
        if (fast) {
          constexpr int DV = kD / 16, RB = kD == 64 ? 4 : 2;  // RB rows x DV vectors in registers
          prefill_item_avx512<q_t, cache_t, DV, RB>(it, q_rows, q.stride(0), kp, vp, table, lay,
                                                    G, cached, scale, window, sinks, out_rows,
                                                    out.stride(0), scratch);
          continue;
        }
      }
#endif
#if defined(__AVX2__) && defined(__FMA__)
      if constexpr (!std::is_same_v<q_t, c10::Half>) {  // (kD = 0: any multiple of 32 dims)
        if (kD > 0 || D % 32 == 0) {
          prefill_item_avx2<q_t, cache_t, kD / 8, 4>(it, q_rows, q.stride(0), kp, vp, table,
                                                     lay, G, cached, scale, window, softcap,
                                                     sinks, out_rows, out.stride(0), scratch);
          continue;
        }
      }
#endif
      prefill_item<q_t, cache_t, kD>(it, q_rows, q.stride(0), kp, vp, table, lay, G, D, cached,
                                     scale, window, softcap, sinks, out_rows, out.stride(0),
                                     scratch);
    }
  }
}

}  // namespace

at::Tensor paged_prefill_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                      const at::Tensor& v_cache, const at::Tensor& chunks,
                                      const at::Tensor& block_tables, at::Tensor& out,
                                      double scale, int64_t window, double softcap,
                                      const c10::optional<at::Tensor>& sinks) {
  INFLIGHT_CHECK(q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2),
              "q must be [T, H, D] with contiguous heads (rows may be strided)");
  const KVLayout lay = kv_layout(k_cache, v_cache);
  INFLIGHT_CHECK(out.sizes() == q.sizes() && out.is_contiguous(), "out must be contiguous like q");
  INFLIGHT_CHECK(q.scalar_type() == out.scalar_type(), "q and out must share a dtype");
  INFLIGHT_CHECK(chunks.dim() == 2 && chunks.size(1) == 3 && chunks.scalar_type() == at::kLong &&
                  block_tables.dim() == 2 && block_tables.scalar_type() == at::kLong &&
                  block_tables.size(0) == chunks.size(0),
              "chunks [C, 3] and block_tables [C, MB] must be int64, one row per chunk");
  INFLIGHT_CHECK(lay.head_dim == q.size(2) && q.size(1) % lay.kv_heads == 0,
              "head sizes do not match");
  check_values_in_keys(lay, k_cache.scalar_type());
  auto c = chunks.contiguous();
  auto tables = block_tables.contiguous();
  const int64_t C = c.size(0), T = q.size(0), MB = tables.size(1);
  const int64_t* cp = c.data_ptr<int64_t>();
  for (int64_t i = 0; i < C; ++i)
    INFLIGHT_CHECK(cp[i * 3] >= 0 && cp[i * 3 + 1] >= 1 && cp[i * 3] + cp[i * 3 + 1] <= T &&
                    cp[i * 3 + 2] >= 0 &&
                    cp[i * 3 + 2] + cp[i * 3 + 1] <= MB * lay.block_size,
                "chunk ", i, " lies outside the query rows or its block table");
  const float* sink_p = sink_logits(sinks, q.size(1));
  dispatch_query_and_cache(q.scalar_type(), k_cache.scalar_type(), "paged_prefill",
                           [&](auto q_tag, auto c_tag) {
    using q_t = decltype(q_tag);
    using cache_t = decltype(c_tag);
    const float s = static_cast<float>(scale), cap = static_cast<float>(softcap);
    const int64_t* tp = tables.data_ptr<int64_t>();
    if (q.size(2) == 64)
      prefill<q_t, cache_t, 64>(q, k_cache, v_cache, cp, C, tp, MB, out, s, window, cap,
                                 sink_p);
    else if (q.size(2) == 128)
      prefill<q_t, cache_t, 128>(q, k_cache, v_cache, cp, C, tp, MB, out, s, window, cap,
                                 sink_p);
    else if (q.size(2) == 256)
      prefill<q_t, cache_t, 256>(q, k_cache, v_cache, cp, C, tp, MB, out, s, window, cap,
                                  sink_p);
    else
      prefill<q_t, cache_t, 0>(q, k_cache, v_cache, cp, C, tp, MB, out, s, window, cap,
                                 sink_p);
  });
  return out;
}
