// Causal attention computed row by row, for the cpu backend's batch-invariant attention
// (spec_backend/cpu/attention.py): each query row's output depends only on that row and the keys
// and values it sees, computed in one fixed order, never on how many other rows the call holds. A
// token verified among drafts, decoded alone or prefilled with its prompt gets the same output.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "isa.h"
#include "native_ops.h"
#include "vec16.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using spec_backend_native::exp16;
using spec_backend_native::load16;
using spec_backend_native::store16;
using spec_backend_native::sum16;
using spec_backend_native::v16f;
using spec_backend_native::zero_from;

inline float dot(const float* a, const float* b, int64_t d) {  // d a multiple of 16
  v16f acc = {};
  for (int64_t i = 0; i < d; i += 16) acc += load16(a + i) * load16(b + i);
  return sum16(acc);
}

// One query row of one head over keys [0, n): softmax(scale * q.k) @ v into out[0, d). `scores` holds
// n rounded up to a multiple of 16 floats.
void attend(const float* q, const float* k, const float* v, int64_t k_stride, int64_t n, int64_t d,
            float scale, float* scores, float* out) {
  float top = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = scale * dot(q, k + j * k_stride, d);
    top = std::max(top, scores[j]);
  }
  const int64_t padded = (n + 15) / 16 * 16;
  v16f sums = {};
  for (int64_t j = 0; j < padded; j += 16) {
    v16f e = exp16(load16(scores + j) - top);
    if (n - j < 16) e = zero_from(e, n - j);  // keys past n (only in the last block)
    store16(scores + j, e);
    sums += e;
  }
  const float total = sum16(sums);
  v16f acc[16] = {};  // d <= 256
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < d / 16; ++i) acc[i] += scores[j] * load16(v + j * k_stride + 16 * i);
  for (int64_t i = 0; i < d / 16; ++i) store16(out + 16 * i, acc[i] / total);
}

// Whether two tensors of one shape index alike: equal strides on every dim longer than 1 (a dim of size 1
// is only ever indexed at 0, so its stride does not matter: a fresh key beside a transposed value).
bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  for (int64_t i = 0; i < a.dim(); ++i)
    if (a.size(i) > 1 && a.stride(i) != b.stride(i)) return false;
  return true;
}

}  // namespace

namespace spec_backend_native {

// query [B, Hq, Q, D], key/value [B, Hkv, L, D] (any strides but a contiguous last dim), float32;
// request b has q_lens[b] query rows at its last positions of kv_lens[b] keys. Returns [B, Q, Hq, D],
// zeros in padding rows.
at::Tensor attention_rows(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const at::Tensor& q_lens, const at::Tensor& kv_lens, double scale) {
  for (const at::Tensor* t : {&query, &key, &value})
    TORCH_CHECK(t->dim() == 4 && t->scalar_type() == at::kFloat && t->stride(3) == 1,
                "query, key and value must be float32 [B, H, T, D] with a contiguous last dim, got ",
                t->scalar_type(), " ", t->sizes());
  const int64_t b_size = query.size(0), hq = query.size(1), q_max = query.size(2), d = query.size(3);
  const int64_t hkv = key.size(1);
  TORCH_CHECK(d % 16 == 0 && d <= 256, "head dim must be a multiple of 16 up to 256, got ", d);
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(0) == b_size && key.size(3) == d && hq % hkv == 0,
              "key/value ", key.sizes(), " do not match query ", query.sizes());
  TORCH_CHECK(same_layout(key, value), "key and value must share strides (on dims longer than 1), got ",
              key.strides(), " and ", value.strides());
  auto ql = q_lens.to(at::kLong).contiguous(), kl = kv_lens.to(at::kLong).contiguous();
  TORCH_CHECK(ql.numel() == b_size && kl.numel() == b_size, "q_lens and kv_lens need one entry per request");
  const int64_t* qlp = ql.data_ptr<int64_t>();
  const int64_t* klp = kl.data_ptr<int64_t>();
  for (int64_t b = 0; b < b_size; ++b)
    TORCH_CHECK(0 <= qlp[b] && qlp[b] <= q_max && qlp[b] <= klp[b] && klp[b] <= key.size(2),
                "request ", b, ": q_len ", qlp[b], ", kv_len ", klp[b], " do not fit query ", query.sizes(),
                " and key ", key.sizes());
  auto out = at::zeros({b_size, q_max, hq, d}, query.options());
  const float *qp = query.data_ptr<float>(), *kp = key.data_ptr<float>(), *vp = value.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t group = hq / hkv;
  at::parallel_for(0, b_size * hq * q_max, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores((key.size(2) + 15) / 16 * 16);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task % q_max, h = (task / q_max) % hq, b = task / (q_max * hq);
      if (i >= qlp[b]) continue;
      const int64_t n = klp[b] - qlp[b] + i + 1;  // keys this row sees
      const float* q = qp + b * query.stride(0) + h * query.stride(1) + i * query.stride(2);
      const int64_t kv_offset = b * key.stride(0) + (h / group) * key.stride(1);
      attend(q, kp + kv_offset, vp + kv_offset, key.stride(2), n, d, static_cast<float>(scale), scores.data(),
             op + ((b * q_max + i) * hq + h) * d);
    }
  });
  return out;
}

}  // namespace spec_backend_native

TORCH_LIBRARY_FRAGMENT(SPEC_OPS, m) {
  m.def("attention_rows(Tensor query, Tensor key, Tensor value, Tensor q_lens, Tensor kv_lens, float scale) -> Tensor",
        &spec_backend_native::attention_rows);
}
