// Row-wise products and attention for decoding and verification on the CPU.
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

#include <algorithm>
#include <vector>

at::Tensor rows_mm(at::Tensor x, at::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
              "rows_mm: x [R, in] and w [out, in], got ", x.sizes(), " and ", w.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "rows_mm: float32 only");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "rows_mm: CPU tensors only");
  TORCH_CHECK(w.is_contiguous(), "rows_mm: w must be contiguous");
  return weight_mm(x, Weight{{w}, {0}});  // one float32 part (quant.cpp)
}

at::Tensor rows_argmax(at::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) > 0 && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "rows_argmax: x must be float32 [R, V] on the CPU with V > 0, got ", x.sizes());
  x = x.contiguous();
  const int64_t R = x.size(0), V = x.size(1);
  auto out = at::empty({R}, x.options().dtype(at::kLong));
  const float* p = x.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) o[r] = vs::argmax(p + r * V, V);
  });
  return out;
}

// out[t, h] = attend(q[t, h]) over keys j = first(t) .. pos(t) of kv head g(h): pos(t) = start + t,
// first(t) = max(0, pos(t) - window + 1) with a window, else 0; g(h) = h / (H / KVH).
// A token tree (parents [T] int64, parents[t] in [-1, t), -1: a root): row t is stored at slot
// start + t but sits at position pos(t) = start + depth(t), and sees the positions before start and
// then its path (its ancestors root first, then itself): the keys a chain decoding that path would
// have at those positions, in the same order, so the same bits.
// q [T, H, D]; keys, values [KVH, A, D] (one layer of a KVCache, A >= start + T) -> [T, H * D]
void tree_paths(const at::Tensor& parents, std::vector<int64_t>& paths, std::vector<int64_t>& offsets) {
  auto par = parents.contiguous();
  const int64_t T = par.size(0);
  TORCH_CHECK(par.scalar_type() == at::kLong && par.dim() == 1, "attention_rows: parents [T] int64");
  const int64_t* pp = par.data_ptr<int64_t>();
  paths.clear();
  offsets.assign(T + 1, 0);
  std::vector<int64_t> up;
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(pp[t] >= -1 && pp[t] < t, "attention_rows: parents[", t, "] = ", pp[t], " must be -1 or an earlier row");
    up.clear();
    for (int64_t r = t; r >= 0; r = pp[r]) up.push_back(r);
    paths.insert(paths.end(), up.rbegin(), up.rend());
    offsets[t + 1] = static_cast<int64_t>(paths.size());
  }
}

// the (row, head) pairs [i0, i1), kv head by kv head, through attend_many (the keys read once per
// block for all of them); a tree's row at its depth's position, seeing its path
void AttentionRows::range(int64_t i0, int64_t i1) const {
  if (i0 >= i1) return;
  const bool tree = paths != nullptr;
  const int64_t group = H / KVH, n = std::min<int64_t>(i1 - i0, vs::kAttendMany);
  const auto first_of = [&](int64_t pos) { return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0; };
  std::vector<float> qs(n * D), scores(n * (start + T));
  std::vector<vs::Query> queries;
  for (int64_t g = 0; g < KVH; ++g) {
    const auto flush = [&] {
      if (!queries.empty()) vs::attend_many(queries.data(), static_cast<int>(queries.size()), keys + g * A * D, values + g * A * D, D, scale);
      queries.clear();
    };
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / H, h = i % H;
      if (h / group != g) continue;
      const int64_t pos = tree ? start + (*offsets)[t + 1] - (*offsets)[t] - 1 : start + t;
      const int64_t k = static_cast<int64_t>(queries.size());
      vs::Query query{q + t * ldq + h * D, out + t * H * D + h * D, first_of(pos), pos, qs.data() + k * D, scores.data() + k * (start + T)};
      if (tree) query.path = paths->data() + (*offsets)[t], query.start = start;
      queries.push_back(query);
      if (static_cast<int64_t>(queries.size()) == n) flush();
    }
    flush();
  }
}

at::Tensor attention_rows(at::Tensor q, at::Tensor keys, at::Tensor values, int64_t start, int64_t window, double scale,
                          std::optional<at::Tensor> parents) {
  TORCH_CHECK(q.dim() == 3 && keys.dim() == 3 && values.sizes() == keys.sizes() && q.size(2) == keys.size(2),
              "attention_rows: q [T, H, D], keys and values [KVH, A, D], got ", q.sizes(), ", ", keys.sizes(), ", ", values.sizes());
  TORCH_CHECK(q.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat && values.scalar_type() == at::kFloat, "attention_rows: float32 only");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous(), "attention_rows: keys and values must be contiguous");
  TORCH_CHECK(q.device().is_cpu() && keys.device().is_cpu() && values.device().is_cpu(), "attention_rows: CPU tensors only");
  q = q.contiguous();
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = keys.size(0), A = keys.size(1);
  TORCH_CHECK(KVH > 0 && H % KVH == 0, "attention_rows: heads must be a multiple of kv heads");
  TORCH_CHECK(start >= 0 && start + T <= A, "attention_rows: rows beyond the cache");
  std::vector<int64_t> paths, offsets;
  if (parents) {
    TORCH_CHECK(parents->dim() == 1 && parents->size(0) == T, "attention_rows: parents [T] int64");
    tree_paths(*parents, paths, offsets);
  }
  auto out = at::empty({T, H * D}, q.options());
  const AttentionRows rows{q.data_ptr<float>(), H * D, keys.data_ptr<float>(), values.data_ptr<float>(), out.data_ptr<float>(),
                           T, H, KVH, D, A, start, window, static_cast<float>(scale),
                           parents ? &paths : nullptr, parents ? &offsets : nullptr};
  at::parallel_for(0, T * H, 1, [&](int64_t i0, int64_t i1) {
    vs::FpMode mode;
    rows.range(i0, i1);
  });
  return out;
}
