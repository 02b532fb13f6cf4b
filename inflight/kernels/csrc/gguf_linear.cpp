// float32 linear layers for decode-sized batches, reading the weight as GGUF's own Q4_0, Q4_1 or
// Q8_0 blocks (AVX2 + FMA + F16C).
//
// At a few rows a linear layer is a stream over its weights, so its time is their bytes over the
// memory bandwidth. A GGUF checkpoint dequantized to float32 streams 6.4x (Q4_1) or 3.8x (Q8_0)
// more bytes than its blocks: SmolLM2-135M's decode step reads 538 MB instead of 96 MB. Here a
// block's quants become floats in registers (the 4-bit ones centred: q - 8) and meet x in FMAs;
// the block then adds d * (that dot product) to the output's accumulator. Q4_0's weight is
// d * (q - 8) exactly that way; Q4_1's, d * q + m, also adds (m + 8 d) * (the block's sum of x).
// So the weights are the dequantized model's (d, m and q are exact in float32); only how the
// float32 products are grouped and summed differs from oneDNN's over the dequantized weights.
//
// A block of 32 weights is [fp16 d][fp16 m, Q4_1 only][16 bytes of nibbles: element j low,
// element j + 16 high] for the 4-bit formats and [fp16 d][32 int8] for Q8_0; the weight comes as
// [out_features, in_features / 32, block bytes], and the block size tells the format apart.
//
// Every output is a fixed sequence of float32 operations: one accumulator of 8 lanes fed in k
// order, summed across lanes in a fixed order, then the offsets, then the bias. So a row's
// result never depends on the other rows of the batch, nor on how the batch is tiled.
#include "gguf_blocks.h"
#include "ops.h"

#include <ATen/ops/empty_cpu_dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

namespace {

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);
}

// A block's 32 quants as four vectors of 8 floats (elements 0-7, 8-15, 16-23, 24-31): Q8_0's
// int8 as they are, the 4-bit formats' nibbles minus 8 (so that the sum of their products with x
// is about as small as the result, not 8 times it).
template <Format F>
inline void centred_quants(const uint8_t* block, __m256 q[4]) {
  if constexpr (F == Format::kQ8_0) {
    for (int i = 0; i < 4; ++i) {
      const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 2 + 8 * i));
      q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    }
  } else {
    const __m128i packed =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + block_bytes(F) - 16));
    const __m128i nibble = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    const __m128i low = _mm_sub_epi8(_mm_and_si128(packed, nibble), eight);  // elements 0-15
    const __m128i high =
        _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), nibble), eight);  // 16-31
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(low));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(low, 8)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(high));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(high, 8)));
  }
}

inline float lane_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

struct Problem {
  const float* x;         // [M, K]
  const float* x_sums;    // [M, K / 32]: each block's sum of x (Q4_1 only)
  const uint8_t* w;       // [N, K / 32 blocks]
  const float* bias;      // [N] or null
  float* y;               // [M, N]
  int64_t K, N, row_bytes;
};

// MR rows x NC columns from (row m0, column n0); each block's quants are converted once for MR
// rows. A block adds d * (sum of x * centred quants) to a vector accumulator and, for Q4_1,
// (m + 8 d) * (sum of x) to a scalar one; Q4_0's offset is exactly -8 d, so it has none.
template <Format F, int MR, int NC>
void tile(const Problem& p, int64_t m0, int64_t n0) {
  __m256 acc[MR][NC];
  float offset_acc[MR][NC] = {};
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm256_setzero_ps();
  const int64_t blocks = p.K / kBlock;
  const uint8_t* w = p.w + n0 * p.row_bytes;
  const float* x = p.x + m0 * p.K;
  for (int64_t b = 0; b < blocks; ++b) {
    for (int c = 0; c < NC; ++c) {
      const uint8_t* block = w + c * p.row_bytes + b * block_bytes(F);
      __m256 q[4];
      centred_quants<F>(block, q);
      const float d = half_at(block);
      const __m256 dv = _mm256_set1_ps(d);
      for (int r = 0; r < MR; ++r) {
        const float* xb = x + r * p.K + b * kBlock;
        // two chains of two products: a shorter dependency path than one chain of four
        const __m256 dot = _mm256_add_ps(
            _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), _mm256_mul_ps(q[0], _mm256_loadu_ps(xb))),
            _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24),
                            _mm256_mul_ps(q[2], _mm256_loadu_ps(xb + 16))));
        acc[r][c] = _mm256_fmadd_ps(dv, dot, acc[r][c]);
      }
      if constexpr (F == Format::kQ4_1) {
        const float offset = half_at(block + 2) + 8.0f * d;
        for (int r = 0; r < MR; ++r) {
          offset_acc[r][c] += offset * p.x_sums[(m0 + r) * blocks + b];
        }
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NC; ++c) {
      const float sum = lane_sum(acc[r][c]) + offset_acc[r][c];
      p.y[(m0 + r) * p.N + n0 + c] = p.bias ? sum + p.bias[n0 + c] : sum;
    }
  }
}

