// The Q4_1 x int8 tile on AVX512-VNNI: 16 output features in one 512-bit register, each block's dot
// products by vpdpbusd (4 unsigned codes times 4 signed activations per 32-bit lane). See q4_1.h.
#pragma once

#include <immintrin.h>

#include "q4_1.h"

namespace spec_backend_native {

// 16 scales or minima as float32 lanes (binary16 ones converted exactly by vcvtph2ps).
inline __m512 load_scales(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_scales(const Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// out[m0 + r, 16 t .. 16 t + 15] for r < R: tile t's codes are unpacked once per block for R rows.
template <int R, typename S>
void q4_1_tile(const Q4Problem<S>& p, int64_t t, int64_t m0) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < p.groups; ++g) {
    const uint8_t* w = p.codes + (t * p.groups + g) * kTileBytes;
    prefetch_ahead(p, t * p.groups + g);
    __m512i part[8];  // part c: codes 4c .. 4c+3 of each of the 16 features, one per 32-bit lane
    for (int c = 0; c < 4; ++c) {
      const __m512i packed = _mm512_loadu_si512(w + 64 * c);
      part[c] = _mm512_and_si512(packed, nibble);
      part[c + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
    }
    const __m512 d = load_scales(p.scale + (t * p.groups + g) * kLanes);
    const __m512 m = load_scales(p.low + (t * p.groups + g) * kLanes);
    for (int r = 0; r < R; ++r) {
      const int64_t block = (m0 + r) * p.groups + g;
      const int8_t* x = p.xq + block * kBlock;
      __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) {
        lo = _mm512_dpbusd_epi32(lo, part[c], _mm512_set1_epi32(word(x, c)));
        hi = _mm512_dpbusd_epi32(hi, part[c + 4], _mm512_set1_epi32(word(x, c + 4)));
      }
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi));
      acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, _mm512_set1_ps(p.xd[block])), acc[r]);
      acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(p.xs[block]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(p.out + (m0 + r) * p.n_out + t * kLanes, acc[r]);
}

}  // namespace spec_backend_native
