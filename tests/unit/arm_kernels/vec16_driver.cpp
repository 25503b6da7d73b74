// Standalone test program for the 16-lane vectors of spec_backend/cpu/csrc/vec16.h: no torch, so it builds
// with a cross compiler and runs under qemu (tests/unit/test_arm_variants.py builds it once per ISA
// variant with -DSPEC_ISA_<VARIANT> and that variant's flags).
//
// stdin, whitespace-separated integers: n (a multiple of 16), then a [n], b [n] and e [n] (e <= 0), all
// float32 bits. stdout, float32 bits: a line "sum16" with sum16 of each 16 values of a; a line "dot" with,
// for k = 1 .. n / 16, the dot product of a and b over their first 16 k values as attention_rows.cpp
// computes one (acc += a * b per 16 lanes, then sum16); a line "exp" with exp16 of each 16 values of e.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <vector>

#include "vec16.h"

namespace {

using spec_backend_native::exp16;
using spec_backend_native::load16;
using spec_backend_native::store16;
using spec_backend_native::sum16;
using spec_backend_native::v16f;

std::vector<float> read_floats(int64_t n) {
  std::vector<float> v(n);
  for (auto& e : v) {
    uint32_t bits = 0;
    std::cin >> bits;
    std::memcpy(&e, &bits, sizeof(e));
  }
  return v;
}

void print(const char* name, const std::vector<float>& values) {
  std::printf("%s", name);
  for (float f : values) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    std::printf(" %u", bits);
  }
  std::printf("\n");
}

}  // namespace

int main() {
  int64_t n = 0;
  std::cin >> n;
  if (!std::cin || n <= 0 || n % 16 != 0) {
    std::fprintf(stderr, "want n, a positive multiple of 16\n");
    return 2;
  }
  const auto a = read_floats(n), b = read_floats(n), e = read_floats(n);
  if (!std::cin) {
    std::fprintf(stderr, "the input ended early\n");
    return 2;
  }
  std::vector<float> sums, dots, exps(n);
  v16f acc = {};
  for (int64_t i = 0; i < n; i += 16) {
    sums.push_back(sum16(load16(a.data() + i)));
    acc += load16(a.data() + i) * load16(b.data() + i);
    dots.push_back(sum16(acc));
    store16(exps.data() + i, exp16(load16(e.data() + i)));
  }
  print("sum16", sums);
  print("dot", dots);
  print("exp", exps);
  return 0;
}
