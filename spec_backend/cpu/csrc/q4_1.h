// GGUF Q4_1 weights times activations quantized per 32 values to int8: what the per-ISA tiles
// (q4_1_<isa>.h) share. The glossary and the weight layout are in spec_backend/cpu/int4_linear.py.
//
// Every variant computes an output the same way: for each block g in order, the exact integer dot
// product of the block's 4-bit codes with the row's int8 codes, then, in float32,
//   acc = fma(float(dot), scale_w * scale_x, acc);  acc = fma(low_w, scale_x * sum(codes_x), acc)
// so a row's result does not depend on the batch, and the SIMD variants give one another's bits.
#pragma once

#include <cstdint>
#include <cstring>

#include "prefetch.h"

namespace spec_backend_native {

constexpr int64_t kBlock = 32;       // weights per block
constexpr int64_t kLanes = 16;       // output features per tile
constexpr int64_t kTileBytes = 256;  // one tile's codes for one block: 16 features x 32 codes x 4 bits
constexpr int kRowTile = 5;          // activation rows sharing one unpack of a tile's codes (K+1 at K=4)

// An IEEE binary16 value (a GGUF Q4_1 block's scale or minimum as the file stores it) as its 16 bits.
struct Half {
  uint16_t bits;
};
static_assert(sizeof(Half) == 2, "Half must be the 16 bits alone: an array of them is a float16 tensor's data");

// The binary16 value h as float32: exact (every binary16 value is a float32 value), subnormals included.
inline float to_float(Half h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exponent = (h.bits >> 10) & 0x1Fu, mantissa = h.bits & 0x3FFu;
  uint32_t out = sign;
  if (exponent == 0x1Fu) {
    out |= 0x7F800000u | (mantissa << 13);  // infinity or NaN
  } else if (exponent != 0) {
    out |= ((exponent + 112u) << 23) | (mantissa << 13);  // rebias 15 -> 127
  } else if (mantissa != 0) {                                // subnormal: m * 2^-24, normal in float32
    int shift = 0;
    uint32_t m = mantissa;
    while (!(m & 0x400u)) {
      m <<= 1;
      ++shift;
    }
    out |= ((113u - static_cast<uint32_t>(shift)) << 23) | ((m & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &out, sizeof(f));
  return f;
}
inline float to_float(float f) { return f; }

// The product's operands: activations as int8 codes [M, K] with, per block of 32, their scale [M, G]
// and scale * sum(codes) [M, G]; weights as tiles [N/16, G, 256] with scales and minima [N/16, G, 16],
// of type S: float32, or binary16 (Half) where every one of them is a binary16 value, as in a GGUF Q4_1
// file (a fifth fewer bytes per weight; the product's bits are the same, the conversion being exact).
template <typename S>
struct Q4Problem {
  const int8_t* xq;
  const float* xd;
  const float* xs;
  const uint8_t* codes;
  const S* scale;
  const S* low;
  float* out;  // [M, N]
  int64_t groups, n_out;
};

// Asks for block `block` + kAhead's codes, scales and minima (the same tile's, or the next tile's: blocks
// are contiguous in tile order) to be brought into the cache while `block` is computed. A decode step
// streams every weight once from memory, and the hardware prefetchers alone leave the cores waiting on
// it (a fifth of a 1-row product's time on the reference machine: docs/benchmarks.md). A hint only: the
// arithmetic, and so the bits, are unchanged; past the last block it asks for nothing (prefetch.h).
constexpr int64_t kAhead = 12;  // blocks: 3 KB of codes ahead

template <typename S>
inline void prefetch_ahead(const Q4Problem<S>& p, int64_t block) {
  const int64_t next = block + kAhead;
  for (int c = 0; c < 4; ++c) prefetch_at(p.codes, next * kTileBytes + 64 * c);
  prefetch_at(p.scale, next * kLanes * static_cast<int64_t>(sizeof(S)));
  prefetch_at(p.low, next * kLanes * static_cast<int64_t>(sizeof(S)));
}

// Activation bytes 4c .. 4c+3 of a block as one 32-bit word (what a dot-product lane multiplies).
inline int32_t word(const int8_t* block, int c) {
  int32_t w;
  std::memcpy(&w, block + 4 * c, sizeof(w));
  return w;
}

}  // namespace spec_backend_native
