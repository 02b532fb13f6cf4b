// bfloat16 linear layers for decode-sized batches: y = x W^T (+ b) with AVX-512 BF16 dot
// products (`vdpbf16ps`: pairs of bf16 products summed into float32 lanes).
//
// At a few rows a linear layer is a stream over its weights: oneDNN's kernels read them at about
// 60% of the machine's read bandwidth, this one at all of it, and at 8-64 rows
// it keeps more rows per register tile. The weight is packed once into blocks of 32 columns,
// each block stored pair-major ([K/2][32 columns][2]), so one 64-byte load holds a k pair for 16
// columns and one block is a single sequential stream.
//
// Every output is the float32 sum over k in order, one rounding per `vdpbf16ps` step, then
// bias, then one rounding to bf16: a row's result never depends on the other rows of the batch.
#include "ops.h"

#include <ATen/ops/empty_cpu_dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#ifdef __AVX512BF16__
#include <immintrin.h>

namespace {

constexpr int64_t kVecsPerBlock = 2;                  // 16-lane vectors of columns per block
constexpr int64_t kBlockCols = 16 * kVecsPerBlock;    // columns per packed block
constexpr int64_t kPairStride = kBlockCols * 2;       // bf16 values per k pair of a block
constexpr int kMaxRows = 12;                          // 12 x 2 accumulators: 24 of 32 registers
constexpr int64_t kChunkPairs = 128;                  // 16 KB of a block, reused from L1 per tile
constexpr int64_t kPanelRows = 384;  // rows per pass: each pass streams the weight once
constexpr int64_t kPrefetchPairs = 16;                // 2 KB ahead of a one-tile stream

// What a tile does after its last chunk: add the bias, round, store (masking columns past N).
struct Epilogue {
  uint16_t* y;
  int64_t ldy;
  const float* bias;  // this tile's first column, or null
  int last_lanes;     // columns of the last vector that exist (1..16)
};

// MR rows x NV vectors of columns over `pairs` k pairs. The accumulators start at zero (first
// chunk) or from `scratch`, and go back to `scratch` unless `done` finishes the tile.
template <int MR, int NV>
void tile(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t pairs, float* scratch,
          bool first, const Epilogue* done, int64_t prefetch) {
  __m512 acc[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v)
      acc[m][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(scratch + m * kBlockCols + v * 16);
  for (int64_t p = 0; p < pairs; ++p) {
    const uint16_t* wp = w + p * kPairStride;
    if (prefetch) {
      for (int v = 0; v < NV; ++v)
        _mm_prefetch(reinterpret_cast<const char*>(wp + prefetch * kPairStride + v * 32),
                     _MM_HINT_T0);
    }
    __m512bh wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = (__m512bh)_mm512_loadu_si512(wp + v * 32);
    for (int m = 0; m < MR; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * ldx + 2 * p, sizeof pair);
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], xb, wv[v]);
    }
  }
  if (done == nullptr) {
    for (int m = 0; m < MR; ++m)
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(scratch + m * kBlockCols + v * 16, acc[m][v]);
    return;
  }
  for (int m = 0; m < MR; ++m) {
    for (int v = 0; v < NV; ++v) {
      __m512 a = acc[m][v];
      if (done->bias) a = _mm512_add_ps(a, _mm512_loadu_ps(done->bias + v * 16));
      const __m256i out = (__m256i)_mm512_cvtneps_pbh(a);
      uint16_t* dst = done->y + m * done->ldy + v * 16;
      if (v == NV - 1 && done->last_lanes < 16) {
        _mm256_mask_storeu_epi16(dst, static_cast<__mmask16>((1u << done->last_lanes) - 1), out);
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), out);
      }
    }
  }
}

using TileFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, bool,
                        const Epilogue*, int64_t);

template <int NV, int... MR>
constexpr std::array<TileFn, sizeof...(MR)> tiles_by_rows(std::integer_sequence<int, MR...>) {
  return {&tile<MR + 1, NV>...};
}

// kTiles[nv - 1][rows - 1]: the tile for that many vectors and rows.
const std::array<std::array<TileFn, kMaxRows>, kVecsPerBlock> kTiles = {
    tiles_by_rows<1>(std::make_integer_sequence<int, kMaxRows>()),
    tiles_by_rows<2>(std::make_integer_sequence<int, kMaxRows>()),
};

}  // namespace

bool bf16_linear_available() { return true; }

at::Tensor pack_bf16_linear(const at::Tensor& weight, const c10::optional<at::Tensor>& out) {
  INFLIGHT_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16,
              "weight: [out_features, in_features] bfloat16");
  const int64_t N = weight.size(0), K = weight.size(1);
  INFLIGHT_CHECK(K % 2 == 0, "in_features must be even (k pairs), got ", K);
  const int64_t blocks = (N + kBlockCols - 1) / kBlockCols, full = N / kBlockCols;
  const std::vector<int64_t> shape{blocks, K / 2, kBlockCols, 2};
  at::Tensor packed = out ? *out : at::cpu::empty(shape, weight.options());
  INFLIGHT_CHECK(packed.sizes() == at::IntArrayRef(shape) &&
                  packed.scalar_type() == at::kBFloat16 && packed.is_contiguous() &&
                  packed.device().is_cpu(),
              "out: bfloat16 ", at::IntArrayRef(shape), " contiguous, got ", packed.sizes());
  // [N, K/2, 2] -> [blocks, K/2, 32 columns, 2], straight into place: whole blocks, then the
  // last block's columns and its zero padding
  const auto pairs = weight.reshape({N, K / 2, 2});
  packed.narrow(0, 0, full).copy_(
      pairs.narrow(0, 0, full * kBlockCols).view({full, kBlockCols, K / 2, 2}).transpose(1, 2));
  if (full < blocks) {
    auto last = packed.select(0, full);  // [K/2, 32, 2]
    last.zero_();
    last.narrow(1, 0, N - full * kBlockCols)
        .copy_(pairs.narrow(0, full * kBlockCols, N - full * kBlockCols).transpose(0, 1));
  }
  return packed;
}

