// The row-wise kernels' torch entry points (rowwise.cpp: products, attention; quant.cpp: products
// over GGUF blocks; layer.cpp: a whole decoder layer; module.cpp: the Python module), over the arithmetic of ops.h / vec.h. Every one gives a row
// the same arithmetic whatever the rows beside it, and every variant (VERISPEC_AVX512, _AVX2,
// _NEON, _SCALAR) the same bits.
#pragma once
// ATen's headers only: <torch/extension.h> (pybind11 and the C++ frontend) costs ~15-30 s of
// compiling per file and is included by module.cpp alone
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <optional>
#include <tuple>
#include <vector>

#include "ops.h"

// y [R, out] = x [R, in] @ w [out, in]^T, float32
at::Tensor rows_mm(at::Tensor x, at::Tensor w);

// A weight matrix stacked from parts (quant.cpp): part p is float32 [rows, in] (type 0) or GGUF
// blocks, uint8 [rows, row bytes], of ggml type types[p]
using Weight = std::tuple<std::vector<at::Tensor>, std::vector<int64_t>>;
int64_t weight_rows(const Weight& w);
// y [R, out] = x [R, in] @ unpacked(w)^T, each value what rows_mm gives over the unpacked matrix
at::Tensor weight_mm(at::Tensor x, const Weight& w);
// the unpacked matrix, float32 [out, in]
at::Tensor dequantize(const Weight& w, int64_t in);
// rows ids of the unpacked matrix, float32 [n, in]
at::Tensor take_rows(const Weight& w, int64_t in, at::Tensor ids);

// q [T, H, D] at positions start.. over keys, values [KVH, A, D] (one layer of a KVCache) -> [T, H * D];
// parents [T]: the rows form a token tree (rowwise.cpp)
at::Tensor attention_rows(at::Tensor q, at::Tensor keys, at::Tensor values, int64_t start, int64_t window, double scale,
                          std::optional<at::Tensor> parents);

// One decoder layer over the rows of several sequences' short segments (see layer.cpp).
at::Tensor decode_layer(at::Tensor x, at::Tensor attn_norm, const Weight& qkv, std::optional<at::Tensor> qkv_bias,
                        std::optional<at::Tensor> qk_norm, const Weight& o, std::optional<at::Tensor> post_attn_norm,
                        at::Tensor mlp_norm, const Weight& gate_up, const Weight& down, std::optional<at::Tensor> post_mlp_norm,
                        at::Tensor cos, at::Tensor sin, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                        std::vector<int64_t> rows, std::vector<int64_t> starts, std::vector<std::optional<at::Tensor>> parents,
                        int64_t heads, int64_t kv_heads, int64_t window, double scale, double eps, bool gelu);
