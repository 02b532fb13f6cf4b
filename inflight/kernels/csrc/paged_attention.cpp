// Paged decode attention on the CPU: one query token per request, keys and values read in place
// from the paged KV cache through the block table (no gathered copy), GQA without repeating
// K/V, fp32 math whatever the storage dtype. Parallel over (request, KV head) pairs.
//
//   q            [R, H, D]            one query per request
//   k/v_cache    [NB, BS, KVH, D]     the layer's paged cache
//   block_tables [R, MB] int64        blocks of each request, padded
//   seq_lens     [R] int64            tokens in the cache per request (the query's own included)
//   out          [R, H, D]            softmax(q k^T * scale) v over positions [first, seq_len)
//
// with first = seq_len - window when a sliding window is set (window > 0), else 0.
#include "vec_math.h"
#include "ops.h"

#include <ATen/Parallel.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace {

inline float max_of(const float* __restrict x, int64_t n) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// scores[i] = exp(scores[i] - max), in place; returns their sum (the softmax denominator).
inline float exp_and_sum(float* __restrict scores, int64_t n, float max) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    scores[i] = exp_poly(scores[i] - max);
    sum += scores[i];
  }
  return sum;
}

#ifdef __AVX512F__
// AVX-512 path: one (request, KV head) pair kept in registers. `DV` vectors of 16 floats make a
// head (DV = 4: head_dim 64, DV = 8: head_dim 128), `G` query heads share the KV head. Scores
// go through memory once (softmax needs them all); keys and values are read once each.

template <typename scalar_t, int DV, int G>
void decode_item_avx512(const scalar_t* q, const scalar_t* k_cache, const scalar_t* v_cache,
                        const int64_t* table, int64_t first, int64_t len, int64_t BS,
                        int64_t token_stride, float scale, float* scores, scalar_t* out) {
  const int64_t n = len - first;
  __m512 qv[G][DV];
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < DV; ++j)
      qv[g][j] = _mm512_mul_ps(load16(q + g * DV * 16 + j * 16), _mm512_set1_ps(scale));
  float m[G];
  for (int g = 0; g < G; ++g) m[g] = -3.0e38f;
  for (int64_t pos = first, i = 0; pos < len;) {
    const int64_t offset = pos % BS, take = std::min(BS - offset, len - pos);
    const scalar_t* k = k_cache + (table[pos / BS] * BS + offset) * token_stride;
    for (int64_t t = 0; t < take; ++t, ++i) {
      __m512 kv[DV];
      for (int j = 0; j < DV; ++j) kv[j] = load16(k + t * token_stride + j * 16);
      for (int g = 0; g < G; ++g) {
        __m512 s = _mm512_mul_ps(qv[g][0], kv[0]);
        for (int j = 1; j < DV; ++j) s = _mm512_fmadd_ps(qv[g][j], kv[j], s);
        const float score = _mm512_reduce_add_ps(s);
        scores[g * n + i] = score;
        m[g] = std::max(m[g], score);
      }
    }
    pos += take;
  }
  float inv[G];
  for (int g = 0; g < G; ++g) inv[g] = 1.f / exp_and_sum(scores + g * n, n, m[g]);
  __m512 acc[G][DV];
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < DV; ++j) acc[g][j] = _mm512_setzero_ps();
  for (int64_t pos = first, i = 0; pos < len;) {
    const int64_t offset = pos % BS, take = std::min(BS - offset, len - pos);
    const scalar_t* v = v_cache + (table[pos / BS] * BS + offset) * token_stride;
    for (int64_t t = 0; t < take; ++t, ++i) {
      __m512 vv[DV];
      for (int j = 0; j < DV; ++j) vv[j] = load16(v + t * token_stride + j * 16);
      for (int g = 0; g < G; ++g) {
        const __m512 p = _mm512_set1_ps(scores[g * n + i]);
        for (int j = 0; j < DV; ++j) acc[g][j] = _mm512_fmadd_ps(p, vv[j], acc[g][j]);
      }
    }
    pos += take;
  }
  for (int g = 0; g < G; ++g) {
    alignas(64) float tmp[DV * 16];
    for (int j = 0; j < DV; ++j)
      _mm512_store_ps(tmp + j * 16, _mm512_mul_ps(acc[g][j], _mm512_set1_ps(inv[g])));
    for (int d = 0; d < DV * 16; ++d) out[g * DV * 16 + d] = static_cast<scalar_t>(tmp[d]);
  }
}

using ItemFn = void (*)(const void*, const void*, const void*, const int64_t*, int64_t, int64_t,
                        int64_t, int64_t, float, float*, void*);

template <typename scalar_t, int DV, int G>
void item_thunk(const void* q, const void* k, const void* v, const int64_t* table, int64_t first,
                int64_t len, int64_t BS, int64_t token_stride, float scale, float* scores,
                void* out) {
  decode_item_avx512<scalar_t, DV, G>(
      static_cast<const scalar_t*>(q), static_cast<const scalar_t*>(k),
      static_cast<const scalar_t*>(v), table, first, len, BS, token_stride, scale, scores,
      static_cast<scalar_t*>(out));
}

template <typename scalar_t, int DV>
ItemFn pick_g(int64_t G) {
  switch (G) {
    case 1: return item_thunk<scalar_t, DV, 1>;
    case 2: return item_thunk<scalar_t, DV, 2>;
    case 3: return item_thunk<scalar_t, DV, 3>;
    case 4: return item_thunk<scalar_t, DV, 4>;
    case 5: return item_thunk<scalar_t, DV, 5>;
    case 6: return item_thunk<scalar_t, DV, 6>;
    case 7: return item_thunk<scalar_t, DV, 7>;
    case 8: return item_thunk<scalar_t, DV, 8>;
    default: return nullptr;
  }
}

