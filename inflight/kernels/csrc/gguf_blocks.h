// The GGUF block formats the CPU kernels multiply from: 32 weights per block, an fp16 scale d
// (and for Q4_1 an fp16 offset m), then the quants: 16 bytes of nibbles (Q4_0, Q4_1) or 32 int8
// (Q8_0). gguf_linear.cpp reads the file's blocks as they are; gguf_int_linear.cpp reads them
// regrouped eight columns at a time.
#pragma once
#include <cstdint>
#include <optional>
#include <type_traits>

constexpr int64_t kBlock = 32;  // weights per block, in all three formats
enum class Format { kQ4_0, kQ4_1, kQ8_0 };

constexpr int64_t header_bytes(Format f) { return f == Format::kQ4_1 ? 4 : 2; }
constexpr int64_t block_bytes(Format f) {
  return header_bytes(f) + (f == Format::kQ8_0 ? 32 : 16);
}

// The format whose blocks are `bytes` long (18, 20 or 34), or none.
inline std::optional<Format> format_of(int64_t bytes) {
  for (Format f : {Format::kQ4_0, Format::kQ4_1, Format::kQ8_0}) {
    if (bytes == block_bytes(f)) return f;
  }
  return std::nullopt;
}

// fn(std::integral_constant<Format, f>()): a kernel templated on the format, picked at run time.
template <class Fn>
void with_format(Format f, Fn&& fn) {
  switch (f) {
    case Format::kQ4_0: return fn(std::integral_constant<Format, Format::kQ4_0>());
    case Format::kQ4_1: return fn(std::integral_constant<Format, Format::kQ4_1>());
    case Format::kQ8_0: return fn(std::integral_constant<Format, Format::kQ8_0>());
  }
}
