// Native ops that other native kernels call directly (one shared library per ISA variant: no dispatcher,
// no Python).
#pragma once

#include <ATen/ATen.h>

namespace spec_backend_native {

// GGUF Q4_1 weights in the tile layout times float32 rows [M, K] (q4_1_mm.cpp; every ISA variant).
at::Tensor q4_1_q8_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                      const at::Tensor& low);

// Weights w = scale * code + low per 16 (int8 codes [N, K], scale and low [N, K/16]), or w = scale * code
// per 32 (scale [N, K/32], low empty): the GGUF blocks kquant_linear.py reads, times float32 rows [M, K]
// (q8_0_gemm.cpp; every ISA variant).
at::Tensor k8_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& low);

// Row-invariant causal attention (attention_rows.cpp): query [B, Hq, Q, D], key/value [B, Hkv, L, D]
// -> [B, Q, Hq, D].
at::Tensor attention_rows(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const at::Tensor& q_lens, const at::Tensor& kv_lens, double scale);

}  // namespace spec_backend_native