at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& packed,
                       const c10::optional<at::Tensor>& bias, int64_t out_features) {
  auto y = at::cpu::empty({x.dim() == 2 ? x.size(0) : 0, out_features}, x.options());
  bf16_linear_into(x, packed, bias, out_features, y);
  return y;
}

void bf16_linear_into(const at::Tensor& x_in, const at::Tensor& packed,
                      const c10::optional<at::Tensor>& bias, int64_t out_features, at::Tensor& y) {
  INFLIGHT_CHECK(packed.dim() == 4 && packed.size(2) == kBlockCols && packed.size(3) == 2 &&
                  packed.scalar_type() == at::kBFloat16 && packed.is_contiguous(),
              "packed: a weight from pack_bf16_linear");
  const int64_t N = out_features, pairs = packed.size(1), K = 2 * pairs;
  INFLIGHT_CHECK(N > (packed.size(0) - 1) * kBlockCols && N <= packed.size(0) * kBlockCols,
              "out_features ", N, " does not match the packed weight");
  INFLIGHT_CHECK(x_in.dim() == 2 && x_in.size(1) == K && x_in.scalar_type() == at::kBFloat16,
              "x: [rows, ", K, "] bfloat16");
  INFLIGHT_CHECK(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == N), "bias: [", N, "]");
  const at::Tensor x = x_in.contiguous();
  const at::Tensor bias_f32 =
      bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const int64_t M = x.size(0);
  INFLIGHT_CHECK(y.dim() == 2 && y.size(0) == M && y.size(1) == N &&
                  y.scalar_type() == at::kBFloat16 && y.is_contiguous(),
              "y: [rows, out_features] bfloat16, contiguous");
  if (M == 0) return;
  // A tile reads its rows at one offset each step: rows whose stride is a multiple of 2 KB fall
  // into a few L1 sets and evict each other, so such an x is read from a copy whose rows are
  // 64 bytes further apart (a copy is a small part of a call that tiles many rows).
  const bool pad = M > kMaxRows && (K * 2) % 2048 == 0;
  const int64_t ldx = pad ? K + 32 : K;
  const at::Tensor xs = pad ? at::cpu::empty({M, ldx}, x.options()) : x;
  if (pad) xs.narrow(1, 0, K).copy_(x);
  const auto* xp = reinterpret_cast<const uint16_t*>(xs.data_ptr());
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  const float* bp = bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr;
  // Threads split the columns (16 at a time) and each streams its share of the weight once per
  // panel of rows; within a panel, a chunk of a block's weight serves every row tile from L1.
  const int64_t vecs = (N + 15) / 16;
  at::parallel_for(0, vecs, 1, [&](int64_t v_begin, int64_t v_end) {
    std::vector<float> scratch(std::min(M, kPanelRows) * kBlockCols);
    for (int64_t m0 = 0; m0 < M; m0 += kPanelRows) {
      const int64_t panel = std::min(kPanelRows, M - m0);
      const bool one_tile = panel <= kMaxRows;
      const int64_t chunk = one_tile ? pairs : kChunkPairs;
      for (int64_t v0 = v_begin; v0 < v_end;) {
        const int64_t in_block = v0 % kVecsPerBlock;
        const int nv = static_cast<int>(std::min(kVecsPerBlock - in_block, v_end - v0));
        const int64_t col = v0 * 16;
        const uint16_t* block_w = wp + (v0 / kVecsPerBlock) * pairs * kPairStride + in_block * 32;
        const int last_lanes = static_cast<int>(std::min<int64_t>(16, N - (v0 + nv - 1) * 16));
        for (int64_t p0 = 0; p0 < pairs; p0 += chunk) {
          const int64_t np = std::min(chunk, pairs - p0);
          for (int64_t r0 = 0; r0 < panel; r0 += kMaxRows) {
            const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, panel - r0));
            const Epilogue done{yp + (m0 + r0) * N + col, N, bp ? bp + col : nullptr,
                                last_lanes};
            // the first tile of a chunk brings the next chunk in; the others find it in L1
            const int64_t prefetch = one_tile ? kPrefetchPairs : (r0 == 0 ? chunk : 0);
            kTiles[nv - 1][rows - 1](xp + (m0 + r0) * ldx + 2 * p0, ldx,
                                     block_w + p0 * kPairStride, np,
                                     scratch.data() + r0 * kBlockCols, p0 == 0,
                                     p0 + np == pairs ? &done : nullptr, prefetch);
          }
        }
        v0 += nv;
      }
    }
  });
}

#else  // no AVX-512 BF16 on the machine that compiled this: callers keep oneDNN's linears

bool bf16_linear_available() { return false; }

at::Tensor pack_bf16_linear(const at::Tensor&, const c10::optional<at::Tensor>&) {
  INFLIGHT_CHECK(false, "bf16_linear needs AVX-512 BF16");
}

at::Tensor bf16_linear(const at::Tensor&, const at::Tensor&,
                          const c10::optional<at::Tensor>&, int64_t) {
  INFLIGHT_CHECK(false, "bf16_linear needs AVX-512 BF16");
}

void bf16_linear_into(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
                      int64_t, at::Tensor&) {
  INFLIGHT_CHECK(false, "bf16_linear needs AVX-512 BF16");
}

#endif
