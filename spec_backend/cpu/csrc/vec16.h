// 16-lane float32 vectors (GCC vector extensions: AVX-512 where the CPU has it, narrower SIMD or scalar
// code elsewhere) shared by the native kernels, with a horizontal sum in one fixed order so results do
// not depend on how the compiler schedules it, and an exp of non-positive values.
#pragma once

#include <cstdint>
#include <cstring>

namespace spec_backend_native {

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

inline v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float sum16(v16f v) {  // a fixed pairwise order
  float s[16];
  std::memcpy(s, &v, sizeof(s));
  for (int w = 8; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) s[i] += s[i + w];
  return s[0];
}

// exp(x) of 16 values x <= 0 (below -87 they count as -87: exp ~ 1e-38): x = k ln2 + r with |r| <= ln2/2,
// exp(r) by its degree-7 Taylor polynomial (relative error < 2e-8 before float32 rounding), times 2^k.
inline v16f exp16(v16f x) {
  const v16f floor_x = v16f{} - 87.0f;
  x = x < floor_x ? floor_x : x;
  const v16i k = __builtin_convertvector(x * 1.44269504f - 0.5f, v16i);  // round(x / ln2), x <= 0
  const v16f kf = __builtin_convertvector(k, v16f);
  const v16f r = (x - kf * 0.693359375f) + kf * 2.12194440e-4f;  // ln2 = 0.693359375 - 2.12194440e-4: k * 0.693359375 is exact
  v16f p = v16f{} + 1.0f / 5040.0f;
  for (float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) p = p * r + c;
  const v16i bits = (k + 127) << 23;  // 2^k as float32 bits, k >= -126
  v16f scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

}  // namespace spec_backend_native
