// The kernels' argument checks: TORCH_CHECK, with the message joined here without iostreams.
// c10::str formats numbers through a std::ostringstream instantiated in this library, and where
// the compiler's libstdc++ and the one torch's wheel was built with disagree (seen: GCC 13.3 with
// torch 2.11 on Ubuntu 24.04), inserting a number segfaults where it should raise.
#pragma once
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <string>
#include <type_traits>

namespace inflight {

inline void append_to(std::string& s, const char* v) { s += v; }
inline void append_to(std::string& s, const std::string& v) { s += v; }
inline void append_to(std::string& s, c10::ScalarType v) { s += c10::toString(v); }
template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
void append_to(std::string& s, T v) {
  s += std::to_string(v);
}
inline void append_to(std::string& s, c10::IntArrayRef v) {  // a shape: [2, 3]
  s += "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  s += "]";
}

template <typename... Args>
std::string joined(const Args&... args) {
  std::string s;
  (append_to(s, args), ...);
  return s;
}

}  // namespace inflight

// Arguments are evaluated only when the check fails, as TORCH_CHECK's are.
#define INFLIGHT_CHECK(cond, ...) TORCH_CHECK(cond, ::inflight::joined(__VA_ARGS__))
