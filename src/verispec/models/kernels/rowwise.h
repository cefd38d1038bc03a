// The row-wise kernels' entry points (rowwise.cpp: products, attention, the module; layer.cpp: a
// whole decoder layer). Every one gives a row the same arithmetic whatever the rows beside it.
#pragma once
#include <torch/extension.h>

#include <optional>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>

// e^x in 16 lanes: x = n ln2 + r (|r| <= ln2 / 2, ln2 in two parts), the degree-6 Taylor polynomial
// of e^r (Horner), scaled by 2^n; x above 88 counts as 88, below -87 gives 0.
inline __m512 exp_ps(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), _mm512_scalef_ps(p, n));
}

inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }  // n < 16 lanes
#endif

bool available();

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
