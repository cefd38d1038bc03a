// Row-wise products for decoding and verification on the CPU: y = x @ w^T for a few rows of x.
//
// y [R, out] = x [R, in] @ w [out, in]^T, float32, w row-major and contiguous, any R.
//
// Why: MKL runs these shapes (1-8 rows against a weight matrix) at 20-50 GB/s here and rounds a
// row differently with the number of rows beside it. This kernel reads the weights once per 8 rows
// at close to the memory bandwidth and gives every (output, row) pair one fixed arithmetic,
// whatever R, the row's neighbours, the blocking or the thread count:
//   acc = 0 (16 lanes); for each 16-float block of the input, in order:
//       acc = fma(w block, x block, acc)        (a short last block: masked loads, zeros beyond)
//   y = the 16-lane sum of acc (_mm512_reduce_add_ps, a fixed tree)
// So a verified draft row gets bit for bit the logits a one-row decode gives it.
//
// Work split: threads (torch's OpenMP pool, at::parallel_for) take blocks of OB consecutive
// outputs; within a block the rows go 1-8 at a time (templates R = 1..8), the block's weights
// staying in L1 while every row passes. The next block's weights are prefetched.
#include "rowwise.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#ifdef __AVX512F__

namespace {

// outputs o0 .. o0 + OB - 1 for rows x[0..R) (R <= 8): y[r * ldy + o]
template <int R, int OB>
inline void block(const float* __restrict x, const float* __restrict w, float* __restrict y,
                  int64_t in, int64_t ldy, int64_t o0) {
  __m512 acc[OB][R];
  for (int b = 0; b < OB; ++b)
    for (int r = 0; r < R; ++r) acc[b][r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    __m512 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm512_loadu_ps(x + r * in + i);
    for (int b = 0; b < OB; ++b) {
      const float* wp = w + (o0 + b) * in + i;
      _mm_prefetch(reinterpret_cast<const char*>(wp + OB * in), _MM_HINT_T0);  // the next block
      const __m512 wv = _mm512_loadu_ps(wp);
      for (int r = 0; r < R; ++r) acc[b][r] = _mm512_fmadd_ps(wv, xv[r], acc[b][r]);
    }
  }
  if (i < in) {
    const __mmask16 m = static_cast<__mmask16>((1u << (in - i)) - 1);
    __m512 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm512_maskz_loadu_ps(m, x + r * in + i);
    for (int b = 0; b < OB; ++b) {
      const __m512 wv = _mm512_maskz_loadu_ps(m, w + (o0 + b) * in + i);
      for (int r = 0; r < R; ++r) acc[b][r] = _mm512_fmadd_ps(wv, xv[r], acc[b][r]);
    }
  }
  for (int b = 0; b < OB; ++b)
    for (int r = 0; r < R; ++r) y[r * ldy + o0 + b] = _mm512_reduce_add_ps(acc[b][r]);
}

// every output for rows x[0..R) (R <= 8); outputs per block: as many as the registers hold
template <int R>
void rows(const float* x, const float* w, float* y, int64_t in, int64_t out) {
  constexpr int OB = R == 1 ? 8 : R == 2 ? 6 : R <= 4 ? 4 : 2;
  const int64_t blocks = out / OB;
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) block<R, OB>(x, w, y, in, out, b * OB);
  });
  for (int64_t o = blocks * OB; o < out; ++o) block<R, 1>(x, w, y, in, out, o);
}

using RowsFn = void (*)(const float*, const float*, float*, int64_t, int64_t);
constexpr RowsFn kRows[9] = {nullptr, rows<1>, rows<2>, rows<3>, rows<4>, rows<5>, rows<6>, rows<7>, rows<8>};

}  // namespace

// -- attention, one query row at a time -------------------------------------------------------
// out[t, h] = softmax_j(scale * q[t, h] . k[g(h), j]) @ v[g(h), j] over keys j = first(t) .. pos(t),
// pos(t) = start + t, first(t) = max(0, pos(t) - window + 1) with a window, else 0; g(h) = h / (H / KVH).
// Fixed arithmetic per (row, head), as for the products: dots as above (q scaled first), the
// maximum, exp(s - max) with the polynomial below, their sum in 16 lanes then the 16-lane tree,
// the values' weighted sum key by key in order, divided by the sum. A query row gets the same
// result alone (a decoding step) as inside a verification.

