// The Q4_1 x int8 tile on 256-bit registers: AVX-VNNI (vpdpbusd, VEX-encoded) or AVX2 + FMA (vpmaddubsw
// then vpmaddwd). A tile's 16 features are two halves of 8, each the 32 bytes at 32 h of every 64-byte
// part of the tile's layout (the AVX512 one's). See q4_1.h.
#pragma once

#include <immintrin.h>

#include "q4_1.h"

namespace spec_backend_native {

// Adds codes . activations of one part to a row's running dot products. codes: 4 consecutive 4-bit codes
// of each of the 8 features (one feature per 32-bit lane); x: the 4 activations they multiply, as one
// word. AVX-VNNI sums them into 32-bit lanes directly. AVX2's vpmaddubsw sums two adjacent products into
// 16 bits (|sum| <= 2 x 15 x 127); a block's eight parts add up to at most 16 x 15 x 127 = 30480 < 2^15,
// so nothing saturates or wraps, and dot32 adds each lane's two 16-bit halves.
inline __m256i add_part(__m256i sum, __m256i codes, int32_t x) {
#if defined(SPEC_ISA_AVX_VNNI)
  return _mm256_dpbusd_avx_epi32(sum, codes, _mm256_set1_epi32(x));
#else
  return _mm256_add_epi16(sum, _mm256_maddubs_epi16(codes, _mm256_set1_epi32(x)));
#endif
}

inline __m256i dot32(__m256i sum) {
#if defined(SPEC_ISA_AVX_VNNI)
  return sum;
#else
  return _mm256_madd_epi16(sum, _mm256_set1_epi16(1));
#endif
}

// 8 scales or minima as float32 lanes (binary16 ones converted exactly by F16C's vcvtph2ps).
inline __m256 load_scales(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_scales(const Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Features 8 h .. 8 h + 7 of tile t for rows m0 .. m0 + R - 1. Per block, each 32-byte part is unpacked
// once and added to every row's dot products (one part live at a time: R = 5 rows take 14 of the 16 registers).
template <int R, typename S>
void q4_1_half_tile(const Q4Problem<S>& p, int64_t t, int64_t m0, int h) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < p.groups; ++g) {
    const uint8_t* w = p.codes + (t * p.groups + g) * kTileBytes + 32 * h;
    if (h == 0) prefetch_ahead(p, t * p.groups + g);
    const int8_t* x[R];
    __m256i sum[R];
    for (int r = 0; r < R; ++r) {
      x[r] = p.xq + ((m0 + r) * p.groups + g) * kBlock;
      sum[r] = _mm256_setzero_si256();
    }
    for (int c = 0; c < 4; ++c) {  // low nibbles: codes 4c .. 4c+3; high nibbles: codes 16+4c .. 16+4c+3
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * c));
      const __m256i lo = _mm256_and_si256(packed, nibble);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
      for (int r = 0; r < R; ++r) {
        sum[r] = add_part(add_part(sum[r], lo, word(x[r], c)), hi, word(x[r], c + 4));
        // Pins the sum in its register here: without it GCC defers the 16-bit additions, keeps every
        // vpmaddubsw result for later and spills them to the stack (a fifth of a 5-row product's time).
        __asm__("" : "+x"(sum[r]));
      }
    }
    const __m256 d = load_scales(p.scale + (t * p.groups + g) * kLanes + 8 * h);
    const __m256 m = load_scales(p.low + (t * p.groups + g) * kLanes + 8 * h);
    for (int r = 0; r < R; ++r) {
      const int64_t block = (m0 + r) * p.groups + g;
      const __m256 dot = _mm256_cvtepi32_ps(dot32(sum[r]));
      acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(d, _mm256_set1_ps(p.xd[block])), acc[r]);
      acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(p.xs[block]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(p.out + (m0 + r) * p.n_out + t * kLanes + 8 * h, acc[r]);
}

// out[m0 + r, 16 t .. 16 t + 15] for r < R, one half at a time.
template <int R, typename S>
void q4_1_tile(const Q4Problem<S>& p, int64_t t, int64_t m0) {
  q4_1_half_tile<R>(p, t, m0, 0);
  q4_1_half_tile<R>(p, t, m0, 1);
}

}  // namespace spec_backend_native
