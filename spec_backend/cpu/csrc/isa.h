// The instruction set a native library is built for. spec_backend/cpu/native.py compiles every source
// once per ISA variant (spec_backend/cpu/isa.py lists them) with that variant's -m flags,
// -DSPEC_ISA_<VARIANT>, and -DSPEC_OPS=spec_backend_<variant>: the torch.ops namespace its ops register
// under (TORCH_LIBRARY_FRAGMENT(SPEC_OPS, m)), so several variants can be loaded side by side. Only the
// Q4_1 x int8 tile is written per instruction set (q4_1_<isa>.h, chosen in q4_1_tile.h); the rest is GCC
// vector code that each build lowers to its own registers.
#pragma once

#if defined(SPEC_ISA_AVX512_VNNI)
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__FMA__))
#error "SPEC_ISA_AVX512_VNNI needs -mavx512f -mavx512bw -mavx512vnni -mfma"
#endif
#elif defined(SPEC_ISA_AVX_VNNI)
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__AVXVNNI__))
#error "SPEC_ISA_AVX_VNNI needs -mavx2 -mfma -mavxvnni"
#endif
#elif defined(SPEC_ISA_AVX2)
#if !(defined(__AVX2__) && defined(__FMA__))
#error "SPEC_ISA_AVX2 needs -mavx2 -mfma"
#endif
#elif defined(SPEC_ISA_NEON_DOTPROD)
#if !(defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD))
#error "SPEC_ISA_NEON_DOTPROD needs an aarch64 compiler and -march=armv8.2-a+dotprod"
#endif
#elif defined(SPEC_ISA_NEON)
#if !(defined(__aarch64__) && defined(__ARM_NEON))
#error "SPEC_ISA_NEON needs an aarch64 compiler (NEON is part of Armv8-A)"
#endif
#elif !defined(SPEC_ISA_GENERIC)
#error "build with -DSPEC_ISA_<variant> (spec_backend/cpu/native.py does)"
#endif

#ifndef SPEC_OPS
#error "build with -DSPEC_OPS=<torch.ops namespace> (spec_backend/cpu/native.py does)"
#endif
