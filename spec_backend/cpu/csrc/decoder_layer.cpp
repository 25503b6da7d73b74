// A whole Llama-shaped decoder layer in one native call, for GGUF block-quantized models on the cpu backend
// (spec_backend/cpu/native_layer.py has the glossary and the weight list): RMS norm, the fused
// q/k/v product, rotary embedding, the KV cache write, row attention, the output product and residual,
// RMS norm, the fused gate/up product, SiLU-gated product, the down product and residual. Every step
// computes each row on its own in a fixed order, so a row's result does not depend on the batch.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "isa.h"
#include "native_ops.h"
#include "vec16.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

namespace {

using spec_backend_native::exp_lanes;
using spec_backend_native::kParts;
using spec_backend_native::load16;
using spec_backend_native::store16;
using spec_backend_native::sum16;
using spec_backend_native::v16f;
using spec_backend_native::vf;

// weights: input norm [H]; q|k|v tiles, scales, minima; o tiles, scales, minima; post-attention norm [H];
// gate|up tiles, scales, minima; down tiles, scales, minima. Each product's three tensors are either the
// Q4_1 tile layout (uint8 tiles [N/16, K/32, 256], see int4_linear.py) or GGUF blocks for k8_mm (int8
// codes [N, K], scale and low [N, K/16], see kquant_linear.py); the first tensor's dtype says which.
constexpr size_t kWeights = 14;
constexpr size_t kNorm1 = 0, kQkv = 1, kOut = 4, kNorm2 = 7, kGateUp = 8, kDown = 11;

struct Layer {
  at::TensorList w;
  int64_t heads, kv_heads, head_dim;
  float eps;

  bool blocks(size_t first) const { return w[first].scalar_type() == at::kChar; }
  at::Tensor mm(const at::Tensor& rows, size_t first) const {  // [M, K] -> [M, N]
    if (blocks(first)) return spec_backend_native::k8_mm(rows, w[first], w[first + 1], w[first + 2]);
    return spec_backend_native::q4_1_q8_mm(rows, w[first], w[first + 1], w[first + 2]);
  }
  int64_t outputs(size_t first) const { return w[first].size(0) * (blocks(first) ? 1 : 16); }
};

Layer checked(const at::Tensor& x, at::TensorList w, int64_t heads, int64_t kv_heads, int64_t head_dim,
              double eps) {
  TORCH_CHECK(w.size() == kWeights, "decoder layer needs ", kWeights, " weight tensors, got ", w.size());
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat,
              "hidden states must be float32 [B, Q, H], got ", x.scalar_type(), " ", x.sizes());
  const int64_t h = x.size(2);
  TORCH_CHECK(h % 32 == 0 && head_dim % 16 == 0 && heads > 0 && kv_heads > 0 && heads % kv_heads == 0,
              "unsupported shape: hidden ", h, ", heads ", heads, ", kv heads ", kv_heads, ", head dim ",
              head_dim);
  for (size_t i : {kNorm1, kNorm2})
    TORCH_CHECK(w[i].scalar_type() == at::kFloat && w[i].is_contiguous() && w[i].numel() == h,
                "norm weight ", i, " must be contiguous float32 [", h, "], got ", w[i].sizes());
  const Layer layer{w, heads, kv_heads, head_dim, static_cast<float>(eps)};
  TORCH_CHECK(layer.outputs(kQkv) == (heads + 2 * kv_heads) * head_dim && layer.outputs(kOut) == h &&
                  layer.outputs(kDown) == h && layer.outputs(kGateUp) % 32 == 0,
              "weight shapes do not match hidden ", h, " and ", heads, "+2x", kv_heads, " heads of ", head_dim);
  return layer;
}

constexpr int64_t kRowGrain = 16;  // rows per thread in the row-wise steps (one row runs inline)

// weight * (x * 1/sqrt(mean(x^2) + eps)) of each row of x [M, H] (H a multiple of 16).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, float eps) {
  const int64_t h = x.size(1);
  auto out = at::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, x.size(0), kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xp + r * h;
      v16f acc = {};
      for (int64_t i = 0; i < h; i += 16) acc += load16(row + i) * load16(row + i);
      const float inverse = 1.0f / std::sqrt(sum16(acc) / static_cast<float>(h) + eps);
      for (int64_t i = 0; i < h; ++i) op[r * h + i] = wp[i] * (row[i] * inverse);
    }
  });
  return out;
}

