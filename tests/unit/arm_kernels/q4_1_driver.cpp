// Standalone test program for the Q4_1 x int8 tile (spec_backend/cpu/csrc/q4_1_tile.h): no torch, so it
// builds with a cross compiler and runs under qemu (tests/unit/test_arm_variants.py builds it once per ISA
// variant with -DSPEC_ISA_<VARIANT> and that variant's flags).
//
// stdin, whitespace-separated integers: M G T S, then xq [M, G, 32] (int8), xd [M, G] and xs [M, G]
// (float32 bits), codes [T, G, 256] (bytes), scale [T, G, 16] and low [T, G, 16] (float32 bits if S is
// 32, binary16 bits if S is 16).
// stdout: for each row tile R = 1 .. 5 (M a multiple of 60), a line "R" then out [M, 16 T] as
// float32 bits, one row per line, every row computed in chunks of R rows as q4_1_mm.cpp's rows_tile does.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <vector>

#include "q4_1_tile.h"

namespace {

using spec_backend_native::kBlock;
using spec_backend_native::kLanes;
using spec_backend_native::kTileBytes;
using spec_backend_native::Half;
using spec_backend_native::Q4Problem;

template <typename T>
std::vector<T> read_ints(int64_t n) {
  std::vector<T> v(n);
  for (auto& e : v) {
    int64_t i = 0;
    std::cin >> i;
    e = static_cast<T>(i);
  }
  return v;
}

std::vector<float> read_floats(int64_t n) {
  std::vector<float> v(n);
  for (auto& e : v) {
    uint32_t bits = 0;
    std::cin >> bits;
    std::memcpy(&e, &bits, sizeof(e));
  }
  return v;
}

template <int R, typename S>
void run(const Q4Problem<S>& p, int64_t m_rows, int64_t tiles) {
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t m0 = 0; m0 < m_rows; m0 += R) spec_backend_native::q4_1_tile<R>(p, t, m0);
}

// Every row tile's output (the header comment's stdout).
template <typename S>
void print_every_row_tile(const Q4Problem<S>& p, int64_t m_rows, int64_t tiles, std::vector<float>& out) {
  for (int r = 1; r <= 5; ++r) {
    std::fill(out.begin(), out.end(), -1.0f);
    if (r == 1) run<1>(p, m_rows, tiles);
    if (r == 2) run<2>(p, m_rows, tiles);
    if (r == 3) run<3>(p, m_rows, tiles);
    if (r == 4) run<4>(p, m_rows, tiles);
    if (r == 5) run<5>(p, m_rows, tiles);
    std::printf("R %d\n", r);
    for (int64_t i = 0; i < m_rows; ++i) {
      for (int64_t n = 0; n < p.n_out; ++n) {
        uint32_t bits;
        std::memcpy(&bits, &out[i * p.n_out + n], sizeof(bits));
        std::printf(n ? " %u" : "%u", bits);
      }
      std::printf("\n");
    }
  }
}

}  // namespace

int main() {
  int64_t m_rows = 0, groups = 0, tiles = 0, scale_bits = 0;
  std::cin >> m_rows >> groups >> tiles >> scale_bits;
  if (!std::cin || m_rows <= 0 || m_rows % 60 != 0 || groups <= 0 || tiles <= 0 ||
      (scale_bits != 32 && scale_bits != 16)) {
    std::fprintf(stderr, "want M G T S with M a positive multiple of 60, G > 0, T > 0, S 32 or 16\n");
    return 2;
  }
  const auto xq = read_ints<int8_t>(m_rows * groups * kBlock);
  const auto xd = read_floats(m_rows * groups), xs = read_floats(m_rows * groups);
  const auto codes = read_ints<uint8_t>(tiles * groups * kTileBytes);
  const int64_t lanes = tiles * groups * kLanes;
  std::vector<float> scale, low;
  std::vector<Half> scale16(lanes), low16(lanes);
  if (scale_bits == 32) {
    scale = read_floats(lanes);
    low = read_floats(lanes);
  } else {
    for (auto* v : {&scale16, &low16})
      for (auto& h : *v) h.bits = read_ints<uint16_t>(1)[0];
  }
  if (!std::cin) {
    std::fprintf(stderr, "the input ended early\n");
    return 2;
  }
  const int64_t n_out = tiles * kLanes;
  std::vector<float> out(m_rows * n_out);
  if (scale_bits == 32)
    print_every_row_tile(Q4Problem<float>{xq.data(), xd.data(), xs.data(), codes.data(), scale.data(), low.data(),
                                          out.data(), groups, n_out},
                         m_rows, tiles, out);
  else
    print_every_row_tile(Q4Problem<Half>{xq.data(), xd.data(), xs.data(), codes.data(), scale16.data(),
                                         low16.data(), out.data(), groups, n_out},
                         m_rows, tiles, out);
  return 0;
}
