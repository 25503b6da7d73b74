// A cache prefetch hint at any address. The kernels stream their weights once per decode step, and the
// hardware prefetchers alone leave the cores waiting on memory; they ask for the weights a few kilobytes
// ahead of the ones they compute (q4_1.h, q8_0_gemm.cpp). A hint changes no result.
#pragma once

#include <cstdint>

namespace spec_backend_native {

// Prefetches (for reading, into every cache level) the line at base + bytes. Past the end of an array
// the address points at nothing, which a prefetch allows (it never faults); it is computed as an integer,
// not as an out-of-range pointer, and without a bounds check (one in the Q4_1 tile's loop cost a fifth
// of a 1-row product's time).
inline void prefetch_at(const void* base, int64_t bytes) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(base) + bytes), 0, 3);
}

}  // namespace spec_backend_native
