// The Q4_1 x int8 tile in portable C++ (no ISA flags): integer dot products one code at a time and
// std::fma, so it gives the SIMD variants' bits. The fallback of any CPU the SIMD variants do not run
// on (slow on x86-64 without FMA, where std::fma is a library call). See q4_1.h.
#pragma once

#include <cmath>

#include "q4_1.h"

namespace spec_backend_native {

// out[m0 + r, 16 t .. 16 t + 15] for r < R. Byte 64 c + 4 j + b of a block's tile holds code 4 c + b of
// feature j in its low nibble and code 16 + 4 c + b in its high nibble.
template <int R, typename S>
void q4_1_tile(const Q4Problem<S>& p, int64_t t, int64_t m0) {
  float acc[R][kLanes] = {};
  for (int64_t g = 0; g < p.groups; ++g) {
    const uint8_t* w = p.codes + (t * p.groups + g) * kTileBytes;
    prefetch_ahead(p, t * p.groups + g);
    const S* d = p.scale + (t * p.groups + g) * kLanes;
    const S* m = p.low + (t * p.groups + g) * kLanes;
    for (int r = 0; r < R; ++r) {
      const int64_t block = (m0 + r) * p.groups + g;
      const int8_t* x = p.xq + block * kBlock;
      for (int j = 0; j < kLanes; ++j) {
        int32_t dot = 0;
        for (int c = 0; c < 4; ++c)
          for (int b = 0; b < 4; ++b) {
            const int byte = w[64 * c + 4 * j + b];
            dot += (byte & 15) * x[4 * c + b] + (byte >> 4) * x[16 + 4 * c + b];
          }
        acc[r][j] = std::fma(static_cast<float>(dot), to_float(d[j]) * p.xd[block], acc[r][j]);
        acc[r][j] = std::fma(to_float(m[j]), p.xs[block], acc[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kLanes; ++j) p.out[(m0 + r) * p.n_out + t * kLanes + j] = acc[r][j];
}

}  // namespace spec_backend_native