constexpr int kGroup = 4;    // columns a thread takes at a time
constexpr int kMaxRows = 8;  // rows per tile: 8 accumulators + 4 quant vectors fit 16 ymm

// Columns per tile for a tile of `rows` rows: at most 8 accumulators, and at one or two rows, 4
// columns keep four independent FMA chains in flight.
constexpr int wide_columns(int rows) { return rows <= 2 ? 4 : rows <= 4 ? 2 : 1; }

using TileFn = void (*)(const Problem&, int64_t, int64_t);
struct RowTiles {
  int wide;             // columns of `wide_tile`
  TileFn wide_tile;     // for full groups
  TileFn single_tile;   // one column, for the last columns when N is not a multiple
};

template <Format F, int... R>
constexpr std::array<RowTiles, sizeof...(R)> row_tiles(std::integer_sequence<int, R...>) {
  return {RowTiles{wide_columns(R + 1), &tile<F, R + 1, wide_columns(R + 1)>,
                   &tile<F, R + 1, 1>}...};
}

template <Format F>
void run(const Problem& p, int64_t M) {
  static constexpr auto kTiles = row_tiles<F>(std::make_integer_sequence<int, kMaxRows>());
  const int64_t groups = (p.N + kGroup - 1) / kGroup;
  // Threads split the columns; a group's few hundred bytes of blocks stay in L1 for every row.
  at::parallel_for(0, groups, 8, [&](int64_t g_begin, int64_t g_end) {
    for (int64_t g = g_begin; g < g_end; ++g) {
      const int64_t n_begin = g * kGroup, n_end = std::min(p.N, n_begin + kGroup);
      for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
        const RowTiles& t = kTiles[std::min<int64_t>(kMaxRows, M - m0) - 1];
        for (int64_t n0 = n_begin; n0 < n_end;) {
          if (n_end - n0 >= t.wide) {
            t.wide_tile(p, m0, n0);
            n0 += t.wide;
          } else {
            t.single_tile(p, m0, n0++);
          }
        }
      }
    }
  });
}

}  // namespace

bool gguf_linear_available() { return true; }

at::Tensor gguf_linear(const at::Tensor& x_in, const at::Tensor& blocks,
                       const c10::optional<at::Tensor>& bias, int64_t out_features) {
  INFLIGHT_CHECK(blocks.dim() == 3 && blocks.scalar_type() == at::kByte && blocks.is_contiguous(),
              "blocks: uint8 [out_features, in_features / 32, block bytes]");
  const int64_t N = blocks.size(0), K = blocks.size(1) * kBlock, bytes = blocks.size(2);
  const std::optional<Format> format = format_of(bytes);
  INFLIGHT_CHECK(format && is_legacy(*format), "blocks of ", bytes, " bytes: not Q4_0 (18), Q4_1 (20) or Q8_0 (34)");
  INFLIGHT_CHECK(out_features == N, "out_features ", out_features, " does not match the blocks' ",
              N);
  INFLIGHT_CHECK(x_in.dim() == 2 && x_in.size(1) == K && x_in.scalar_type() == at::kFloat,
              "x: [rows, ", K, "] float32");
  INFLIGHT_CHECK(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == N), "bias: [", N, "]");
  const at::Tensor x = x_in.contiguous();
  const at::Tensor bias_f32 = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const int64_t M = x.size(0);
  auto y = at::cpu::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const float* xp = x.data_ptr<float>();
  const int64_t blocks_per_row = blocks.size(1);
  std::vector<float> x_sums;
  if (format == Format::kQ4_1) {
    x_sums.resize(M * blocks_per_row);
    for (int64_t i = 0; i < M * blocks_per_row; ++i) {
      float sum = 0.0f;
      for (int64_t j = 0; j < kBlock; ++j) sum += xp[i * kBlock + j];
      x_sums[i] = sum;
    }
  }
  const Problem p{xp, x_sums.data(), blocks.data_ptr<uint8_t>(),
                  bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr, y.data_ptr<float>(),
                  K, N, blocks_per_row * bytes};
  with_legacy_format(*format, [&](auto f) { run<f.value>(p, M); });
  return y;
}

#else  // the compiler does not target AVX2, FMA and F16C: callers keep oneDNN's linears

bool gguf_linear_available() { return false; }

at::Tensor gguf_linear(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
                       int64_t) {
  INFLIGHT_CHECK(false, "gguf_linear needs AVX2, FMA and F16C");
}

#endif
