// Few-row products with GGUF Q8_0 weights kept packed (int8 codes, one float32 scale per 32 weights) and
// float32 activations; the glossary and the layout are in spec_backend/cpu/q8_0_projection.py. k8_mm is
// the same product for weights w = scale * code + low with a scale and an offset per 16 codes, or (low
// empty) w = scale * code with a scale per 32 as Q8_0 (the GGUF blocks once read:
// spec_backend/cpu/kquant_linear.py).
// Each output element is computed by the same instruction sequence whatever the number of rows (every
// row runs the same unrolled body), so a row's result does not depend on the batch it is computed in.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "isa.h"
#include "native_ops.h"
#include "prefetch.h"
#include "vec16.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(SPEC_ISA_AVX512_VNNI) || defined(SPEC_ISA_AVX_VNNI) || defined(SPEC_ISA_AVX2)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlock = 32;    // weights per Q8_0 block
constexpr int kRowTile = 8;       // activation rows sharing one decode of a block
constexpr int64_t kColTile = 16;  // output features per task: their codes stay in L1 across row tiles

using spec_backend_native::fma16;
using spec_backend_native::fma_lanes;
using spec_backend_native::kParts;
using spec_backend_native::load16;
using spec_backend_native::sum16;
using spec_backend_native::v16f;
using spec_backend_native::vf;

// Q8_0 block codes: 32 signed bytes, code j is byte j; decoded to float32 lanes 0-15 and 16-31 (with the
// ISA's sign-extending loads: GCC turns a generic int8 -> int32 vector conversion into scalar code).
struct Q80 {
  static constexpr int64_t kBytes = 32;
  static inline void decode(const int8_t* p, v16f& lo, v16f& hi) {
#if defined(SPEC_ISA_AVX512_VNNI)
    const __m128i* q = reinterpret_cast<const __m128i*>(p);
    const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q)));
    const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1)));
    std::memcpy(&lo.p[0], &a, sizeof(a));
    std::memcpy(&hi.p[0], &b, sizeof(b));
#elif defined(SPEC_ISA_AVX_VNNI) || defined(SPEC_ISA_AVX2)
    const auto eight = [](const int8_t* codes) {  // 8 codes -> one 256-bit register of float32
      return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes))));
    };
    for (int i = 0; i < 2; ++i) {
      const __m256 a = eight(p + 8 * i), b = eight(p + 16 + 8 * i);
      std::memcpy(&lo.p[i], &a, sizeof(a));
      std::memcpy(&hi.p[i], &b, sizeof(b));
    }
#else
    float f[32];
    for (int j = 0; j < 32; ++j) f[j] = static_cast<float>(p[j]);
    lo = load16(f);
    hi = load16(f + 16);
#endif
  }
};

struct Problem {
  const float* x;         // [M, K]
  const int8_t* codes;    // [N, K]
  const float* scale;     // [N, K/32], or [N, K/16] with low
  const float* low;       // nullptr, or [N, K/16]
  float* out;             // [M, N]
  int64_t k, n_out;
};

// Asks for the codes kAhead bytes past code `at` (the next features': they are contiguous) and their
// scales (and offsets) to be brought into the cache while this block is computed: a decode step streams
// the head once from memory, and the hardware prefetchers alone leave the cores waiting on it. A hint
// only: the arithmetic, and so the bits, are unchanged; past the end it asks for nothing (prefetch.h).
constexpr int64_t kAhead = 4096;

template <bool kLow>
inline void prefetch_ahead(const Problem& p, int64_t at) {
  using spec_backend_native::prefetch_at;
  const int64_t next = at + kAhead, per = kLow ? 16 : kBlock;  // per: codes per scale
  prefetch_at(p.codes, next);
  prefetch_at(p.scale, next / per * static_cast<int64_t>(sizeof(float)));
  if constexpr (kLow) prefetch_at(p.low, next / per * static_cast<int64_t>(sizeof(float)));
}

