// A float32 Llama-shaped decoder layer replayed from C++ (spec_backend/cpu/replayed_layer.py has the
// glossary): the ATen calls transformers' LlamaDecoderLayer, our TallSkinnyProjection, the engine's
// RaggedKVLayer.update and sdpa_ragged_attention make during an engine step, with the same arguments in
// the same order, so the result is theirs bit for bit; what is gone is the Python between them (module
// calls, decorators, some forty dispatches per layer from the interpreter). Nothing here computes a value
// of its own: every number comes from the ATen op the Python code calls.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

namespace {

using at::indexing::None;
using at::indexing::Slice;

// weights: input norm [H]; q, k, v, o; post-attention norm [H]; gate, up, down (each [N, K], no bias).
constexpr size_t kWeights = 9;
constexpr size_t kNorm1 = 0, kQ = 1, kK = 2, kV = 3, kO = 4, kNorm2 = 5, kGate = 6, kUp = 7, kDown = 8;

// LlamaRMSNorm.forward: weight * (x * rsqrt(mean(x^2) + eps)), computed in float32.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto h = x.to(at::kFloat);
  const auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(variance + eps);
  return weight * h.to(x.scalar_type());
}

// The projection module's forward: TallSkinnyProjection (spec_backend/cpu/vocab_projection.py), whose
// tall-skinny product (W @ rows.T).T runs at the row counts M whose bit is set in tall_rows (an odd count
// padded with a copy of its last row), F.linear at every other; an nn.Linear is tall_rows = 0.
at::Tensor project(const at::Tensor& hidden, const at::Tensor& weight, int64_t tall_rows) {
  auto rows = hidden.reshape({-1, weight.size(1)});  // [M, K]
  const int64_t m = rows.size(0);
  if (m <= 0 || m > 62 || ((tall_rows >> m) & 1) == 0) return at::linear(hidden, weight);
  if (m % 2 == 1) rows = at::cat({rows, rows.slice(0, -1)});  // [M + 1, K]
  const auto out = at::matmul(weight, rows.t()).t().slice(0, 0, m);  // [M, N]
  std::vector<int64_t> shape(hidden.sizes().begin(), hidden.sizes().end() - 1);
  shape.push_back(weight.size(0));
  return out.reshape(shape);
}

// transformers' rotate_half: cat(-x[..., D/2:], x[..., :D/2]).
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

struct Shape {
  int64_t heads, kv_heads, head_dim, tall_rows;
  double eps, scale;
};

// RaggedKVLayer.update: this step's keys/values [B, Hkv, Q, D] written to the slots' positions; returns
// the views [B, Hkv, max_seq_len, D] attention reads.
std::tuple<at::Tensor, at::Tensor> update_cache(const at::Tensor& k, const at::Tensor& v, at::Tensor keys,
                                                at::Tensor values, int64_t start, int64_t max_seq_len,
                                                const at::Tensor& rows, const at::Tensor& cols,
                                                const at::Tensor& positions) {
  const int64_t batch = k.size(0), n = rows.size(0);
  if (batch == 1) {  // one request: a plain slice copy
    const int64_t first = max_seq_len - n;
    keys.index({start, Slice(), Slice(first, first + n)}).copy_(k.index({0, Slice(), Slice(None, n)}));
    values.index({start, Slice(), Slice(first, first + n)}).copy_(v.index({0, Slice(), Slice(None, n)}));
  } else {
    const auto slots = rows + start;  // [N]
    keys.index_put_({slots, Slice(), positions}, k.index({rows, Slice(), cols}).to(keys.scalar_type()));
    values.index_put_({slots, Slice(), positions}, v.index({rows, Slice(), cols}).to(values.scalar_type()));
  }
  const auto view = [&](const at::Tensor& t) {
    return t.slice(0, start, start + batch).slice(2, 0, max_seq_len);
  };
  return {view(keys), view(values)};
}

// LlamaAttention.forward with the engine's cache and sdpa_ragged_attention; x is the normed input.
at::Tensor attention(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::TensorList w,
                     const at::Tensor& keys, const at::Tensor& values, int64_t start, int64_t max_seq_len,
                     const at::Tensor& rows, const at::Tensor& cols, const at::Tensor& positions,
                     const at::Tensor& mask, const Shape& s) {
  const int64_t b = x.size(0), q_len = x.size(1);
  const auto heads = [&](size_t which) {  // [B, Q, N] -> [B, heads, Q, D]
    return project(x, w[which], s.tall_rows).view({b, q_len, -1, s.head_dim}).transpose(1, 2);
  };
  auto query = heads(kQ), key = heads(kK);
  const auto value = heads(kV);
  const auto c = cos.unsqueeze(1), sn = sin.unsqueeze(1);  // apply_rotary_pos_emb
  query = (query * c) + (rotate_half(query) * sn);
  key = (key * c) + (rotate_half(key) * sn);
  const auto [k_all, v_all] = update_cache(key, value, keys, values, start, max_seq_len, rows, cols, positions);
  const auto out = at::scaled_dot_product_attention(query, k_all, v_all, mask, 0.0, false, s.scale,
                                                    /*enable_gqa=*/s.heads != s.kv_heads);  // [B, Hq, Q, D]
  const auto merged = out.transpose(1, 2).contiguous().reshape({b, q_len, -1}).contiguous();
  return project(merged, w[kO], s.tall_rows);
}

at::Tensor replayed_decoder_layer(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  at::TensorList w, const at::Tensor& keys, const at::Tensor& values, int64_t start,
                                  int64_t max_seq_len, const at::Tensor& rows, const at::Tensor& cols,
                                  const at::Tensor& positions, const at::Tensor& mask, int64_t heads,
                                  int64_t kv_heads, int64_t head_dim, double eps, double scale, int64_t tall_rows) {
  TORCH_CHECK(w.size() == kWeights, "replayed decoder layer needs ", kWeights, " weight tensors, got ", w.size());
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat, "hidden states must be float32 [B, Q, H], got ",
              x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(keys.dim() == 4 && keys.sizes() == values.sizes() && start >= 0 &&
                  start + x.size(0) <= keys.size(0) && max_seq_len <= keys.size(2) && keys.size(1) == kv_heads &&
                  keys.size(3) == head_dim,
              "cache [S, Hkv, C, D] ", keys.sizes(), " does not hold slots ", start, "..", start + x.size(0),
              " of ", max_seq_len, " positions for ", kv_heads, " kv heads of dim ", head_dim);
  TORCH_CHECK(rows.numel() == cols.numel() && rows.numel() == positions.numel(),
              "rows, cols and positions need one entry per token");
  const Shape s{heads, kv_heads, head_dim, tall_rows, eps, scale};
  const auto residual = x;
  auto hidden = residual + attention(rms_norm(x, w[kNorm1], eps), cos, sin, w, keys, values, start, max_seq_len,
                                     rows, cols, positions, mask, s);
  const auto normed = rms_norm(hidden, w[kNorm2], eps);
  const auto gated = at::silu(project(normed, w[kGate], tall_rows)) * project(normed, w[kUp], tall_rows);
  return hidden + project(gated, w[kDown], tall_rows);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(SPEC_OPS, m) {
  m.def("replayed_decoder_layer(Tensor x, Tensor cos, Tensor sin, Tensor[] weights, Tensor(a!) keys, "
        "Tensor(b!) values, int start, int max_seq_len, Tensor rows, Tensor cols, Tensor positions, Tensor mask, "
        "int heads, int kv_heads, int head_dim, float eps, float scale, int tall_rows) -> Tensor",
        &replayed_decoder_layer);
}
