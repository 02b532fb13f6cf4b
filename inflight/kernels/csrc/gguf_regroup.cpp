// A GGUF weight's 5-bit, K-quant or MXFP4 blocks (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4), as the
// file holds them ([N, blocks per row, file block bytes]), re-laid for gguf_int_linear.cpp:
// eight columns' header fields side by side, then each 32-weight sub-block's nibbles in 32-byte chunks and its high
// bits (gguf_blocks.h and `chunk_values` there say where every bit goes). One pass over the
// file's bytes, threads splitting the groups of 8 columns: a 3B model's 1.8 GB in about a second,
// where the same layout built from PyTorch ops took 12 s. The file's layouts are ggml's; the
// values are checked against model/gguf_blocks.py's dequantization (gguf's, bit for bit) by the
// kernel tests, which multiply through this layout.
#include "gguf_blocks.h"
#include "ops.h"

#include <ATen/ops/empty_cpu_dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <cstring>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kLanes = 8;

// One column's block as integers: fp16 fields as their bits, 6-bit scales and mins as bytes,
// every quant as a byte (0..63), in weight order.
struct Decoded {
  uint16_t d = 0, m = 0;
  uint8_t scales[16] = {}, mins[8] = {};
  uint8_t q[256] = {};
};

inline uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// 32 weights: 16 bytes of nibbles (byte i: weight i low, i + 16 high) and a uint32 of 5th bits.
inline void five_bit(const uint8_t* qh_bytes, const uint8_t* qs, uint8_t* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof qh);
  for (int i = 0; i < 16; ++i) {
    q[i] = (qs[i] & 15) | (((qh >> i) & 1) << 4);
    q[i + 16] = (qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4);
  }
}

