// One decoder layer for decoding and verification rows, in one call: the glue between the
// products (norms, q/k norms, RoPE, the cache write, residuals, the gated activation) that costs
// ~20 small ATen calls per layer from Python. Same model as Transformer._layer (models/transformer.py):
//
//   h = rmsnorm(x) ; qkv = h @ Wqkv^T (+ bias) ; q, k = rope(qknorm(q, k)) ; cache[start..] = k, v
//   a = attention(q) @ Wo^T (post-norm) ; x += a
//   h = rmsnorm(x) ; g, u = h @ Wgu^T ; m = act(g) * u ; d = m @ Wdown^T (post-norm) ; x += d
//
// Rows: the segments of several sequences, segment s at rows [rows[s], rows[s + 1]) of x, its new
// positions from starts[s], its cache layer keys[s], values[s] ([KVH, A, D]); parents[s] where its
// rows are a token tree (each row at its depth's position, seeing its path: rowwise.cpp; cos and
// sin are then the caller's, at those positions), rows written at slots starts[s].. all the same. Every step is row by
// row with ops.h's fixed arithmetic, so a row's result does not depend on the rows beside it.
// The four matrices are Weights (quant.cpp): float32, GGUF blocks, or parts of both.
#include "rowwise.h"

#include <ATen/ops/add.h>
#include <ATen/ops/empty_like.h>

namespace {

void norm_rows(at::Tensor& t, const std::optional<at::Tensor>& w, float eps) {
  if (!w) return;
  const int64_t N = t.size(0), n = t.size(1);
  float* p = t.data_ptr<float>();
  for (int64_t r = 0; r < N; ++r) vs::rmsnorm(p + r * n, w->data_ptr<float>(), p + r * n, n, eps);
}

}  // namespace

at::Tensor decode_layer(at::Tensor x, at::Tensor attn_norm, const Weight& qkv, std::optional<at::Tensor> qkv_bias,
                        std::optional<at::Tensor> qk_norm, const Weight& o, std::optional<at::Tensor> post_attn_norm,
                        at::Tensor mlp_norm, const Weight& gate_up, const Weight& down, std::optional<at::Tensor> post_mlp_norm,
                        at::Tensor cos, at::Tensor sin, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                        std::vector<int64_t> rows, std::vector<int64_t> starts, std::vector<std::optional<at::Tensor>> parents,
                        int64_t heads, int64_t kv_heads, int64_t window, double scale, double eps, bool gelu) {
  x = x.contiguous();
  cos = cos.contiguous();
  sin = sin.contiguous();
  const int64_t N = x.size(0), hidden = x.size(1), D = cos.size(1), H = heads, KVH = kv_heads, QK = H + KVH;
  const int64_t S = static_cast<int64_t>(rows.size());
  TORCH_CHECK(x.scalar_type() == at::kFloat, "decode_layer: float32 only");
  TORCH_CHECK(cos.size(0) == N && sin.sizes() == cos.sizes(), "decode_layer: cos, sin [N, D]");
  TORCH_CHECK(S > 0 && keys.size() == static_cast<size_t>(S) && values.size() == keys.size() && starts.size() == rows.size() &&
              parents.size() == rows.size(), "decode_layer: one rows, starts, parents, keys, values entry per segment");
  TORCH_CHECK(weight_rows(qkv) == (QK + KVH) * D, "decode_layer: qkv has (heads + 2 kv_heads) * head_dim rows");
  const float feps = static_cast<float>(eps);
  vs::FpMode mode;
  std::vector<float> tmp(D);

  // 1. attention input: the norm, q/k/v, q/k norms, RoPE
  auto h = at::empty_like(x);
  for (int64_t r = 0; r < N; ++r) vs::rmsnorm(x.data_ptr<float>() + r * hidden, attn_norm.data_ptr<float>(), h.data_ptr<float>() + r * hidden, hidden, feps);
  auto qkv_out = weight_mm(h, qkv);  // [N, (QK + KVH) * D]
  float* Q = qkv_out.data_ptr<float>();
  const int64_t width = (QK + KVH) * D;
  if (qkv_bias) {
    const float* b = qkv_bias->data_ptr<float>();
    for (int64_t r = 0; r < N; ++r)
      for (int64_t j = 0; j < width; ++j) Q[r * width + j] = Q[r * width + j] + b[j];
  }
  for (int64_t r = 0; r < N; ++r)
    for (int64_t hh = 0; hh < QK; ++hh) {
      float* v = Q + r * width + hh * D;
      if (qk_norm) vs::rmsnorm(v, qk_norm->data_ptr<float>() + hh * D, v, D, feps);
      vs::rope(v, cos.data_ptr<float>() + r * D, sin.data_ptr<float>() + r * D, D, tmp.data());
    }

  // 2. per segment: keys and values into its cache, then attention row by row
  auto attn = at::empty({N, H * D}, x.options());
  auto q_all = qkv_out.view({N, QK + KVH, D}).narrow(1, 0, H);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t r0 = rows[s], r1 = s + 1 < S ? rows[s + 1] : N, T = r1 - r0, start = starts[s];
    TORCH_CHECK(T > 0 && keys[s].is_contiguous() && values[s].is_contiguous() && keys[s].size(1) >= start + T,
                "decode_layer: segment ", s, " needs contiguous cache layers holding positions < ", start + T);
    const int64_t A = keys[s].size(1);
    float *kc = keys[s].data_ptr<float>(), *vc = values[s].data_ptr<float>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < KVH; ++g) {
        const float* kr = Q + (r0 + t) * width + (H + g) * D;
        const float* vr = Q + (r0 + t) * width + (QK + g) * D;
        std::copy(kr, kr + D, kc + (g * A + start + t) * D);
        std::copy(vr, vr + D, vc + (g * A + start + t) * D);
      }
    attn.narrow(0, r0, T).copy_(attention_rows(q_all.narrow(0, r0, T), keys[s], values[s], start, window, scale, parents[s]));
  }

  // 3. the attention's projection, its norm, the residual
  auto a = weight_mm(attn, o);
  norm_rows(a, post_attn_norm, feps);
  auto x2 = at::add(x, a);

  // 4. the MLP
  for (int64_t r = 0; r < N; ++r) vs::rmsnorm(x2.data_ptr<float>() + r * hidden, mlp_norm.data_ptr<float>(), h.data_ptr<float>() + r * hidden, hidden, feps);
  auto gu = weight_mm(h, gate_up);  // [N, 2 I]: gate, then up
  const int64_t I = gu.size(1) / 2;
  auto m = at::empty({N, I}, x.options());
  for (int64_t r = 0; r < N; ++r) vs::gated(gu.data_ptr<float>() + r * 2 * I, gu.data_ptr<float>() + r * 2 * I + I, m.data_ptr<float>() + r * I, I, gelu);
  auto d = weight_mm(m, down);
  norm_rows(d, post_mlp_norm, feps);
  return at::add(x2, d);
}
