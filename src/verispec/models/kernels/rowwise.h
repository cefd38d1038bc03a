// The row-wise kernels' torch entry points (rowwise.cpp: products, attention, the module;
// layer.cpp: a whole decoder layer), over the arithmetic of ops.h / vec.h. Every one gives a row
// the same arithmetic whatever the rows beside it, and every variant (VERISPEC_AVX512, _AVX2,
// _NEON, _SCALAR) the same bits.
#pragma once
#include <torch/extension.h>

#include <optional>
#include <vector>

#include "ops.h"

// y [R, out] = x [R, in] @ w [out, in]^T, float32
torch::Tensor rows_mm(torch::Tensor x, torch::Tensor w);

// q [T, H, D] at positions start.. over keys, values [KVH, A, D] (one layer of a KVCache) -> [T, H * D]
torch::Tensor attention_rows(torch::Tensor q, torch::Tensor keys, torch::Tensor values, int64_t start, int64_t window, double scale);

// One decoder layer over the rows of several sequences' short segments (see layer.cpp).
torch::Tensor decode_layer(torch::Tensor x, torch::Tensor attn_norm, torch::Tensor qkv, std::optional<torch::Tensor> qkv_bias,
                           std::optional<torch::Tensor> qk_norm, torch::Tensor o, std::optional<torch::Tensor> post_attn_norm,
                           torch::Tensor mlp_norm, torch::Tensor gate_up, torch::Tensor down, std::optional<torch::Tensor> post_mlp_norm,
                           torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> keys, std::vector<torch::Tensor> values,
                           std::vector<int64_t> rows, std::vector<int64_t> starts, int64_t heads, int64_t kv_heads, int64_t window,
                           double scale, double eps, bool gelu);
