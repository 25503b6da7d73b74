// The Q4_1 x int8 tile on ARM NEON (128-bit registers): with the Armv8.2-A dot product (sdot: 4 signed
// bytes times 4 signed bytes summed into each 32-bit lane) or, on plain Armv8-A, widening multiplies
// (smlal: 8 bytes times 8 bytes into 16-bit lanes) whose lanes are then added in pairs. A tile's 16
// features are four quarters of 4, each the 16 bytes at 16 q of every 64-byte part of the tile's layout
// (the AVX512 one's, q4_1_generic.h). Codes are 0..15, so they are the same numbers as signed bytes.
// See q4_1.h.
#pragma once

#include <arm_neon.h>

#include "q4_1.h"

namespace spec_backend_native {

#if defined(SPEC_ISA_NEON_DOTPROD)
// A row's running dot products of one block: one 32-bit lane per feature.
struct BlockDot {
  int32x4_t sum = vdupq_n_s32(0);
  // Adds codes . x: 4 consecutive codes of each of the 4 features (one feature per 32-bit lane) times
  // the 4 activations in the word x.
  void add(int8x16_t codes, int32_t x) { sum = vdotq_s32(sum, codes, vreinterpretq_s8_s32(vdupq_n_s32(x))); }
  int32x4_t total() const { return sum; }
};
#else
// A row's running dot products of one block in 16-bit lanes: lane i of lo (hi) sums, over the block's
// eight parts, the product of byte i (8 + i) of the part's codes and its activation. Each product is at
// most 15 x 127 = 1905 in size, so eight of them stay below 2^15 (15240): nothing wraps.
struct BlockDot {
  int16x8_t lo = vdupq_n_s16(0), hi = vdupq_n_s16(0);
  void add(int8x16_t codes, int32_t x) {
    const int8x16_t xs = vreinterpretq_s8_s32(vdupq_n_s32(x));
    lo = vmlal_s8(lo, vget_low_s8(codes), vget_low_s8(xs));
    hi = vmlal_high_s8(hi, codes, xs);
  }
  // Each feature's four 16-bit lanes summed: adjacent pairs into 32 bits (features 0, 1 from lo; 2, 3
  // from hi), then the pairs' sums pairwise: [f0, f1, f2, f3].
  int32x4_t total() const { return vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)); }
};
#endif

// 4 scales or minima as float32 lanes (binary16 ones converted exactly by fcvtl).
inline float32x4_t load_scales(const float* p) { return vld1q_f32(p); }
inline float32x4_t load_scales(const Half* p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p))));
}

// Features 4 q .. 4 q + 3 of tile t for rows m0 .. m0 + R - 1. Per block, each part's 16 bytes are
// unpacked once and added to every row's dot products; then, in float32, the two FMAs of q4_1.h.
template <int R, typename S>
void q4_1_quarter_tile(const Q4Problem<S>& p, int64_t t, int64_t m0, int q) {
  const uint8x16_t nibble = vdupq_n_u8(0x0F);
  float32x4_t acc[R];
  for (int r = 0; r < R; ++r) acc[r] = vdupq_n_f32(0.0f);
  for (int64_t g = 0; g < p.groups; ++g) {
    const uint8_t* w = p.codes + (t * p.groups + g) * kTileBytes + 16 * q;
    if (q == 0) prefetch_ahead(p, t * p.groups + g);
    const int8_t* x[R];
    BlockDot dot[R];
    for (int r = 0; r < R; ++r) x[r] = p.xq + ((m0 + r) * p.groups + g) * kBlock;
    for (int c = 0; c < 4; ++c) {  // low nibbles: codes 4c .. 4c+3; high nibbles: codes 16+4c .. 16+4c+3
      const uint8x16_t packed = vld1q_u8(w + 64 * c);
      const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(packed, nibble));
      const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(packed, 4));
      for (int r = 0; r < R; ++r) {
        dot[r].add(lo, word(x[r], c));
        dot[r].add(hi, word(x[r], c + 4));
      }
    }
    const float32x4_t d = load_scales(p.scale + (t * p.groups + g) * kLanes + 4 * q);
    const float32x4_t m = load_scales(p.low + (t * p.groups + g) * kLanes + 4 * q);
    for (int r = 0; r < R; ++r) {
      const int64_t block = (m0 + r) * p.groups + g;
      const float32x4_t total = vcvtq_f32_s32(dot[r].total());  // exact: |dot| <= 60960 < 2^24
      acc[r] = vfmaq_f32(acc[r], total, vmulq_n_f32(d, p.xd[block]));  // fma(dot, d * xd, acc)
      acc[r] = vfmaq_n_f32(acc[r], m, p.xs[block]);                    // fma(low, xs, acc)
    }
  }
  for (int r = 0; r < R; ++r) vst1q_f32(p.out + (m0 + r) * p.n_out + t * kLanes + 4 * q, acc[r]);
}

// out[m0 + r, 16 t .. 16 t + 15] for r < R, one quarter at a time.
template <int R, typename S>
void q4_1_tile(const Q4Problem<S>& p, int64_t t, int64_t m0) {
  for (int q = 0; q < 4; ++q) q4_1_quarter_tile<R>(p, t, m0, q);
}

}  // namespace spec_backend_native
