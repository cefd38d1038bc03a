// The row-wise kernels' torch entry points (rowwise.cpp: products, attention, the module;
// quant.cpp: products over GGUF blocks; layer.cpp: a whole decoder layer), over the arithmetic of ops.h / vec.h. Every one gives a row
// the same arithmetic whatever the rows beside it, and every variant (VERISPEC_AVX512, _AVX2,
// _NEON, _SCALAR) the same bits.
#pragma once
#include <torch/extension.h>

#include <optional>
#include <tuple>
#include <vector>

#include "ops.h"

// y [R, out] = x [R, in] @ w [out, in]^T, float32
torch::Tensor rows_mm(torch::Tensor x, torch::Tensor w);

// A weight matrix stacked from parts (quant.cpp): part p is float32 [rows, in] (type 0) or GGUF
// blocks, uint8 [rows, row bytes], of ggml type types[p]
using Weight = std::tuple<std::vector<torch::Tensor>, std::vector<int64_t>>;
int64_t weight_rows(const Weight& w);
// y [R, out] = x [R, in] @ unpacked(w)^T, each value what rows_mm gives over the unpacked matrix
torch::Tensor weight_mm(torch::Tensor x, const Weight& w);
// the unpacked matrix, float32 [out, in]
torch::Tensor dequantize(const Weight& w, int64_t in);
// rows ids of the unpacked matrix, float32 [n, in]
torch::Tensor take_rows(const Weight& w, int64_t in, torch::Tensor ids);

// q [T, H, D] at positions start.. over keys, values [KVH, A, D] (one layer of a KVCache) -> [T, H * D];
// parents [T]: the rows form a token tree (rowwise.cpp)
torch::Tensor attention_rows(torch::Tensor q, torch::Tensor keys, torch::Tensor values, int64_t start, int64_t window, double scale,
                             std::optional<torch::Tensor> parents);

// One decoder layer over the rows of several sequences' short segments (see layer.cpp).
torch::Tensor decode_layer(torch::Tensor x, torch::Tensor attn_norm, const Weight& qkv, std::optional<torch::Tensor> qkv_bias,
                           std::optional<torch::Tensor> qk_norm, const Weight& o, std::optional<torch::Tensor> post_attn_norm,
                           torch::Tensor mlp_norm, const Weight& gate_up, const Weight& down, std::optional<torch::Tensor> post_mlp_norm,
                           torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> keys, std::vector<torch::Tensor> values,
                           std::vector<int64_t> rows, std::vector<int64_t> starts, std::vector<std::optional<torch::Tensor>> parents,
                           int64_t heads, int64_t kv_heads, int64_t window, double scale, double eps, bool gelu);