// out[m0 + r, n] for r < R: each block is de-quantized once and dotted with R rows.
template <int R, bool kLow>
void tile(const Problem& p, int64_t n, int64_t m0) {
  const int64_t groups = p.k / kBlock;
  const int8_t* codes = p.codes + n * p.k;
  const float* x = p.x + m0 * p.k;
  // Row r's accumulator is kParts registers (not a v16f: GCC splits arrays of those into 128-bit halves
  // through the stack on AVX2, 10x slower); lane l adds, block by block, the products of inputs l and
  // 16 + l, one rounding each. One accumulator per row, not two: R = 5 rows then fit AVX2's 16 registers.
  vf acc[R][kParts] = {};
  for (int64_t g = 0; g < groups; ++g) {
    prefetch_ahead<kLow>(p, n * p.k + g * kBlock);
    v16f w_lo, w_hi;  // the block's weights: scale * code (Q8_0), or scale * code + low per 16 (kLow)
    Q80::decode(codes + g * Q80::kBytes, w_lo, w_hi);
    if constexpr (kLow) {
      const float* s = p.scale + (n * groups + g) * 2;
      const float* m = p.low + (n * groups + g) * 2;
      w_lo = fma16(w_lo, v16f{} + s[0], v16f{} + m[0]);  // one rounding, whatever the compiler contracts
      w_hi = fma16(w_hi, v16f{} + s[1], v16f{} + m[1]);
    } else {
      const float d = p.scale[n * groups + g];
      w_lo = w_lo * d;
      w_hi = w_hi * d;
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const v16f x_lo = load16(x + r * p.k + g * kBlock), x_hi = load16(x + r * p.k + g * kBlock + 16);
      for (int i = 0; i < kParts; ++i)
        acc[r][i] = fma_lanes(w_hi.p[i], x_hi.p[i], fma_lanes(w_lo.p[i], x_lo.p[i], acc[r][i]));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    v16f total;
    for (int i = 0; i < kParts; ++i) total.p[i] = acc[r][i];
    p.out[(m0 + r) * p.n_out + n] = sum16(total);
  }
}

template <bool kLow>
void rows_tile(const Problem& p, int64_t n, int64_t m0, int64_t rows) {
  switch (rows) {
    case 1: return tile<1, kLow>(p, n, m0);
    case 2: return tile<2, kLow>(p, n, m0);
    case 3: return tile<3, kLow>(p, n, m0);
    case 4: return tile<4, kLow>(p, n, m0);
    case 5: return tile<5, kLow>(p, n, m0);
    case 6: return tile<6, kLow>(p, n, m0);
    case 7: return tile<7, kLow>(p, n, m0);
    default: return tile<8, kLow>(p, n, m0);
  }
}

// x [M, K] float32 times int8 codes [N, K] with scale [N, K/32] (low undefined or empty), or with scale
// and low [N, K/16] each: [M, N].
at::Tensor block_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& low) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 [M, K], got ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(codes.dim() == 2, "codes must be contiguous int8 [N, K], got ", codes.sizes());
  const int64_t m_rows = x.size(0), k = x.size(1), n_out = codes.size(0);
  TORCH_CHECK(k % kBlock == 0, "K must be a multiple of 32, got ", k);
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar && codes.is_contiguous() && codes.size(1) == k,
              "codes must be contiguous int8 [N, ", k, "], got ", codes.scalar_type(), " ", codes.sizes());
  const bool offsets = low.defined() && low.numel() > 0;
  const int64_t groups = offsets ? k / 16 : k / kBlock;
  for (const at::Tensor* t : {&scale, &low}) {
    if (t == &low && !offsets) continue;
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->sizes() == at::IntArrayRef({n_out, groups}),
                "scale", offsets ? " and low" : "", " must be contiguous float32 [", n_out, ", ", groups, "], got ",
                t->scalar_type(), " ", t->sizes());
  }
  auto out = at::empty({m_rows, n_out}, x.options());
  if (m_rows == 0 || n_out == 0) return out;
  const Problem p{x.data_ptr<float>(), codes.data_ptr<int8_t>(), scale.data_ptr<float>(),
                  offsets ? low.data_ptr<float>() : nullptr, out.data_ptr<float>(), k, n_out};
  const int64_t tasks = (n_out + kColTile - 1) / kColTile;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n_end = std::min(n_out, (t + 1) * kColTile);
      for (int64_t m0 = 0; m0 < m_rows; m0 += kRowTile)
        for (int64_t n = t * kColTile; n < n_end; ++n) {
          const int64_t rows = std::min<int64_t>(kRowTile, m_rows - m0);
          offsets ? rows_tile<true>(p, n, m0, rows) : rows_tile<false>(p, n, m0, rows);
        }
    }
  });
  return out;
}

at::Tensor q8_0_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale) {
  return block_mm(x, codes, scale, at::Tensor());
}

}  // namespace

namespace spec_backend_native {

at::Tensor k8_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& low) {
  return block_mm(x, codes, scale, low);
}

}  // namespace spec_backend_native

TORCH_LIBRARY_FRAGMENT(SPEC_OPS, m) {
  m.def("q8_0_mm(Tensor x, Tensor codes, Tensor scale) -> Tensor", &q8_0_mm);
  m.def("k8_mm(Tensor x, Tensor codes, Tensor scale, Tensor low) -> Tensor", &spec_backend_native::k8_mm);
}
