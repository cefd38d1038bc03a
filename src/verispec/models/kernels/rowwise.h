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
#include <string>
#include <tuple>
#include <vector>

#include "ops.h"

// y [R, out] = x [R, in] @ w [out, in]^T, float32
at::Tensor rows_mm(at::Tensor x, at::Tensor w);

// A weight matrix stacked from parts (quant.cpp): part p is float32 [rows, in] (type 0) or GGUF
// blocks, uint8 [rows, row bytes], of ggml type types[p]; with int8 activations (types[p] + 256),
// 32-weight block parts (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) may be tiles of 16 rows, uint8 [rows / 16, blocks, tile block bytes] (tile8.h)
using Weight = std::tuple<std::vector<at::Tensor>, std::vector<int64_t>>;
int64_t weight_rows(const Weight& w);

namespace vs {
struct XQ;  // rows quantised for int8 activations (quant8.h)
}
template <class X>
using RangeFn = void (*)(X, const uint8_t*, float*, int64_t, int64_t, int64_t, int64_t);

// a format's properties (quant.cpp's props): weights and bytes per block, the range and tail
// products for R rows (float32 activations, and int8 ones where asked for), the row unpacking
struct Props {
  int64_t elems = 0, bytes = 0;
  RangeFn<const float*> range[9] = {}, tail[9] = {};
  RangeFn<const vs::XQ&> range8[9] = {}, tail8[9] = {};
  void (*unpack)(const uint8_t*, float*, int64_t) = nullptr;
  // int8 activations with per-block float work (tile8.h; tile_bytes > 0): range8 goes one output
  // at a time over the file's rows, tiles8 over tiles of 16 outputs; untile gives a tiled output's file bytes
  int64_t tile_bytes = 0;
  bool blockwise() const { return tile_bytes > 0; }
  RangeFn<const vs::XQ&> tiles8[17] = {};  // 9-16: one pass of up to 16 rows: the K-quants' tiles, and on AMX builds the others
  bool wide_anywhere = false;              // tiles8[9..16] run without AMX (the K-quants' tiles)
  void (*untile)(const uint8_t*, int64_t, int64_t, uint8_t*) = nullptr;
};

// A Weight resolved for products over `in` columns (quant.cpp): each part's format (Props), bytes
// and first output in the stacked matrix, checked once; it holds the parts' tensors. A model's
// Stack makes its matrices' once, at construction; weight_mm one a call.
class WeightParts {
 public:
  WeightParts(const Weight& w, int64_t in);
  int64_t rows() const { return out_; }
  bool int8() const { return int8_; }  // some part multiplies with int8 activations (x quantised first: QuantRows)
  int64_t pass_rows() const;           // rows a pass over the weights takes: 16 where every part is K-quant tiles, or tiles and AMX runs; else 8

 private:
  friend class Product;
  struct Part {
    Props f;
    const uint8_t* data;
    int64_t rows, first_out;
    bool tiled;  // tiles of 16 rows (tile8.h)
  };
  Weight keep_;
  int64_t in_, out_ = 0;
  bool int8_ = false;  // some part multiplies with int8 activations
  bool wide_ = true;   // every part has 16-row passes (tiles8[16])
  bool wide_anywhere_ = true;  // ... and they need no AMX
  std::vector<Part> parts_;
};

// Rows of x [R, in] quantised for products with int8 activations (quant8.h's XQ arrays): made
// once, filled row by row (quantize: rows r0..r1, so the threads of a region can each do theirs)
class QuantRows {
 public:
  QuantRows(int64_t R, int64_t in);
  void quantize(const float* x, int64_t r0, int64_t r1);  // x: the whole [R, in]
  vs::XQ from(int64_t r0) const;                          // the arrays from row r0 on

 private:
  int64_t in_, n64_;
  std::vector<int8_t> q_;
  std::vector<float> dx_, sx_, sxb_;
  std::vector<int32_t> s_, sb_;
};

// y [R, out] = x [R, in] @ unpacked(w)^T run by the threads of a parallel region (quant.cpp):
// share(t, n) by each thread t of n: its consecutive output blocks of every pass over the weights
// (8 rows, or 16 where every part is K-quant tiles or tiles through AMX: WeightParts::pass_rows) (the single
// outputs past the last whole block go to the last thread that has work). Threads share only x
// and y, and each (output, row) pair is computed whole by one of them, so no value depends on the
// split. For int8 activations x comes quantised (xq, from QuantRows::quantize of every row before
// share), or, without xq, the constructor quantises it. weight_mm is one in a region of its own.
class Product {
 public:
  Product(const float* x, int64_t R, const WeightParts& w, float* y, const QuantRows* xq = nullptr);
  void share(int64_t t, int64_t n) const;

 private:
  const float* x_;
  float* y_;
  int64_t R_;
  const WeightParts& w_;
  std::optional<QuantRows> own_;  // x quantised here (no xq given)
  const QuantRows* xq_ = nullptr;
};