namespace {

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

void attend(const float* q, const float* keys, const float* values, float* out, int64_t first, int64_t last,
            int64_t D, float scale, float* qs, float* scores) {
  for (int64_t d = 0; d < D; ++d) qs[d] = q[d] * scale;
  const int64_t S = last - first + 1;
  float mx = -INFINITY;
  for (int64_t j = 0; j < S; ++j) {
    scores[j] = dot(qs, keys + (first + j) * D, D);
    mx = scores[j] > mx ? scores[j] : mx;
  }
  const __m512 vmx = _mm512_set1_ps(mx);
  __m512 vsum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= S; j += 16) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(scores + j), vmx));
    _mm512_storeu_ps(scores + j, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  if (j < S) {
    const __mmask16 m = static_cast<__mmask16>((1u << (S - j)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + j), vmx)));
    _mm512_mask_storeu_ps(scores + j, m, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  const float sum = _mm512_reduce_add_ps(vsum);
  for (int64_t d = 0; d < D; ++d) out[d] = 0.0f;
  for (int64_t k = 0; k < S; ++k) {
    const __m512 p = _mm512_set1_ps(scores[k]);
    const float* v = values + (first + k) * D;
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) _mm512_storeu_ps(out + d, _mm512_fmadd_ps(p, _mm512_loadu_ps(v + d), _mm512_loadu_ps(out + d)));
    if (d < D) {
      const __mmask16 m = static_cast<__mmask16>((1u << (D - d)) - 1);
      _mm512_mask_storeu_ps(out + d, m, _mm512_fmadd_ps(p, _mm512_maskz_loadu_ps(m, v + d), _mm512_maskz_loadu_ps(m, out + d)));
    }
  }
  const __m512 vs = _mm512_set1_ps(sum);
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) _mm512_storeu_ps(out + d, _mm512_div_ps(_mm512_loadu_ps(out + d), vs));
  for (; d < D; ++d) out[d] = out[d] / sum;
}

}  // namespace

// q [T, H, D]; keys, values [KVH, A, D] (one layer of a KVCache, A >= start + T) -> [T, H * D]
torch::Tensor attention_rows(torch::Tensor q, torch::Tensor keys, torch::Tensor values, int64_t start, int64_t window, double scale) {
  TORCH_CHECK(q.dim() == 3 && keys.dim() == 3 && values.sizes() == keys.sizes() && q.size(2) == keys.size(2),
              "attention_rows: q [T, H, D], keys and values [KVH, A, D], got ", q.sizes(), ", ", keys.sizes(), ", ", values.sizes());
  TORCH_CHECK(q.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat && values.scalar_type() == at::kFloat, "attention_rows: float32 only");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous(), "attention_rows: keys and values must be contiguous");
  TORCH_CHECK(q.device().is_cpu() && keys.device().is_cpu() && values.device().is_cpu(), "attention_rows: CPU tensors only");
  q = q.contiguous();
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = keys.size(0), A = keys.size(1);
  TORCH_CHECK(KVH > 0 && H % KVH == 0, "attention_rows: heads must be a multiple of kv heads");
  TORCH_CHECK(start >= 0 && start + T <= A, "attention_rows: rows beyond the cache");
  auto out = torch::empty({T, H * D}, q.options());
  const float *qp = q.data_ptr<float>(), *kp = keys.data_ptr<float>(), *vp = values.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t group = H / KVH;
  at::parallel_for(0, T * H, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> qs(D), scores(start + T);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / H, h = i % H, pos = start + t;
      const int64_t first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
      const int64_t g = h / group;
      attend(qp + (t * H + h) * D, kp + g * A * D, vp + g * A * D, op + t * H * D + h * D, first, pos, D,
             static_cast<float>(scale), qs.data(), scores.data());
    }
  });
  return out;
}

bool available() { return true; }

torch::Tensor rows_mm(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
              "rows_mm: x [R, in] and w [out, in], got ", x.sizes(), " and ", w.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "rows_mm: float32 only");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "rows_mm: CPU tensors only");
  TORCH_CHECK(w.is_contiguous(), "rows_mm: w must be contiguous");
  x = x.contiguous();
  const int64_t R = x.size(0), in = x.size(1), out = w.size(0);
  auto y = torch::empty({R, out}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t r0 = 0; r0 < R; r0 += 8) {  // 8 rows per pass over the weights
    const int64_t n = R - r0 < 8 ? R - r0 : 8;
    kRows[n](xp + r0 * in, wp, yp + r0 * out, in, out);
  }
  return y;
}

#else  // no AVX-512 at compile time: the caller keeps torch's own products

bool available() { return false; }

torch::Tensor rows_mm(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(false, "rows_mm: built without AVX-512");
  return x;
}

torch::Tensor attention_rows(torch::Tensor q, torch::Tensor, torch::Tensor, int64_t, int64_t, double) {
  TORCH_CHECK(false, "attention_rows: built without AVX-512");
  return q;
}

torch::Tensor decode_layer(torch::Tensor x, torch::Tensor, torch::Tensor, std::optional<torch::Tensor>, std::optional<torch::Tensor>,
                           torch::Tensor, std::optional<torch::Tensor>, torch::Tensor, torch::Tensor, torch::Tensor,
                           std::optional<torch::Tensor>, torch::Tensor, torch::Tensor, std::vector<torch::Tensor>,
                           std::vector<torch::Tensor>, std::vector<int64_t>, std::vector<int64_t>, int64_t, int64_t, int64_t,
                           double, double, bool) {
  TORCH_CHECK(false, "decode_layer: built without AVX-512");
  return x;
}

#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("available", &available);
  m.def("rows_mm", &rows_mm, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("attention_rows", &attention_rows, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("decode_layer", &decode_layer, pybind11::call_guard<pybind11::gil_scoped_release>());
}
