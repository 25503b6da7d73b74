// The Q4_1 x int8 tile of the ISA variant being built (isa.h): q4_1_tile<R>(problem, t, m0) from
// q4_1_<isa>.h. q4_1_mm.cpp and the standalone kernel tests (tests/unit/arm_kernels/) include this, so
// both run the tile a variant's build picks.
#pragma once

#include "isa.h"
#include "q4_1.h"

#if defined(SPEC_ISA_AVX512_VNNI)
#include "q4_1_avx512.h"
#elif defined(SPEC_ISA_AVX_VNNI) || defined(SPEC_ISA_AVX2)
#include "q4_1_avx256.h"
#elif defined(SPEC_ISA_NEON_DOTPROD) || defined(SPEC_ISA_NEON)
#include "q4_1_neon.h"
#else
#include "q4_1_generic.h"
#endif
