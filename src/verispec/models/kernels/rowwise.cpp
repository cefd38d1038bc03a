// Row-wise products and attention for decoding and verification on the CPU, and the module.
//
// rows_mm: y [R, out] = x [R, in] @ w [out, in]^T, float32, w row-major and contiguous, any R.
// Why: MKL runs these shapes (1-8 rows against a weight matrix) far below the memory bandwidth and
// rounds a row differently with the number of rows beside it. Here every (output, row) pair is
// ops.h's dot, whatever R, the row's neighbours, the blocking or the thread count, and the weights
// are read once per 8 rows. So a verified draft row gets bit for bit the logits a one-row decode
// gives it, on every variant.
//
// Work split (weight_mm, quant.cpp: rows_mm is its one-part float32 case): threads (torch's pool,
// at::parallel_for) take blocks of consecutive outputs; within a block the rows go 1-8 at a time
// (templates R = 1..8), the block's weights staying in L1 while every row passes. Each thread pins
// the floating-point mode (vs::FpMode).
#include "rowwise.h"

#include <ATen/Parallel.h>

#include <vector>

torch::Tensor rows_mm(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
              "rows_mm: x [R, in] and w [out, in], got ", x.sizes(), " and ", w.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "rows_mm: float32 only");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "rows_mm: CPU tensors only");
  TORCH_CHECK(w.is_contiguous(), "rows_mm: w must be contiguous");
  return weight_mm(x, Weight{{w}, {0}});  // one float32 part (quant.cpp)
}

// out[t, h] = attend(q[t, h]) over keys j = first(t) .. pos(t) of kv head g(h): pos(t) = start + t,
// first(t) = max(0, pos(t) - window + 1) with a window, else 0; g(h) = h / (H / KVH).
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
    vs::FpMode mode;
    std::vector<float> qs(D), scores(start + T);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / H, h = i % H, pos = start + t;
      const int64_t first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
      const int64_t g = h / group;
      vs::attend(qp + (t * H + h) * D, kp + g * A * D, vp + g * A * D, op + t * H * D + h * D, first, pos, D,
                 static_cast<float>(scale), qs.data(), scores.data());
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("variant", []() { return std::string(vs::kVariant); });
  m.def("rows_mm", &rows_mm, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("attention_rows", &attention_rows, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("weight_mm", &weight_mm, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("dequantize", &dequantize, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("take_rows", &take_rows, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("decode_layer", &decode_layer, pybind11::call_guard<pybind11::gil_scoped_release>());
}