// Q4_K / Q5_K: 12 bytes hold 8 6-bit scales and 8 6-bit mins (bytes 0-3: scales 0-3 and the top
// bits of scales 4-7; 4-7: the same for the mins; 8-11: the low 4 bits of scales 4-7 and mins 4-7).
// The layout keeps them in 12 bytes a column, laid for the kernel (`unpack_k_scales`): 8 bytes of
// low nibbles, sub-block j's at 32 + 8 j (the scale's | the min's << 4), then 4 of high bits,
// sub-blocks j and j + 4 (j < 4) sharing the byte at 96 + 8 j (nibble 0 for j, 1 for j + 4: the
// scale's top 2 bits | the min's << 2), each 8 columns side by side.
inline void k_scales(const uint8_t* s, Decoded& out) {
  for (int j = 0; j < 4; ++j) {
    out.scales[j] = s[j] & 63;
    out.mins[j] = s[j + 4] & 63;
    out.scales[j + 4] = (s[j + 8] & 15) | ((s[j] >> 6) << 4);
    out.mins[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

template <Format F>
void decode(const uint8_t* src, Decoded& out) {
  if constexpr (F == Format::kMXFP4) {  // e, then Q4_0's nibbles (the FP4 codes)
    out.d = src[0];
    for (int i = 0; i < 16; ++i) {
      out.q[i] = src[1 + i] & 15;
      out.q[i + 16] = src[1 + i] >> 4;
    }
  } else if constexpr (F == Format::kQ5_0) {
    out.d = u16_at(src);
    five_bit(src + 2, src + 6, out.q);
  } else if constexpr (F == Format::kQ5_1) {
    out.d = u16_at(src);
    out.m = u16_at(src + 2);
    five_bit(src + 4, src + 8, out.q);
  } else if constexpr (F == Format::kQ4_K || F == Format::kQ5_K) {
    out.d = u16_at(src);
    out.m = u16_at(src + 2);
    k_scales(src + 4, out);
    const uint8_t* qs = src + (F == Format::kQ4_K ? 16 : 48);
    for (int c = 0; c < 4; ++c) {  // 32-byte chunk c: sub-blocks 2c (low) and 2c + 1 (high)
      for (int e = 0; e < 32; ++e) {
        out.q[64 * c + e] = qs[32 * c + e] & 15;
        out.q[64 * c + 32 + e] = qs[32 * c + e] >> 4;
      }
    }
    if constexpr (F == Format::kQ5_K) {  // bit s of byte e: sub-block s's weight e
      const uint8_t* qh = src + 16;
      for (int s = 0; s < 8; ++s) {
        for (int e = 0; e < 32; ++e) out.q[32 * s + e] |= ((qh[e] >> s) & 1) << 4;
      }
    }
  } else {  // Q6_K: ql[128], qh[64], int8 scales[16], fp16 d
    const uint8_t *ql = src, *qh = src + 128;
    std::memcpy(out.scales, src + 192, 16);
    out.d = u16_at(src + 208);
    for (int h = 0; h < 2; ++h) {  // halves of 128: nibble byte l holds weights l and 64 + l
      for (int l = 0; l < 64; ++l) {
        out.q[128 * h + l] = ql[64 * h + l] & 15;
        out.q[128 * h + 64 + l] = ql[64 * h + l] >> 4;
      }
      for (int l = 0; l < 32; ++l) {  // 2-bit byte l: weights l, 32 + l, 64 + l, 96 + l
        for (int s = 0; s < 4; ++s) {
          out.q[128 * h + 32 * s + l] |= ((qh[32 * h + l] >> (2 * s)) & 3) << 4;
        }
      }
    }
  }
}

inline void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof v); }

// Column `lane`'s block into its group's block `out` (zeroed beforehand: the high-bit bytes are
// shared between columns and are ORed into).
template <Format F>
void place(const Decoded& in, int lane, uint8_t* out) {
  if constexpr (F == Format::kMXFP4) {
    out[lane] = static_cast<uint8_t>(in.d);  // [8 e]
  } else {
    put_u16(out + 2 * lane, in.d);
  }
  if constexpr (has_min(F)) put_u16(out + 16 + 2 * lane, in.m);
  if constexpr (F == Format::kQ4_K || F == Format::kQ5_K) {  // [8 d][8 dmin][lows][highs]
    for (int j = 0; j < 8; ++j) {
      out[32 + 8 * j + lane] = static_cast<uint8_t>((in.scales[j] & 15) | (in.mins[j] & 15) << 4);
      const int high = (in.scales[j] >> 4) | (in.mins[j] >> 4) << 2;
      out[96 + 8 * (j & 3) + lane] |= static_cast<uint8_t>(high << (4 * (j >> 2)));
    }
  } else if constexpr (F == Format::kQ6_K) {  // [8 d][16 halves x 8 int8 scales]
    for (int h = 0; h < 16; ++h) out[16 + 8 * h + lane] = in.scales[h];
  }
  for (int j = 0; j < sub_blocks(F); ++j) {
    uint8_t* sub = out + kLanes * header_bytes(F) + j * kLanes * quant_bytes(F);
    const uint8_t* q = in.q + 32 * j;
    for (int t = 0; t < 4; ++t) {    // chunk t: weights 4t..4t+3 (low) and 16+4t.. (high)
      for (int u = 0; u < 4; ++u) {  // position p = 4 lane + u of the chunk
        const int p = 4 * lane + u, low = q[4 * t + u], high = q[16 + 4 * t + u];
        sub[32 * t + p] = static_cast<uint8_t>((low & 15) | ((high & 15) << 4));
        if constexpr (extra_bits(F) == 1) {  // byte p % 8, bits 2 (p / 8)
          const int f = (low >> 4) | ((high >> 4) << 1);
          sub[128 + 8 * t + p % 8] |= static_cast<uint8_t>(f << (2 * (p / 8)));
        } else if constexpr (extra_bits(F) == 2) {  // byte p % 16, bits 4 (p / 16)
          const int f = (low >> 4) | ((high >> 4) << 2);
          sub[128 + 16 * t + p % 16] |= static_cast<uint8_t>(f << (4 * (p / 16)));
        }
      }
    }
  }
}

// Column `lane`'s block back out of its group's block: `place` undone.
template <Format F>
void take(const uint8_t* in, int lane, Decoded& out) {
  out.d = F == Format::kMXFP4 ? in[lane] : u16_at(in + 2 * lane);
  if constexpr (has_min(F)) out.m = u16_at(in + 16 + 2 * lane);
  if constexpr (F == Format::kQ4_K || F == Format::kQ5_K) {
    for (int j = 0; j < 8; ++j) {
      const int low = in[32 + 8 * j + lane], high = in[96 + 8 * (j & 3) + lane] >> (4 * (j >> 2));
      out.scales[j] = static_cast<uint8_t>((low & 15) | (high & 3) << 4);
      out.mins[j] = static_cast<uint8_t>((low >> 4) | ((high >> 2) & 3) << 4);
    }
  } else if constexpr (F == Format::kQ6_K) {
    for (int h = 0; h < 16; ++h) out.scales[h] = in[16 + 8 * h + lane];
  }
  for (int j = 0; j < sub_blocks(F); ++j) {
    const uint8_t* sub = in + kLanes * header_bytes(F) + j * kLanes * quant_bytes(F);
    uint8_t* q = out.q + 32 * j;
    for (int t = 0; t < 4; ++t) {
      for (int u = 0; u < 4; ++u) {
        const int p = 4 * lane + u, both = sub[32 * t + p];
        int low = both & 15, high = both >> 4;
        if constexpr (extra_bits(F) == 1) {
          const int f = sub[128 + 8 * t + p % 8] >> (2 * (p / 8));
          low |= (f & 1) << 4;
          high |= ((f >> 1) & 1) << 4;
        } else if constexpr (extra_bits(F) == 2) {
          const int f = sub[128 + 16 * t + p % 16] >> (4 * (p / 16));
          low |= (f & 3) << 4;
          high |= ((f >> 2) & 3) << 4;
        }
        q[4 * t + u] = static_cast<uint8_t>(low);
        q[16 + 4 * t + u] = static_cast<uint8_t>(high);
      }
    }
  }
}

// The file's block bytes of each format this regrouping reads.
constexpr int64_t file_bytes(Format f) {
  switch (f) {
    case Format::kQ5_0: return 22;
    case Format::kQ5_1: return 24;
    case Format::kQ4_K: return 144;
    case Format::kQ5_K: return 176;
    case Format::kMXFP4: return 17;
    default: return 210;  // Q6_K
  }
}

template <Format F>
void regroup(const uint8_t* in, int64_t N, int64_t blocks, uint8_t* out) {
  const int64_t groups = (N + kLanes - 1) / kLanes, group_bytes = kLanes * block_bytes(F);
  at::parallel_for(0, groups, 16, [&](int64_t g_begin, int64_t g_end) {
    Decoded block;
    for (int64_t g = g_begin; g < g_end; ++g) {
      // `place` ORs bits in: the group starts as zeros (here, where it is about to be written,
      // so that an output in fresh memory is faulted in and filled in one pass)
      std::memset(out + g * blocks * group_bytes, 0, blocks * group_bytes);
      for (int lane = 0; lane < kLanes && g * kLanes + lane < N; ++lane) {
        const uint8_t* row = in + (g * kLanes + lane) * blocks * file_bytes(F);
        for (int64_t b = 0; b < blocks; ++b) {
          decode<F>(row + b * file_bytes(F), block);
          place<F>(block, lane, out + (g * blocks + b) * group_bytes);
        }
      }
    }
  });
}

// The format of a weight's file blocks [rows, blocks per row, block bytes] this file reads.
Format file_format(const at::Tensor& blocks) {
  INFLIGHT_CHECK(blocks.dim() == 3 && blocks.scalar_type() == at::kByte && blocks.is_contiguous(),
                 "blocks: uint8 [rows, blocks per row, block bytes], contiguous");
  const int64_t bytes = blocks.size(2);
  std::optional<Format> format;
  for (Format f : {Format::kQ5_0, Format::kQ5_1, Format::kQ4_K, Format::kQ5_K, Format::kQ6_K,
                   Format::kMXFP4}) {
    if (bytes == file_bytes(f)) format = f;
  }
  INFLIGHT_CHECK(format, "blocks of ", bytes, " bytes: none of Q5_0 (22), Q5_1 (24), Q4_K (144), "
                 "Q5_K (176), Q6_K (210) or MXFP4 (17)");
  return *format;
}

}  // namespace