// Rotary embedding in place on the first `heads` heads of each row of x [M, width]; cos/sin [M, D]:
// x[j] * cos[j] - x[j + D/2] * sin[j] in the first half, x[j] * cos[j] + x[j - D/2] * sin[j] in the second.
void rope(float* x, const float* cos, const float* sin, int64_t m, int64_t width, int64_t heads, int64_t d) {
  const int64_t half = d / 2;
  at::parallel_for(0, m, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> turned(d);
    for (int64_t r = begin; r < end; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + r * width + h * d;
        const float *c = cos + r * d, *s = sin + r * d;
        for (int64_t j = 0; j < half; ++j) turned[j] = v[j] * c[j] - v[j + half] * s[j];
        for (int64_t j = half; j < d; ++j) turned[j] = v[j] * c[j] + v[j - half] * s[j];
        std::memcpy(v, turned.data(), d * sizeof(float));
      }
  });
}

// silu(gate) * up of gu [M, 2I] (gate in the first I columns, I a multiple of 16) -> [M, I], with
// sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) below, e = exp(-|g|) <= 1.
at::Tensor swiglu(const at::Tensor& gu) {
  const int64_t m = gu.size(0), inner = gu.size(1) / 2;
  auto out = at::empty({m, inner}, gu.options());
  const float* gp = gu.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, m, kRowGrain, [&](int64_t begin, int64_t end) {
    const vf zero = {}, one = zero + 1.0f;
    for (int64_t r = begin; r < end; ++r)
      for (int64_t i = 0; i < inner; i += 16) {
        v16f g = load16(gp + r * 2 * inner + i);
        const v16f u = load16(gp + r * 2 * inner + inner + i);
        for (int part = 0; part < kParts; ++part) {  // lane-wise, one register at a time
          const vf x = g.p[part], e = exp_lanes(x < zero ? x : -x);
          g.p[part] = x * ((x < zero ? e : one) / (one + e)) * u.p[part];
        }
        store16(op + r * inner + i, g);
      }
  });
  return out;
}

