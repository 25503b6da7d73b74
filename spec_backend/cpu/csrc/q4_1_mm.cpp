// GGUF Q4_1 weights (4-bit codes, a float32 or float16 scale and minimum per 32 weights) times
// activations quantized per 32 values to int8, as llama.cpp computes Q4_1 x Q8_1: the op, shared by every
// ISA variant; the tile that does the arithmetic is the variant's (q4_1_<isa>.h, numerics in q4_1.h).
// The glossary and the weight layout are in spec_backend/cpu/int4_linear.py. Integer block dots are
// exact and the float steps run in a fixed order per row, so a row's result does not depend on the batch.
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

template <typename S>
void rows_tile(const spec_backend_native::Q4Problem<S>& p, int64_t t, int64_t m0, int64_t rows) {
  using spec_backend_native::q4_1_tile;
  switch (rows) {
    case 1: return q4_1_tile<1>(p, t, m0);
    case 2: return q4_1_tile<2>(p, t, m0);
    case 3: return q4_1_tile<3>(p, t, m0);
    case 4: return q4_1_tile<4>(p, t, m0);
    default: return q4_1_tile<5>(p, t, m0);
  }
}

// Every tile of the product, parallel over tiles; scales and minima of type S (q4_1.h).
template <typename S>
void all_tiles(const spec_backend_native::Q4Problem<S>& p, int64_t tiles, int64_t m_rows) {
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t m0 = 0; m0 < m_rows; m0 += spec_backend_native::kRowTile)
        rows_tile(p, t, m0, std::min<int64_t>(spec_backend_native::kRowTile, m_rows - m0));
  });
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
  const bool half = scale.scalar_type() == at::kHalf;
  for (const at::Tensor* t : {&scale, &low})
    TORCH_CHECK((t->scalar_type() == at::kFloat || t->scalar_type() == at::kHalf) &&
                    t->scalar_type() == scale.scalar_type() && t->is_contiguous() &&
                    t->sizes() == at::IntArrayRef({tiles, groups, kLanes}),
                "scale and low must be contiguous [", tiles, ", ", groups,
                ", 16], both float32 or both float16, got ", scale.scalar_type(), " ", scale.sizes(), " and ",
                low.scalar_type(), " ", low.sizes());
  auto out = at::empty({m_rows, n_out}, x.options());
  if (m_rows == 0 || tiles == 0) return out;
  auto q = at::empty({m_rows, k}, x.options().dtype(at::kChar));
  auto d = at::empty({m_rows, groups}, x.options()), s = at::empty({m_rows, groups}, x.options());
  quantize_rows(x.data_ptr<float>(), m_rows, k, q.data_ptr<int8_t>(), d.data_ptr<float>(), s.data_ptr<float>());
  const int8_t* xq = q.data_ptr<int8_t>();
  const float *xd = d.data_ptr<float>(), *xs = s.data_ptr<float>();
  if (half) {
    const auto* sh = reinterpret_cast<const Half*>(scale.data_ptr<at::Half>());
    const auto* lh = reinterpret_cast<const Half*>(low.data_ptr<at::Half>());
    const Q4Problem<Half> p{xq, xd, xs, codes.data_ptr<uint8_t>(), sh, lh, out.data_ptr<float>(), groups, n_out};
    all_tiles(p, tiles, m_rows);
  } else {
    all_tiles(Q4Problem<float>{xq, xd, xs, codes.data_ptr<uint8_t>(), scale.data_ptr<float>(),
                               low.data_ptr<float>(), out.data_ptr<float>(), groups, n_out},
              tiles, m_rows);
  }
  return out;
}

}  // namespace spec_backend_native

TORCH_LIBRARY_FRAGMENT(SPEC_OPS, m) {
  m.def("q4_1_q8_mm(Tensor x, Tensor codes, Tensor scale, Tensor low) -> Tensor", &spec_backend_native::q4_1_q8_mm);
}