// The specialised kernel for this shape and dtype, or nullptr (then the generic loop runs).
template <typename scalar_t>
ItemFn pick_avx512(int64_t D, int64_t G) {
  if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, c10::BFloat16>) {
    if (D == 64) return pick_g<scalar_t, 4>(G);
    if (D == 128) return pick_g<scalar_t, 8>(G);
  }
  return nullptr;
}
#endif

template <typename scalar_t>
void decode(const scalar_t* q, const scalar_t* k_cache, const scalar_t* v_cache,
            const int64_t* block_tables, const int64_t* seq_lens, scalar_t* out, int64_t R,
            int64_t H, int64_t KVH, int64_t D, int64_t BS, int64_t MB, float scale,
            int64_t window) {
  const int64_t G = H / KVH;  // query heads per KV head
  const int64_t token_stride = KVH * D;
#ifdef __AVX512F__
  if (ItemFn fn = pick_avx512<scalar_t>(D, G)) {
    at::parallel_for(0, R * KVH, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t r = item / KVH, kvh = item % KVH;
        const int64_t len = seq_lens[r];
        const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
        scores.resize(G * (len - first));
        fn(q + (r * H + kvh * G) * D, k_cache + kvh * D, v_cache + kvh * D, block_tables + r * MB,
           first, len, BS, token_stride, scale, scores.data(), out + (r * H + kvh * G) * D);
      }
    });
    return;
  }
#endif
  at::parallel_for(0, R * KVH, 1, [&](int64_t begin, int64_t end) {
    // Keys are scored a block at a time through a transposed fp32 tile [D][BS] that stays in
    // L1: the inner loop runs over the block's tokens, contiguous, without horizontal sums.
    std::vector<float> qf(G * D), acc(G * D), tile(D * BS), scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / KVH, kvh = item % KVH;
      const int64_t len = seq_lens[r];
      const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const int64_t n = len - first;
      const int64_t* table = block_tables + r * MB;
      scores.resize(G * n);
      for (int64_t g = 0; g < G; ++g)
        for (int64_t d = 0; d < D; ++d)
          qf[g * D + d] = static_cast<float>(q[(r * H + kvh * G + g) * D + d]) * scale;

      // Walk the positions block by block (no division per token).
      for (int64_t pos = first, i = 0; pos < len;) {
        const int64_t offset = pos % BS, take = std::min(BS - offset, len - pos);
        const scalar_t* k = k_cache + (table[pos / BS] * BS + offset) * token_stride + kvh * D;
        for (int64_t t = 0; t < take; ++t)
          for (int64_t d = 0; d < D; ++d) tile[d * BS + t] = static_cast<float>(k[t * token_stride + d]);
        for (int64_t g = 0; g < G; ++g) {
          float* __restrict sg = scores.data() + g * n + i;
          const float* __restrict qg = qf.data() + g * D;
          for (int64_t t = 0; t < take; ++t) sg[t] = 0.f;
          for (int64_t d = 0; d < D; ++d) {
            const float* __restrict kd = tile.data() + d * BS;
#pragma omp simd
            for (int64_t t = 0; t < take; ++t) sg[t] = std::fma(qg[d], kd[t], sg[t]);
          }
        }
        pos += take;
        i += take;
      }
      for (int64_t g = 0; g < G; ++g) {  // softmax over the positions, per head
        float* __restrict sg = scores.data() + g * n;
        const float inv = 1.f / exp_and_sum(sg, n, max_of(sg, n));  // n >= 1: its own position
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) sg[i] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t pos = first, i = 0; pos < len;) {  // acc[g, :] += p[g, i] * v[i, :]
        const int64_t offset = pos % BS, take = std::min(BS - offset, len - pos);
        const scalar_t* v = v_cache + (table[pos / BS] * BS + offset) * token_stride + kvh * D;
        for (int64_t t = 0; t < take; ++t, ++i) {
          const scalar_t* __restrict vt = v + t * token_stride;
          for (int64_t g = 0; g < G; ++g) {
            const float p = scores[g * n + i];
            float* __restrict ag = acc.data() + g * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) ag[d] = std::fma(p, static_cast<float>(vt[d]), ag[d]);
          }
        }
        pos += take;
      }
      for (int64_t g = 0; g < G; ++g)
        for (int64_t d = 0; d < D; ++d)
          out[(r * H + kvh * G + g) * D + d] = static_cast<scalar_t>(acc[g * D + d]);
    }
  });
}

}  // namespace

torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                     const torch::Tensor& v_cache,
                                     const torch::Tensor& block_tables,
                                     const torch::Tensor& seq_lens, double scale,
                                     int64_t window) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "q [R, H, D], caches [NB, BS, KVH, D]");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "inputs must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() &&
                  q.scalar_type() == v_cache.scalar_type(),
              "q and caches must share a dtype");
  TORCH_CHECK(block_tables.scalar_type() == torch::kLong && seq_lens.scalar_type() == torch::kLong,
              "block_tables and seq_lens must be int64");
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t BS = k_cache.size(1), KVH = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && H % KVH == 0, "head sizes do not match");
  TORCH_CHECK(block_tables.size(0) == R && seq_lens.size(0) == R, "one row per request");
  auto tables = block_tables.contiguous();
  auto lens = seq_lens.contiguous();
  auto out = torch::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    decode<scalar_t>(q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(),
                     v_cache.data_ptr<scalar_t>(), tables.data_ptr<int64_t>(),
                     lens.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), R, H, KVH, D, BS,
                     tables.size(1), static_cast<float>(scale), window);
  });
  return out;
}

