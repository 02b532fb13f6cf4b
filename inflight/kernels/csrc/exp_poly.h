// A vectorisable exp for the kernels' softmax and SiLU (shared by the translation units).
#pragma once
#include <cstdint>
#include <cstring>

// exp(x) by range reduction (x = n ln2 + r) and a degree-6 polynomial (Cephes' expf
// coefficients): within 2 ulp of libm, and branch-free so the loops around it vectorise.
inline float exp_poly(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);  // 2^n stays a normal float
  const float magic = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504f + magic) - magic;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

