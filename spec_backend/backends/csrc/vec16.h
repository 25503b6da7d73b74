// 16-lane float32 vectors (GCC vector extensions: AVX-512 where the CPU has it, narrower SIMD or scalar
// code elsewhere) shared by the native kernels, with a horizontal sum in one fixed order so results do
// not depend on how the compiler schedules it.
#pragma once

#include <cstring>

namespace spec_backend_native {

typedef float v16f __attribute__((vector_size(64)));

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

}  // namespace spec_backend_native
