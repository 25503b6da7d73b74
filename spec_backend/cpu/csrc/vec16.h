// 16-lane float32 vectors shared by the native kernels, held in the widest registers of the ISA variant
// being built: one 512-bit register (AVX-512), two 256-bit ones (AVX2, AVX-VNNI) or four 128-bit ones
// (generic: SSE2 on x86-64, NEON on ARM). GCC gives a 64-byte vector type no register on a narrower ISA
// and then moves every value through the stack (20x slower on AVX2), hence the parts. Lane l of a v16f
// is lane l % kWidth of part l / kWidth; every operation is lane-wise (a * b + c contracts to one FMA
// where the ISA has it, as before), except sum16, whose order is fixed, so results never depend on how
// the compiler schedules it. Also: an exp of non-positive values.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "isa.h"

#if defined(SPEC_ISA_AVX512_VNNI) || defined(SPEC_ISA_AVX_VNNI) || defined(SPEC_ISA_AVX2)
#include <immintrin.h>
#elif defined(SPEC_ISA_NEON_DOTPROD) || defined(SPEC_ISA_NEON)
#include <arm_neon.h>
#endif

namespace spec_backend_native {

#if defined(SPEC_ISA_AVX512_VNNI)
constexpr int kWidth = 16;  // float32 lanes per register
#elif defined(SPEC_ISA_AVX_VNNI) || defined(SPEC_ISA_AVX2)
constexpr int kWidth = 8;
#else
constexpr int kWidth = 4;
#endif
constexpr int kParts = 16 / kWidth;

typedef float vf __attribute__((vector_size(4 * kWidth)));    // one register of float32
typedef int32_t vi __attribute__((vector_size(4 * kWidth)));  // one register of int32
typedef float v4f __attribute__((vector_size(16)));
// vf at any float's address: one unaligned vector load or store (a memcpy of 64 bytes would move through
// the stack in 16-byte pieces under GCC's generic tuning, then stall on reloading them as wider vectors)
typedef float vf_any __attribute__((vector_size(4 * kWidth), aligned(4), may_alias));

struct v16f {
  vf p[kParts];
};

// a (op) b lane by lane, for two vectors or a vector and a scalar on either side.
#define SPEC_LANEWISE(op)                                                                   \
  inline v16f operator op(v16f a, v16f b) {                                                 \
    for (int i = 0; i < kParts; ++i) a.p[i] = a.p[i] op b.p[i];                             \
    return a;                                                                               \
  }                                                                                         \
  inline v16f operator op(v16f a, float b) {                                                \
    for (int i = 0; i < kParts; ++i) a.p[i] = a.p[i] op b;                                  \
    return a;                                                                               \
  }                                                                                         \
  inline v16f operator op(float a, v16f b) {                                                \
    for (int i = 0; i < kParts; ++i) b.p[i] = a op b.p[i];                                  \
    return b;                                                                               \
  }                                                                                         \
  inline v16f& operator op##=(v16f& a, v16f b) { return a = a op b; }
SPEC_LANEWISE(+)
SPEC_LANEWISE(-)
SPEC_LANEWISE(*)
SPEC_LANEWISE(/)
#undef SPEC_LANEWISE

inline v16f load16(const float* p) {
  v16f v;
  for (int i = 0; i < kParts; ++i) v.p[i] = *reinterpret_cast<const vf_any*>(p + i * kWidth);
  return v;
}

// a * b + c lane by lane (one register: fma_lanes; 16 lanes: fma16) as one FMA instruction on the SIMD
// variants (x86 and NEON), whatever the compiler's contraction heuristics would choose (GCC's avoidance
// of FMA chains on 256-bit vectors depends on the surrounding loop, so an accumulation written as
// a * b + c could round once in one instantiation of a tile and twice in another: a row's result would
// depend on the batch). On the generic variant a * b + c as written: x86-64 without FMA has no
// instruction to contract it into, and GCC on aarch64 contracts it wherever it can.
inline vf fma_lanes(vf a, vf b, vf c) {
#if defined(SPEC_ISA_AVX512_VNNI)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(SPEC_ISA_AVX_VNNI) || defined(SPEC_ISA_AVX2)
  return _mm256_fmadd_ps(a, b, c);
#elif defined(SPEC_ISA_NEON_DOTPROD) || defined(SPEC_ISA_NEON)
  return vfmaq_f32(c, a, b);
#else
  return a * b + c;
#endif
}

inline v16f fma16(v16f a, v16f b, v16f c) {
  for (int i = 0; i < kParts; ++i) c.p[i] = fma_lanes(a.p[i], b.p[i], c.p[i]);
  return c;
}

inline void store16(float* p, v16f v) {
  for (int i = 0; i < kParts; ++i) *reinterpret_cast<vf_any*>(p + i * kWidth) = v.p[i];
}

// The 16 lanes summed pairwise in one fixed order, s[i] += s[i + w] for w = 8, 4, 2, 1, however the
// register is split: q[j] holds lanes 4j .. 4j+3, so lane i of (q0 + q2) + (q1 + q3) is
// (s[i] + s[i+8]) + (s[i+4] + s[i+12]).
inline float sum16(v16f v) {
  v4f q[4];
  std::memcpy(q, &v, sizeof(q));  // register extracts, not memory
  const v4f b = (q[0] + q[2]) + (q[1] + q[3]);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// v with lanes count .. 15 set to 0 (0 <= count <= 16).
inline v16f zero_from(v16f v, int64_t count) {
  float s[16];
  std::memcpy(s, &v, sizeof(s));
  for (int64_t i = count; i < 16; ++i) s[i] = 0.0f;
  std::memcpy(&v, s, sizeof(s));
  return v;
}

// exp(x) of one register of values x <= 0 (below -87 they count as -87: exp ~ 1e-38): x = k ln2 + r with
// |r| <= ln2/2, exp(r) by its degree-7 Taylor polynomial (relative error < 2e-8 before float32 rounding),
// times 2^k.
inline vf exp_lanes(vf x) {
  const vf floor_x = vf{} - 87.0f;
  x = x < floor_x ? floor_x : x;
  const vi k = __builtin_convertvector(x * 1.44269504f - 0.5f, vi);  // round(x / ln2), x <= 0
  const vf kf = __builtin_convertvector(k, vf);
  const vf r = (x - kf * 0.693359375f) + kf * 2.12194440e-4f;  // ln2 = 0.693359375 - 2.12194440e-4: k * 0.693359375 is exact
  vf p = vf{} + 1.0f / 5040.0f;
  for (float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) p = p * r + c;
  const vi bits = (k + 127) << 23;  // 2^k as float32 bits, k >= -126
  vf scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline v16f exp16(v16f x) {
  for (int i = 0; i < kParts; ++i) x.p[i] = exp_lanes(x.p[i]);
  return x;
}

}  // namespace spec_backend_native
