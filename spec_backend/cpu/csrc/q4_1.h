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

namespace spec_backend_native {

constexpr int64_t kBlock = 32;       // weights per block
constexpr int64_t kLanes = 16;       // output features per tile
constexpr int64_t kTileBytes = 256;  // one tile's codes for one block: 16 features x 32 codes x 4 bits
constexpr int kRowTile = 5;          // activation rows sharing one unpack of a tile's codes (K+1 at K=4)

// The product's operands: activations as int8 codes [M, K] with, per block of 32, their scale [M, G]
// and scale * sum(codes) [M, G]; weights as tiles [N/16, G, 256] with scales and minima [N/16, G, 16].
struct Q4Problem {
  const int8_t* xq;
  const float* xd;
  const float* xs;
  const uint8_t* codes;
  const float* scale;
  const float* low;
  float* out;  // [M, N]
  int64_t groups, n_out;
};

// Activation bytes 4c .. 4c+3 of a block as one 32-bit word (what a dot-product lane multiplies).
inline int32_t word(const int8_t* block, int c) {
  int32_t w;
  std::memcpy(&w, block + 4 * c, sizeof(w));
  return w;
}

}  // namespace spec_backend_native