at::Tensor gguf_regroup_blocks(const at::Tensor& blocks, const c10::optional<at::Tensor>& out) {
  const Format format = file_format(blocks);
  const int64_t N = blocks.size(0), per_row = blocks.size(1);
  const std::vector<int64_t> shape{(N + kLanes - 1) / kLanes, per_row,
                                   kLanes * block_bytes(format)};
  at::Tensor layout = out ? *out : at::cpu::empty(shape, blocks.options());
  INFLIGHT_CHECK(layout.sizes() == at::IntArrayRef(shape) && layout.scalar_type() == at::kByte &&
                  layout.is_contiguous() && layout.device().is_cpu(),
              "out: uint8 ", at::IntArrayRef(shape), " contiguous, got ", layout.sizes());
  with_format(format, [&](auto f) {
    if constexpr (!is_legacy(f.value)) {
      regroup<f.value>(blocks.data_ptr<uint8_t>(), N, per_row, layout.data_ptr<uint8_t>());
    }
  });
  return layout;
}

namespace {

inline float half_bits(uint16_t bits) {
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// MXFP4's E8M0 byte e -> 2^(e - 128) (half the block's scale: its values are doubled), exactly
inline float e8m0_half(uint16_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : ((e - 1u) << 23);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

constexpr int8_t kMxfp4Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// One block's weights in float32, as `model/gguf_blocks.dequantize` computes them: each scale
// and offset in float32, one rounding per operation, in its order.
template <Format F>
void dequantize_block(const Decoded& in, float* out) {
  const float d = F == Format::kMXFP4 ? e8m0_half(in.d) : half_bits(in.d);
  if constexpr (F == Format::kMXFP4) {
    for (int i = 0; i < 32; ++i) out[i] = d * static_cast<float>(kMxfp4Doubled[in.q[i]]);
  } else if constexpr (F == Format::kQ5_0) {
    for (int i = 0; i < 32; ++i) out[i] = d * static_cast<float>(static_cast<int>(in.q[i]) - 16);
  } else if constexpr (F == Format::kQ5_1) {
    const float m = half_bits(in.m);
    for (int i = 0; i < 32; ++i) {
      const float scaled = d * static_cast<float>(in.q[i]);
      out[i] = scaled + m;
    }
  } else if constexpr (F == Format::kQ6_K) {
    for (int g = 0; g < 16; ++g) {  // 16 weights a scale
      const float dl = d * static_cast<float>(static_cast<int8_t>(in.scales[g]));
      for (int i = 16 * g; i < 16 * g + 16; ++i) {
        out[i] = dl * static_cast<float>(static_cast<int>(in.q[i]) - 32);
      }
    }
  } else {  // Q4_K, Q5_K: 8 sub-blocks of 32, each d sc q - dmin m
    const float dmin = half_bits(in.m);
    for (int j = 0; j < 8; ++j) {
      const float dl = d * static_cast<float>(in.scales[j]);
      const float dm = dmin * static_cast<float>(in.mins[j]);
      for (int i = 32 * j; i < 32 * j + 32; ++i) {
        const float scaled = dl * static_cast<float>(in.q[i]);
        out[i] = scaled - dm;
      }
    }
  }
}

// Rows `ids` of `rows` as float32, block by block: `read(f, row, b, block)` decodes row `row`'s
// block b of format f.
template <class Read>
at::Tensor dequantize_rows(Format format, int64_t rows, int64_t per_row, const at::Tensor& ids,
                           Read&& read) {
  INFLIGHT_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong,
                 "ids: one int64 row index each");
  const at::Tensor index = ids.contiguous();
  const int64_t n = index.numel();
  const int64_t* id = index.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    INFLIGHT_CHECK(id[i] >= 0 && id[i] < rows, "row ", id[i], " of ", rows);
  }
  const int64_t weights = sub_blocks(format) * 32;
  auto out = at::cpu::empty({n, per_row * weights}, at::TensorOptions().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  with_format(format, [&](auto f) {
    if constexpr (!is_legacy(f.value)) {
      at::parallel_for(0, n * per_row, 64, [&](int64_t begin, int64_t end) {
        Decoded block;
        for (int64_t k = begin; k < end; ++k) {
          read(f, id[k / per_row], k % per_row, block);
          dequantize_block<f.value>(block, o + k * weights);
        }
      });
    }
  });
  return out;
}

}  // namespace

at::Tensor gguf_dequantize_rows(const at::Tensor& blocks, const at::Tensor& ids) {
  const Format format = file_format(blocks);
  const int64_t per_row = blocks.size(1), bytes = blocks.size(2);
  const uint8_t* in = blocks.data_ptr<uint8_t>();
  return dequantize_rows(format, blocks.size(0), per_row, ids,
                         [&](auto f, int64_t row, int64_t b, Decoded& block) {
                           decode<f.value>(in + (row * per_row + b) * bytes, block);
                         });
}

at::Tensor gguf_dequantize_layout_rows(const at::Tensor& layout, const at::Tensor& ids,
                                       int64_t rows) {
  INFLIGHT_CHECK(layout.dim() == 3 && layout.scalar_type() == at::kByte &&
                     layout.is_contiguous() && layout.size(2) % kLanes == 0 && rows > 0 &&
                     rows <= layout.size(0) * kLanes && rows > (layout.size(0) - 1) * kLanes,
                 "layout: uint8 [ceil(rows / 8), blocks per row, 8 x block bytes], contiguous");
  const std::optional<Format> format = format_of(layout.size(2) / kLanes);
  INFLIGHT_CHECK(format && !is_legacy(*format), "a layout of 5-bit, K-quant or MXFP4 blocks "
                 "expected, got ", layout.size(2) / kLanes, " bytes a column");
  const int64_t per_row = layout.size(1), group_bytes = layout.size(2);
  const uint8_t* in = layout.data_ptr<uint8_t>();
  return dequantize_rows(*format, rows, per_row, ids,
                         [&](auto f, int64_t row, int64_t b, Decoded& block) {
                           const int64_t g = row / kLanes;
                           take<f.value>(in + (g * per_row + b) * group_bytes,
                                         static_cast<int>(row % kLanes), block);
                         });
}