// y [R, out] = x [R, in] @ unpacked(w)^T, each value what rows_mm gives over the unpacked matrix
at::Tensor weight_mm(at::Tensor x, const Weight& w);
// the unpacked matrix, float32 [out, in]
at::Tensor dequantize(const Weight& w, int64_t in);
// rows ids of the unpacked matrix, float32 [n, in]
at::Tensor take_rows(const Weight& w, int64_t in, at::Tensor ids);
// a 32-weight block part (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), uint8 [rows, row bytes] with rows a multiple of 16, as tiles of 16
// rows for its products with int8 activations (tile8.h): uint8 [rows / 16, blocks, tile block bytes]
at::Tensor tile_weight(at::Tensor part, int64_t type);
// each row's argmax of x [R, V] float32 (ops.h's argmax: torch.argmax's index) -> int64 [R]
at::Tensor rows_argmax(at::Tensor x);

// q [T, H, D] at positions start.. over keys, values [KVH, A, D] (one layer of a KVCache) -> [T, H * D];
// parents [T]: the rows form a token tree (rowwise.cpp)
at::Tensor attention_rows(at::Tensor q, at::Tensor keys, at::Tensor values, int64_t start, int64_t window, double scale,
                          std::optional<at::Tensor> parents);

// Query rows' attention split over a parallel region's threads (rowwise.cpp): q [T, H, D] at
// positions start.. (row t's heads at q + t * ldq) over one layer's keys, values [KVH, A, D] ->
// out [T, H * D]; paths: a token tree's rows' paths (tree_paths), null for a chain.
// share(t, n): thread t's (row, head) pairs.
struct AttentionRows {
  const float* q;
  int64_t ldq;
  const float *keys, *values;
  float* out;
  int64_t T, H, KVH, D, A, start, window;
  float scale;
  const std::vector<int64_t>* paths = nullptr;  // paths[offsets[t] .. offsets[t + 1]): row t's path
  const std::vector<int64_t>* offsets = nullptr;
  void range(int64_t i0, int64_t i1) const;  // pairs i = t * H + h in [i0, i1)
  void share(int64_t t, int64_t n) const { range(T * H * t / n, T * H * (t + 1) / n); }
};
// each row's path in a token tree (parents [T] int64, -1 or an earlier row): checked, root first
void tree_paths(const at::Tensor& parents, std::vector<int64_t>& paths, std::vector<int64_t>& offsets);

// A model's decoder layers for decoding and verification rows, run in one call (layer.cpp): the
// weights handed over once (add_layer), then forward(x, ...) takes every row of a ragged batch
// through all of them inside one parallel region.
class Stack {
 public:
  Stack(int64_t heads, int64_t kv_heads, int64_t head_dim, double scale, double eps, bool gelu);
  // window: the layer's sliding window (0: none); local: it takes the second RoPE table
  void add_layer(at::Tensor attn_norm, Weight qkv, std::optional<at::Tensor> qkv_bias, std::optional<at::Tensor> qk_norm, Weight o,
                 std::optional<at::Tensor> post_attn_norm, at::Tensor mlp_norm, Weight gate_up, Weight down,
                 std::optional<at::Tensor> post_mlp_norm, int64_t window, bool local);
  // the final norm and the LM head [vocab, hidden]
  void set_head(at::Tensor norm, Weight head);
  // x [N, hidden]: segment s's rows [rows[s], rows[s + 1]) at positions from starts[s], its cache's
  // keys[s], values[s] [layers, KVH, A, D] (written there), parents[s] for a token tree; cos, sin
  // [N, D] at each row's position (cos_local, sin_local: the second table's). Returns the rows'
  // final-norm hidden states [N, hidden], the logits [len(logit_rows), vocab] of rows logit_rows
  // (set_head's), and the residual streams entering the layers in `capture`, in that order.
  std::tuple<at::Tensor, at::Tensor, std::vector<at::Tensor>> forward(at::Tensor x, at::Tensor cos, at::Tensor sin, at::Tensor cos_local,
                                                          at::Tensor sin_local, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                                                          std::vector<int64_t> rows, std::vector<int64_t> starts,
                                                          std::vector<std::optional<at::Tensor>> parents, std::vector<int64_t> capture,
                                                          std::vector<int64_t> logit_rows) const;
  int64_t size() const { return static_cast<int64_t>(layers_.size()); }
  // Profiling (off by default): forward adds each step's wall time (barrier to barrier, as the
  // first thread sees it) to its part's total; profile() reads the totals in seconds, by part name
  // (kParts), and the number of forwards; set_profile(true) starts again from zero.
  static constexpr const char* kParts[] = {"glue", "qkv", "attention", "o", "gate_up", "down", "head"};
  void set_profile(bool on);
  std::tuple<std::vector<std::string>, std::vector<double>, int64_t> profile() const;

 private:
  mutable bool profiling_ = false;
  mutable std::vector<double> part_seconds_ = std::vector<double>(7, 0.0);
  mutable int64_t profiled_ = 0;
  struct Layer {
    at::Tensor attn_norm, mlp_norm;
    WeightParts qkv, o, gate_up, down;
    std::optional<at::Tensor> qkv_bias, qk_norm, post_attn_norm, post_mlp_norm;
    int64_t window;
    bool local;
  };
  std::optional<at::Tensor> norm_;
  std::optional<WeightParts> head_;
  int64_t H_, KVH_, D_, hidden_ = 0, inter_ = 0;
  float scale_, eps_;
  bool gelu_;
  bool int8_ = false;  // some matrix multiplies with int8 activations: forward quantises its inputs (QuantRows)
  std::vector<Layer> layers_;
};