// Normed rows [B * Q, K] -> query [B, Hq, Q, D], key and value [B, Hkv, Q, D] (views of one buffer),
// rotary applied.
std::tuple<at::Tensor, at::Tensor, at::Tensor> project_qkv(const at::Tensor& normed, const at::Tensor& cos,
                                                            const at::Tensor& sin, const Layer& layer,
                                                            int64_t b, int64_t q_len) {
  const int64_t m = b * q_len, d = layer.head_dim;
  const auto expanded = [&](const at::Tensor& t) {
    TORCH_CHECK(t.dim() == 3 && t.scalar_type() == at::kFloat && t.size(1) == q_len && t.size(2) == d,
                "cos/sin must be float32 [B or 1, ", q_len, ", ", d, "], got ", t.scalar_type(), " ", t.sizes());
    return t.expand({b, q_len, d}).contiguous();
  };
  const at::Tensor c = expanded(cos), s = expanded(sin);
  auto qkv = layer.mm(normed, kQkv);
  const int64_t width = qkv.size(1), hq = layer.heads, hkv = layer.kv_heads;
  rope(qkv.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(), m, width, hq + hkv, d);
  const auto heads = [&](int64_t first, int64_t count) {
    return qkv.narrow(1, first * d, count * d).view({b, q_len, count, d}).transpose(1, 2);
  };
  return {heads(0, hq), heads(hq, hkv), heads(hq + hkv, hkv)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_part(const at::Tensor& x, const at::Tensor& cos,
                                                         const at::Tensor& sin, const Layer& layer) {
  const int64_t m = x.size(0) * x.size(1);
  const auto normed = rms_norm(x.reshape({m, x.size(2)}).contiguous(), layer.w[kNorm1], layer.eps);
  return project_qkv(normed, cos, sin, layer, x.size(0), x.size(1));
}

// x + o(attn), then + down(silu(gate) * up) of its norm; attn [B, Q, Hq, D] or [B, Q, Hq * D].
at::Tensor out_part(const at::Tensor& x, const at::Tensor& attn, const Layer& layer) {
  const int64_t b = x.size(0), q_len = x.size(1), h = x.size(2), m = b * q_len;
  const int64_t width = layer.heads * layer.head_dim;
  TORCH_CHECK(attn.scalar_type() == at::kFloat && attn.numel() == m * width,
              "attention output must be float32 with ", m, " x ", width, " values, got ", attn.sizes());
  auto h1 = x.reshape({m, h}) + layer.mm(attn.reshape({m, width}).contiguous(), kOut);  // [M, H]
  auto gu = layer.mm(rms_norm(h1, layer.w[kNorm2], layer.eps), kGateUp);  // [M, 2I]
  return (h1 + layer.mm(swiglu(gu), kDown)).view({b, q_len, h});
}

// keys/values [B, Hkv, C, D] (the batch's cache slots): row i < q_lens[b] of request b goes to position
// kv_lens[b] - q_lens[b] + i.
void write_cache(const at::Tensor& k, const at::Tensor& v, const at::Tensor& keys, const at::Tensor& values,
                 const int64_t* ql, const int64_t* kl) {
  TORCH_CHECK(keys.dim() == 4 && keys.scalar_type() == at::kFloat && keys.sizes() == values.sizes() &&
                  keys.strides() == values.strides() && keys.stride(3) == 1 && keys.size(0) == k.size(0) &&
                  keys.size(1) == k.size(1) && keys.size(3) == k.size(3),
              "cache must be float32 [B, Hkv, C, D] matching keys ", k.sizes(), ", got ", keys.sizes());
  const int64_t d = k.size(3);
  float *kp = keys.data_ptr<float>(), *vp = values.data_ptr<float>();
  const float *k_src = k.data_ptr<float>(), *v_src = v.data_ptr<float>();
  for (int64_t b = 0; b < k.size(0); ++b) {
    TORCH_CHECK(0 <= ql[b] && ql[b] <= k.size(2) && ql[b] <= kl[b] && kl[b] <= keys.size(2), "request ", b,
                ": q_len ", ql[b], ", kv_len ", kl[b], " do not fit ", k.sizes(), " and cache ", keys.sizes());
    for (int64_t i = 0; i < ql[b]; ++i)
      for (int64_t h = 0; h < k.size(1); ++h) {
        const int64_t dst = b * keys.stride(0) + h * keys.stride(1) + (kl[b] - ql[b] + i) * keys.stride(2);
        const int64_t src = b * k.stride(0) + h * k.stride(1) + i * k.stride(2);
        std::memcpy(kp + dst, k_src + src, d * sizeof(float));
        std::memcpy(vp + dst, v_src + src, d * sizeof(float));
      }
  }
}

// The cache write, row attention and out_part of a layer whose q/k/v are computed; x is the residual.
at::Tensor attend_and_finish(const at::Tensor& x, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& keys, const at::Tensor& values, const at::Tensor& q_lens,
                             const at::Tensor& kv_lens, const Layer& layer, double scale) {
  const auto ql = q_lens.to(at::kLong).contiguous(), kl = kv_lens.to(at::kLong).contiguous();
  TORCH_CHECK(ql.numel() == x.size(0) && kl.numel() == x.size(0), "q_lens and kv_lens need one entry per request");
  write_cache(k, v, keys, values, ql.data_ptr<int64_t>(), kl.data_ptr<int64_t>());
  return out_part(x, spec_backend_native::attention_rows(q, keys, values, ql, kl, scale), layer);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> decoder_layer_qkv(const at::Tensor& x, const at::Tensor& cos,
                                                                  const at::Tensor& sin, at::TensorList w,
                                                                  int64_t heads, int64_t kv_heads,
                                                                  int64_t head_dim, double eps) {
  return qkv_part(x, cos, sin, checked(x, w, heads, kv_heads, head_dim, eps));
}

at::Tensor decoder_layer_out(const at::Tensor& x, const at::Tensor& attn, at::TensorList w, int64_t heads,
                             int64_t kv_heads, int64_t head_dim, double eps) {
  return out_part(x, attn, checked(x, w, heads, kv_heads, head_dim, eps));
}

at::Tensor decoder_layer(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::TensorList w,
                         const at::Tensor& keys, const at::Tensor& values, const at::Tensor& q_lens,
                         const at::Tensor& kv_lens, int64_t heads, int64_t kv_heads, int64_t head_dim,
                         double eps, double scale) {
  const Layer layer = checked(x, w, heads, kv_heads, head_dim, eps);
  auto [q, k, v] = qkv_part(x, cos, sin, layer);
  return attend_and_finish(x, q, k, v, keys, values, q_lens, kv_lens, layer, scale);
}

// EAGLE-3's first draft layer (spec_backend/cpu/native_eagle3.py): attention reads
// [input_norm(embeds) | hidden_norm(hidden)] [B * Q, 2H]; the residual is hidden, or its norm when
// norm_before_residual. Same weight list as a decoder layer, the q|k|v tiles being 2H wide.
std::tuple<at::Tensor, at::Tensor> eagle3_rows(const at::Tensor& embeds, const at::Tensor& hidden,
                                               const at::Tensor& hidden_norm, const Layer& layer,
                                               bool norm_before_residual) {
  const int64_t m = hidden.size(0) * hidden.size(1), h = hidden.size(2);
  TORCH_CHECK(embeds.sizes() == hidden.sizes() && embeds.scalar_type() == at::kFloat,
              "embeds must be float32 ", hidden.sizes(), " like hidden, got ", embeds.scalar_type(), " ",
              embeds.sizes());
  TORCH_CHECK(hidden_norm.scalar_type() == at::kFloat && hidden_norm.is_contiguous() && hidden_norm.numel() == h,
              "hidden_norm must be contiguous float32 [", h, "], got ", hidden_norm.sizes());
  const auto e = rms_norm(embeds.reshape({m, h}).contiguous(), layer.w[kNorm1], layer.eps);
  const auto g = rms_norm(hidden.reshape({m, h}).contiguous(), hidden_norm, layer.eps);
  const auto residual = norm_before_residual ? g.view(hidden.sizes()) : hidden;
  return {at::cat({e, g}, 1), residual};
}

// -> query, key, value (as project_qkv) and the residual.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> eagle3_qkv_part(
    const at::Tensor& embeds, const at::Tensor& hidden, const at::Tensor& hidden_norm, const at::Tensor& cos,
    const at::Tensor& sin, const Layer& layer, bool norm_before_residual) {
  auto [rows, residual] = eagle3_rows(embeds, hidden, hidden_norm, layer, norm_before_residual);
  auto [q, k, v] = project_qkv(rows, cos, sin, layer, hidden.size(0), hidden.size(1));
  return {q, k, v, residual};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> eagle3_layer_qkv(
    const at::Tensor& embeds, const at::Tensor& hidden, const at::Tensor& hidden_norm, const at::Tensor& cos,
    const at::Tensor& sin, at::TensorList w, int64_t heads, int64_t kv_heads, int64_t head_dim, double eps,
    bool norm_before_residual) {
  const Layer layer = checked(hidden, w, heads, kv_heads, head_dim, eps);
  return eagle3_qkv_part(embeds, hidden, hidden_norm, cos, sin, layer, norm_before_residual);
}

at::Tensor eagle3_layer(const at::Tensor& embeds, const at::Tensor& hidden, const at::Tensor& hidden_norm,
                        const at::Tensor& cos, const at::Tensor& sin, at::TensorList w, const at::Tensor& keys,
                        const at::Tensor& values, const at::Tensor& q_lens, const at::Tensor& kv_lens,
                        int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, double scale,
                        bool norm_before_residual) {
  const Layer layer = checked(hidden, w, heads, kv_heads, head_dim, eps);
  auto [q, k, v, residual] = eagle3_qkv_part(embeds, hidden, hidden_norm, cos, sin, layer, norm_before_residual);
  return attend_and_finish(residual, q, k, v, keys, values, q_lens, kv_lens, layer, scale);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(SPEC_OPS, m) {
  m.def("decoder_layer_qkv(Tensor x, Tensor cos, Tensor sin, Tensor[] weights, int heads, int kv_heads, "
        "int head_dim, float eps) -> (Tensor, Tensor, Tensor)",
        &decoder_layer_qkv);
  m.def("decoder_layer_out(Tensor x, Tensor attn, Tensor[] weights, int heads, int kv_heads, int head_dim, "
        "float eps) -> Tensor",
        &decoder_layer_out);
  m.def("decoder_layer(Tensor x, Tensor cos, Tensor sin, Tensor[] weights, Tensor keys, Tensor values, "
        "Tensor q_lens, Tensor kv_lens, int heads, int kv_heads, int head_dim, float eps, float scale) -> Tensor",
        &decoder_layer);
  m.def("eagle3_layer_qkv(Tensor embeds, Tensor hidden, Tensor hidden_norm, Tensor cos, Tensor sin, "
        "Tensor[] weights, int heads, int kv_heads, int head_dim, float eps, bool norm_before_residual) "
        "-> (Tensor, Tensor, Tensor, Tensor)",
        &eagle3_layer_qkv);
  m.def("eagle3_layer(Tensor embeds, Tensor hidden, Tensor hidden_norm, Tensor cos, Tensor sin, "
        "Tensor[] weights, Tensor keys, Tensor values, Tensor q_lens, Tensor kv_lens, int heads, int kv_heads, "
        "int head_dim, float eps, float scale, bool norm_before_residual) -> Tensor",
        &eagle3_layer);
}
