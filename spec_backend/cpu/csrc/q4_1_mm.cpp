// GGUF Q4_1 weights (4-bit codes, float32 scale and minimum per 32 weights) times activations quantized
// per 32 values to int8, as llama.cpp computes Q4_1 x Q8_1: the op, shared by every ISA variant; the tile
// that does the arithmetic is the variant's (q4_1_<isa>.h, numerics in q4_1.h). The glossary and the
// weight layout are in spec_backend/cpu/int4_linear.py. Integer block dots are exact and the float steps
// run in a fixed order per row, so a row's result does not depend on the batch.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "isa.h"
#include "native_ops.h"
#include "q4_1.h"
#include "q4_1_tile.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace {

using spec_backend_native::kBlock;

// Row i's 32-value blocks as int8 codes q with a scale d = amax / 127 each, and s = d * sum(codes).
void quantize_rows(const float* x, int64_t rows, int64_t k, int8_t* q, float* d, float* s) {
  const int64_t groups = k / kBlock;
  for (int64_t i = 0; i < rows * groups; ++i) {
    const float* v = x + i * kBlock;
    float amax = 0.0f;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float scale = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < kBlock; ++j) {
      const int code = static_cast<int>(std::nearbyint(v[j] * inverse));  // in [-127, 127]
      q[i * kBlock + j] = static_cast<int8_t>(code);
      sum += code;
    }
    d[i] = scale;
    s[i] = scale * static_cast<float>(sum);
  }
}

void rows_tile(const spec_backend_native::Q4Problem& p, int64_t t, int64_t m0, int64_t rows) {
  using spec_backend_native::q4_1_tile;
  switch (rows) {
    case 1: return q4_1_tile<1>(p, t, m0);
    case 2: return q4_1_tile<2>(p, t, m0);
    case 3: return q4_1_tile<3>(p, t, m0);
    case 4: return q4_1_tile<4>(p, t, m0);
    default: return q4_1_tile<5>(p, t, m0);
  }
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
  const Q4Problem p{q.data_ptr<int8_t>(), d.data_ptr<float>(), s.data_ptr<float>(), codes.data_ptr<uint8_t>(),
                    scale.data_ptr<float>(),  low.data_ptr<float>(), out.data_ptr<float>(), groups, n_out};
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t m0 = 0; m0 < m_rows; m0 += kRowTile) rows_tile(p, t, m0, std::min<int64_t>(kRowTile, m_rows - m0));
  });
  return out;
}

}  // namespace spec_backend_native

TORCH_LIBRARY_FRAGMENT(SPEC_OPS, m) {
  m.def("q4_1_q8_mm(Tensor x, Tensor codes, Tensor scale, Tensor low) -> Tensor", &spec_backend_native::q4_1_q8_mm);
}
