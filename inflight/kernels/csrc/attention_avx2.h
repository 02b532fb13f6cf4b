// AVX2 building blocks shared by the decode and prefill attention kernels, in 8-float vectors
// and 16 registers: a tile of 16 keys read out of the cache's pairs-of-dims layout
// (`kv_layout.h`), the scores of a few query rows against it, and the values weighted into a
// few rows' accumulators.
#pragma once
#if defined(__AVX2__) && defined(__FMA__)
#include "kv_quant.h"
#include "vec_math.h"

#include <cstdint>

namespace attention_avx2 {

constexpr int64_t kTile = 16;  // keys per tile: two vectors of scores per query row

// A line of a KV run read soon, fetched into L2, not L1: a fetch into L1 holds one of the
// core's few L1 miss buffers until the line arrives, and with a run's lines fetched a few runs
// ahead those buffers were full, stalling the prefetches themselves; L2 tracks many more misses.
// Decode attention over caches read from memory (30 layers, SmolLM2's heads, Zen 4): 8 requests
// of 4,000 positions in bf16 1.2-1.45x faster, float32 1.4-1.5x, 64 of 400 1.4-1.6x; in L2 level.
inline void fetch_run_line(const char* line) { _mm_prefetch(line, _MM_HINT_T1); }

// Keys of 16 consecutive positions of one block, from `key_rows` (row i: dims 2i and 2i+1 of
// the block's BS positions, the first of the 16 at column 0) into `kt` [D][16] fp32; the same
// bytes of another run, `ahead`, prefetched row by row where given.
template <typename scalar_t>
inline void key_tile(const scalar_t* key_rows, int64_t BS, int64_t D, float* kt,
                     const char* ahead = nullptr) {
  for (int64_t i = 0; i < D / 2; ++i) {
    if (ahead != nullptr)
      for (int64_t line = 0; line < 32 * int64_t(sizeof(scalar_t)); line += 64)
        fetch_run_line(ahead + i * BS * 2 * int64_t(sizeof(scalar_t)) + line);
    for (int64_t half = 0; half < 2; ++half) {  // positions 8 * half .. 8 * half + 7
      const scalar_t* row = key_rows + i * BS * 2 + half * 16;
      const __m256 a = load8(row), b = load8(row + 8);  // (d0, d1) of 4 positions each
      // shuffle_ps leaves 128-bit lanes in the order [0 1 4 5 | 2 3 6 7]; the permute fixes it
      const __m256 even = _mm256_castpd_ps(
          _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
      const __m256 odd = _mm256_castpd_ps(
          _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
      _mm256_storeu_ps(kt + 2 * i * kTile + half * 8, even);
      _mm256_storeu_ps(kt + (2 * i + 1) * kTile + half * 8, odd);
    }
  }
}

// Values of 16 consecutive positions of a block whose values are its keys (`kv_layout.h`), from
// `key_rows` as `key_tile` reads them into `vt` [16][D] fp32 (D a multiple of 8): pair row i
// holds dims 2i and 2i+1 of each position, so a position's value row is its column of pairs,
// moved four pair rows by four positions at a time as a 4 x 4 transpose of 64-bit pairs; the
// same bytes of another run, `ahead`, prefetched row by row where given.
template <typename scalar_t>
inline void value_tile(const scalar_t* key_rows, int64_t BS, int64_t D, float* vt,
                       const char* ahead = nullptr) {
  for (int64_t i = 0; i < D / 2; i += 4) {
    if (ahead != nullptr)
      for (int64_t j = i; j < i + 4; ++j)
        for (int64_t line = 0; line < 32 * int64_t(sizeof(scalar_t)); line += 64)
          fetch_run_line(ahead + j * BS * 2 * int64_t(sizeof(scalar_t)) + line);
    for (int64_t t = 0; t < kTile; t += 4) {
      __m256d r[4];  // pair rows i..i+3 at positions t..t+3
      for (int j = 0; j < 4; ++j)
        r[j] = _mm256_castps_pd(load8(key_rows + (i + j) * BS * 2 + t * 2));
      const __m256d lo01 = _mm256_unpacklo_pd(r[0], r[1]), hi01 = _mm256_unpackhi_pd(r[0], r[1]);
      const __m256d lo23 = _mm256_unpacklo_pd(r[2], r[3]), hi23 = _mm256_unpackhi_pd(r[2], r[3]);
      const __m256d rows[4] = {_mm256_permute2f128_pd(lo01, lo23, 0x20),
                               _mm256_permute2f128_pd(hi01, hi23, 0x20),
                               _mm256_permute2f128_pd(lo01, lo23, 0x31),
                               _mm256_permute2f128_pd(hi01, hi23, 0x31)};
      for (int j = 0; j < 4; ++j)
        _mm256_storeu_ps(vt + (t + j) * D + 2 * i, _mm256_castpd_ps(rows[j]));
    }
  }
}

// Scores of RB query rows (`q` [RB][D], scaled) against a key tile (`kt` [D][16]); D = 0: the
// head's `dims`, known at run time (wide heads: DeepSeek's 576). Not inlined: inlined into its
// callers, GCC kept the accumulators on the stack, a store per multiply-add.
template <int64_t D, int RB>
__attribute__((noinline)) void scores(const float* __restrict q, const float* __restrict kt,
                                      __m256 (&out)[RB][2], int64_t dims = D) {
  const int64_t n = D > 0 ? D : dims;
  __m256 acc[RB][2];
  for (int b = 0; b < RB; ++b) acc[b][0] = acc[b][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < n; ++d) {
    const __m256 k_lo = _mm256_loadu_ps(kt + d * kTile);
    const __m256 k_hi = _mm256_loadu_ps(kt + d * kTile + 8);
    for (int b = 0; b < RB; ++b) {
      const __m256 qd = _mm256_broadcast_ss(q + b * n + d);
      acc[b][0] = _mm256_fmadd_ps(qd, k_lo, acc[b][0]);
      acc[b][1] = _mm256_fmadd_ps(qd, k_hi, acc[b][1]);
    }
  }
  for (int b = 0; b < RB; ++b) out[b][0] = acc[b][0], out[b][1] = acc[b][1];
}

// acc[r] = acc[r] * keep[r] + sum over t < n of p[r][t] * v[t], for NR (1 to 6) rows; `v` is n
// rows of D values, `row` elements apart (the same bytes from `ahead` prefetched where given).
// 32 dims at a time for up to 2 rows (4 value vectors serve both rows' 8 accumulators), 16 for
// more, so that every row shares each value widened once. Each sum runs over t in order, so
// the result never depends on NR. D = 0: `dims` (a multiple of 32), known at run time. Not
// inlined, for the same reason.
template <int64_t D, int NR, typename value_t>
__attribute__((noinline)) void add_values(const float* const (&p)[NR], const float (&keep)[NR],
                                          const value_t* v, int64_t row, int64_t n,
                                          float* const (&acc)[NR],
                                          const char* ahead = nullptr, int64_t dims = D) {
  static_assert(D % 32 == 0 && NR >= 1 && NR <= 6, "passes of 32 or 16 dims, 16 registers");
  constexpr int kVecs = NR <= 2 ? 4 : 2;  // 8-dim vectors a pass: 2 NR + kVecs + 1 registers
  constexpr int64_t kBytes = 8 * kVecs * int64_t(sizeof(value_t));  // of a row's pass
  for (int64_t j0 = 0; j0 < (D > 0 ? D : dims); j0 += 8 * kVecs) {
    __m256 a[NR][kVecs];
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < kVecs; ++j)
        a[r][j] = _mm256_mul_ps(_mm256_loadu_ps(acc[r] + j0 + j * 8), _mm256_set1_ps(keep[r]));
    for (int64_t t = 0; t < n; ++t) {
      if (ahead != nullptr)
        for (int64_t line = 0; line < kBytes; line += 64)
          fetch_run_line(ahead + (t * row + j0) * int64_t(sizeof(value_t)) + line);
      __m256 vt[kVecs];
      for (int j = 0; j < kVecs; ++j) vt[j] = load8(v + t * row + j0 + j * 8);
      for (int r = 0; r < NR; ++r) {
        const __m256 pt = _mm256_broadcast_ss(p[r] + t);
        for (int j = 0; j < kVecs; ++j) a[r][j] = _mm256_fmadd_ps(pt, vt[j], a[r][j]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < kVecs; ++j) _mm256_storeu_ps(acc[r] + j0 + j * 8, a[r][j]);
  }
}

}  // namespace attention_avx2
#endif
