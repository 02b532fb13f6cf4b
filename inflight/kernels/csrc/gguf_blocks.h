// The GGUF block formats the CPU kernels multiply from. The legacy ones: 32 weights per block,
// an fp16 scale d (and for Q4_1 an fp16 offset m), then the quants: 16 bytes of nibbles (Q4_0,
// Q4_1) or 32 int8 (Q8_0). gguf_linear.cpp reads those blocks as they are; gguf_int_linear.cpp
// reads them regrouped eight columns at a time, and reads the 5-bit and K-quant formats
// (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) too, re-laid per column as
//   [header][sub-block 0 quants]...[sub-block S-1 quants]
// where a sub-block is 32 weights: one for the legacy formats and Q5_0 / Q5_1, eight (a 256-weight
// super-block) for the K-quants. A sub-block's quants are 16 bytes of low nibbles laid like
// Q4_0's (byte i: element i low, element i + 16 high), then, for 5 and 6 bits, the high bits
// (1 or 2 per element: 4 or 8 bytes); model/gguf_blocks.py writes the layout and says where each
// bit goes. Headers: Q5_0 fp16 d; Q5_1 d, m; Q4_K and Q5_K fp16 d, fp16 dmin, and the 8 6-bit
// scales and 8 6-bit mins in the file's 12 bytes, re-laid so that 8 columns' fields of one
// sub-block come in one 8-byte load (gguf_regroup.cpp `place`, gguf_int_linear.cpp
// `unpack_k_scales`); Q6_K fp16 d and 16 int8 scales, one per 16 weights; MXFP4 (gpt-oss's
// experts) its E8M0 exponent byte e, the block's scale 2^(e - 128) (as ggml halves it), and
// nibbles laid like Q4_0's that index the FP4 values, doubled to the integers 0, +-1, +-2, +-3,
// +-4, +-6, +-8, +-12.
#pragma once
#include <cstdint>
#include <optional>
#include <type_traits>

constexpr int64_t kBlock = 32;  // weights per sub-block, and per scale but for Q6_K's 16
enum class Format { kQ4_0, kQ4_1, kQ8_0, kQ5_0, kQ5_1, kQ4_K, kQ5_K, kQ6_K, kMXFP4 };

constexpr bool is_k_quant(Format f) {
  return f == Format::kQ4_K || f == Format::kQ5_K || f == Format::kQ6_K;
}
// sub-blocks of 32 weights per block
constexpr int64_t sub_blocks(Format f) { return is_k_quant(f) ? 8 : 1; }
constexpr int64_t header_bytes(Format f) {
  switch (f) {
    case Format::kQ4_1: case Format::kQ5_1: return 4;
    case Format::kQ4_K: case Format::kQ5_K: return 16;
    case Format::kQ6_K: return 18;
    case Format::kMXFP4: return 1;
    default: return 2;
  }
}
// high bits per element beyond the low nibble (Q8_0's bytes are whole: 0 too)
constexpr int extra_bits(Format f) {
  switch (f) {
    case Format::kQ5_0: case Format::kQ5_1: case Format::kQ5_K: return 1;
    case Format::kQ6_K: return 2;
    default: return 0;
  }
}
// one sub-block's quant bytes (per column)
constexpr int64_t quant_bytes(Format f) {
  return f == Format::kQ8_0 ? 32 : 16 + extra_bits(f) * 4;
}
constexpr int64_t block_bytes(Format f) { return header_bytes(f) + sub_blocks(f) * quant_bytes(f); }
// the value subtracted from every quant (Q6_K's per 16 weights); MXFP4's nibbles look their
// values up as the unsigned 0..24, the doubled FP4 value plus 12
constexpr int32_t zero_point(Format f) {
  switch (f) {
    case Format::kQ4_0: return 8;
    case Format::kQ5_0: return 16;
    case Format::kQ6_K: return 32;
    case Format::kMXFP4: return 12;
    default: return 0;
  }
}
// every quant (once looked up) is below this: 16, 32 or 64
constexpr int32_t quant_bound(Format f) {
  return f == Format::kMXFP4 ? 32 : int32_t{16} << extra_bits(f);
}
// formats whose weight is d q + m (per sub-block): an offset times x's block sum
constexpr bool has_min(Format f) {
  return f == Format::kQ4_1 || f == Format::kQ5_1 || f == Format::kQ4_K || f == Format::kQ5_K;
}
constexpr bool is_legacy(Format f) {
  return f == Format::kQ4_0 || f == Format::kQ4_1 || f == Format::kQ8_0;
}

constexpr Format kFormats[] = {Format::kQ4_0, Format::kQ4_1, Format::kQ8_0,
                               Format::kQ5_0, Format::kQ5_1, Format::kQ4_K,
                               Format::kQ5_K, Format::kQ6_K, Format::kMXFP4};

// The format whose blocks are `bytes` long per column, or none.
inline std::optional<Format> format_of(int64_t bytes) {
  for (Format f : kFormats) {
    if (bytes == block_bytes(f)) return f;
  }
  return std::nullopt;
}

// fn(std::integral_constant<Format, f>()): a kernel templated on the format, picked at run time;
// `with_legacy_format` for kernels of Q4_0, Q4_1 and Q8_0 alone (callers check `is_legacy`).
template <class Fn>
void with_legacy_format(Format f, Fn&& fn) {
  switch (f) {
    case Format::kQ4_1: return fn(std::integral_constant<Format, Format::kQ4_1>());
    case Format::kQ8_0: return fn(std::integral_constant<Format, Format::kQ8_0>());
    default: return fn(std::integral_constant<Format, Format::kQ4_0>());
  }
}
template <class Fn>
void with_format(Format f, Fn&& fn) {
  switch (f) {
    case Format::kQ5_0: return fn(std::integral_constant<Format, Format::kQ5_0>());
    case Format::kQ5_1: return fn(std::integral_constant<Format, Format::kQ5_1>());
    case Format::kQ4_K: return fn(std::integral_constant<Format, Format::kQ4_K>());
    case Format::kQ5_K: return fn(std::integral_constant<Format, Format::kQ5_K>());
    case Format::kQ6_K: return fn(std::integral_constant<Format, Format::kQ6_K>());
    case Format::kMXFP4: return fn(std::integral_constant<Format, Format::kMXFP4>());
    default: return with_legacy_format(f, fn);
  }
}
