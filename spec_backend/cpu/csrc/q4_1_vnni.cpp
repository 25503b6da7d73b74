// GGUF Q4_1 weights (4-bit codes, float32 scale and minimum per 32 weights) times activations quantized
// per 32 values to int8, with AVX512-VNNI integer dot products, as llama.cpp computes Q4_1 x Q8_1. The
// glossary and the weight layout are in spec_backend/backends/int4_linear.py. Integer block dots are
// exact and the float steps run in a fixed order per row, so a row's result does not depend on the batch.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "native_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>

namespace {

constexpr int64_t kBlock = 32;  // weights per block
constexpr int64_t kLanes = 16;  // output features per tile (one float32 lane each)
constexpr int64_t kTileBytes = 256;  // one tile's codes for one block: 16 features x 32 codes x 4 bits
constexpr int kRowTile = 4;  // activation rows sharing one unpack of a tile's codes

struct Quantized {  // activations: int8 codes [M, K], scale [M, G], scale * sum(codes) [M, G]
  const int8_t* q;
  const float* d;
  const float* s;
};

void quantize_rows(const float* x, int64_t rows, int64_t k, int8_t* q, float* d, float* s) {
  const int64_t groups = k / kBlock;
  for (int64_t i = 0; i < rows * groups; ++i) {
    const float* v = x + i * kBlock;
    float amax = 0.0f;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float scale = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < kBlock; ++j) {
      const int code = static_cast<int>(std::nearbyint(v[j] * inverse));
      q[i * kBlock + j] = static_cast<int8_t>(code);
      sum += code;
    }
    d[i] = scale;
    s[i] = scale * static_cast<float>(sum);
  }
}

template <int R>
void tile(const Quantized& a, const uint8_t* codes, const float* scale, const float* low, float* out,
          int64_t groups, int64_t n_out, int64_t t, int64_t m0) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* w = codes + (t * groups + g) * kTileBytes;
    __m512i part[8];  // part c: codes 4c .. 4c+3 of each of the 16 features, one per 32-bit lane
    for (int c = 0; c < 4; ++c) {
      const __m512i packed = _mm512_loadu_si512(w + 64 * c);
      part[c] = _mm512_and_si512(packed, nibble);
      part[c + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
    }
    const __m512 d = _mm512_loadu_ps(scale + (t * groups + g) * kLanes);
    const __m512 m = _mm512_loadu_ps(low + (t * groups + g) * kLanes);
    for (int r = 0; r < R; ++r) {
      const int64_t block = (m0 + r) * groups + g;
      const int32_t* xq = reinterpret_cast<const int32_t*>(a.q + block * kBlock);
      __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) {
        lo = _mm512_dpbusd_epi32(lo, part[c], _mm512_set1_epi32(xq[c]));
        hi = _mm512_dpbusd_epi32(hi, part[c + 4], _mm512_set1_epi32(xq[c + 4]));
      }
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi));
      acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, _mm512_set1_ps(a.d[block])), acc[r]);
      acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.s[block]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + (m0 + r) * n_out + t * kLanes, acc[r]);
}

}  // namespace

namespace spec_backend_native {

at::Tensor q4_1_q8_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                      const at::Tensor& low) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 [M, K], got ", x.scalar_type(), " ", x.sizes());
  const int64_t m_rows = x.size(0), k = x.size(1), groups = k / kBlock;
  TORCH_CHECK(k % kBlock == 0, "K must be a multiple of 32, got ", k);
  TORCH_CHECK(codes.dim() == 3 && codes.scalar_type() == at::kByte && codes.is_contiguous() &&
                  codes.size(1) == groups && codes.size(2) == kTileBytes,
              "codes must be contiguous uint8 [N/16, ", groups, ", 256], got ", codes.scalar_type(), " ",
              codes.sizes());
  const int64_t tiles = codes.size(0), n_out = tiles * kLanes;
  for (const at::Tensor* t : {&scale, &low})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() &&
                    t->sizes() == at::IntArrayRef({tiles, groups, kLanes}),
                "scale and low must be contiguous float32 [", tiles, ", ", groups, ", 16], got ", t->sizes());
  auto out = at::empty({m_rows, n_out}, x.options());
  if (m_rows == 0 || tiles == 0) return out;
  auto q = at::empty({m_rows, k}, x.options().dtype(at::kChar));
  auto d = at::empty({m_rows, groups}, x.options()), s = at::empty({m_rows, groups}, x.options());
  quantize_rows(x.data_ptr<float>(), m_rows, k, q.data_ptr<int8_t>(), d.data_ptr<float>(), s.data_ptr<float>());
  const Quantized a{q.data_ptr<int8_t>(), d.data_ptr<float>(), s.data_ptr<float>()};
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const float *sp = scale.data_ptr<float>(), *lp = low.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t m0 = 0; m0 < m_rows; m0 += kRowTile) {
        switch (std::min<int64_t>(kRowTile, m_rows - m0)) {
          case 1: tile<1>(a, cp, sp, lp, op, groups, n_out, t, m0); break;
          case 2: tile<2>(a, cp, sp, lp, op, groups, n_out, t, m0); break;
          case 3: tile<3>(a, cp, sp, lp, op, groups, n_out, t, m0); break;
          default: tile<4>(a, cp, sp, lp, op, groups, n_out, t, m0); break;
        }
      }
  });
  return out;
}

}  // namespace spec_backend_native

TORCH_LIBRARY_FRAGMENT(spec_backend_native, m) {
  m.def("q4_1_q8_mm(Tensor x, Tensor codes, Tensor scale, Tensor low) -> Tensor", &spec_backend_native::q4_1_q8_mm);
}
#endif  // AVX512-VNNI: without it the op is not defined and the torch kernel is used
