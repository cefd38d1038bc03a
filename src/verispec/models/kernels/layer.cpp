// A model's decoder layers for decoding and verification rows, in one call (Stack::forward): the
// glue between the products (norms, q/k norms, RoPE, the cache write, residuals, the gated
// activation) and the products themselves, every layer inside one parallel region. Same model as
// Transformer._layer (models/decoder/transformer.py):
//
//   h = rmsnorm(x) ; qkv = h @ Wqkv^T (+ bias) ; q, k = rope(qknorm(q, k)) ; cache[start..] = k, v
//   a = attention(q) @ Wo^T (post-norm) ; x += a
//   h = rmsnorm(x) ; g, u = h @ Wgu^T ; m = act(g) * u ; d = m @ Wdown^T (post-norm) ; x += d
//
// Why one region: a layer called from Python cost a fixed overhead beyond its arithmetic (the
// arguments' conversion, five parallel regions each waking the threads and joining them,
// allocations), a large share of a small model's token (docs/results/quant/2026-12-06-stack.md).
// Here the threads meet at a barrier between steps (~10 a layer): the glue, and the quantisation
// of a product's input for int8 activations (QuantRows), split by rows (each thread its own), the
// products by outputs and the attention by (row, head) pairs (Product::share, AttentionRows::share).
//
// Rows: the segments of several sequences, segment s at rows [rows[s], rows[s + 1]) of x, its new
// positions from starts[s], its cache's keys[s], values[s] ([layers, KVH, A, D]); parents[s] where
// its rows are a token tree (each row at its depth's position, seeing its path: rowwise.cpp; cos
// and sin are then the caller's, at those positions), rows written at slots starts[s].. all the
// same. Every step is row by row with ops.h's fixed arithmetic, so a row's result does not depend
// on the rows beside it, their number or the threads.
#include "rowwise.h"

#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <chrono>

namespace {

const float* ptr(const std::optional<at::Tensor>& t) { return t ? t->data_ptr<float>() : nullptr; }

void check_vector(const std::optional<at::Tensor>& t, int64_t n, const char* what) {
  TORCH_CHECK(!t || (t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == n && t->device().is_cpu()),
              "Stack: ", what, " must be float32 with ", n, " values on the CPU");
}

}  // namespace

Stack::Stack(int64_t heads, int64_t kv_heads, int64_t head_dim, double scale, double eps, bool gelu)
    : H_(heads), KVH_(kv_heads), D_(head_dim), scale_(static_cast<float>(scale)), eps_(static_cast<float>(eps)), gelu_(gelu) {
  TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0 && head_dim % 2 == 0,
              "Stack: heads a multiple of kv heads, an even head_dim");
}

void Stack::add_layer(at::Tensor attn_norm, Weight qkv, std::optional<at::Tensor> qkv_bias, std::optional<at::Tensor> qk_norm, Weight o,
                      std::optional<at::Tensor> post_attn_norm, at::Tensor mlp_norm, Weight gate_up, Weight down,
                      std::optional<at::Tensor> post_mlp_norm, int64_t window, bool local) {
  const int64_t hidden = attn_norm.numel(), width = (H_ + 2 * KVH_) * D_, inter = weight_rows(gate_up) / 2;
  TORCH_CHECK(layers_.empty() || (hidden == hidden_ && inter == inter_), "Stack: every layer has the same sizes");
  // each matrix resolved and checked once, here, where an error can still be raised (not in the region)
  WeightParts qkv_parts(qkv, hidden), o_parts(o, H_ * D_), gate_up_parts(gate_up, hidden), down_parts(down, inter);
  check_vector(attn_norm, hidden, "attn_norm");
  check_vector(mlp_norm, hidden, "mlp_norm");
  check_vector(post_attn_norm, hidden, "post_attn_norm");
  check_vector(post_mlp_norm, hidden, "post_mlp_norm");
  check_vector(qkv_bias, width, "qkv_bias");
  check_vector(qk_norm, (H_ + KVH_) * D_, "qk_norm");
  TORCH_CHECK(qkv_parts.rows() == width, "Stack: qkv has (heads + 2 kv_heads) * head_dim rows");
  TORCH_CHECK(o_parts.rows() == hidden && down_parts.rows() == hidden && 2 * inter == gate_up_parts.rows(),
              "Stack: o and down have hidden rows, gate_up an even number");
  hidden_ = hidden, inter_ = inter;
  int8_ = int8_ || qkv_parts.int8() || o_parts.int8() || gate_up_parts.int8() || down_parts.int8();
  layers_.push_back(Layer{attn_norm, mlp_norm, std::move(qkv_parts), std::move(o_parts), std::move(gate_up_parts), std::move(down_parts),
                          qkv_bias, qk_norm, post_attn_norm, post_mlp_norm, window, local});
}

void Stack::set_head(at::Tensor norm, Weight head) {
  TORCH_CHECK(!layers_.empty(), "Stack: the layers first, then the head");
  check_vector(norm, hidden_, "the final norm");
  head_.emplace(head, hidden_);
  int8_ = int8_ || head_->int8();
  norm_ = norm;
}

void Stack::set_profile(bool on) {
  profiling_ = on;
  std::fill(part_seconds_.begin(), part_seconds_.end(), 0.0);
  profiled_ = 0;
}

std::tuple<std::vector<std::string>, std::vector<double>, int64_t> Stack::profile() const {
  return {std::vector<std::string>(std::begin(kParts), std::end(kParts)), part_seconds_, profiled_};
}

std::tuple<at::Tensor, at::Tensor, std::vector<at::Tensor>> Stack::forward(at::Tensor x, at::Tensor cos, at::Tensor sin, at::Tensor cos_local,
                                                               at::Tensor sin_local, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                                                               std::vector<int64_t> rows, std::vector<int64_t> starts,
                                                               std::vector<std::optional<at::Tensor>> parents, std::vector<int64_t> capture,
                                                               std::vector<int64_t> logit_rows) const {
  const int64_t L = size(), H = H_, KVH = KVH_, D = D_, QK = H + KVH, width = (QK + KVH) * D, I = inter_, hidden = hidden_;
  TORCH_CHECK(L > 0, "Stack: no layers");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.size(1) == hidden && x.device().is_cpu(),
              "Stack.forward: x float32 [N, ", hidden, "]");
  const int64_t N = x.size(0), S = static_cast<int64_t>(rows.size());
  for (auto* t : {&cos, &sin, &cos_local, &sin_local}) {
    *t = t->contiguous();
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->dim() == 2 && t->size(0) == N && t->size(1) == D, "Stack.forward: cos, sin [N, D]");
  }
  TORCH_CHECK(S > 0 && keys.size() == static_cast<size_t>(S) && values.size() == keys.size() && starts.size() == rows.size() &&
              parents.size() == rows.size(), "Stack.forward: one rows, starts, parents, keys, values entry per segment");
  TORCH_CHECK(rows[0] == 0, "Stack.forward: the first segment starts at row 0");
  std::vector<std::vector<int64_t>> paths(S), offsets(S);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t r0 = rows[s], r1 = s + 1 < S ? rows[s + 1] : N, T = r1 - r0;
    TORCH_CHECK(r0 >= 0 && T > 0 && r1 <= N, "Stack.forward: segment ", s, " has no rows");
    for (const auto& c : {keys[s], values[s]})
      TORCH_CHECK(c.scalar_type() == at::kFloat && c.is_contiguous() && c.dim() == 4 && c.size(0) == L && c.size(1) == KVH &&
                  c.size(3) == D && starts[s] >= 0 && c.size(2) >= starts[s] + T && c.device().is_cpu(),
                  "Stack.forward: segment ", s, " needs contiguous float32 caches [", L, ", ", KVH, ", >= ", starts[s] + T, ", ", D, "]");
    TORCH_CHECK(values[s].sizes() == keys[s].sizes(), "Stack.forward: keys and values of one shape");
    if (parents[s]) {
      TORCH_CHECK(parents[s]->dim() == 1 && parents[s]->size(0) == T, "Stack.forward: parents [T] int64 for segment ", s);
      tree_paths(*parents[s], paths[s], offsets[s]);
    }
  }
  for (int64_t c : capture) TORCH_CHECK(c >= 0 && c < L, "Stack.forward: capture layer ", c, " out of range");
  for (int64_t r : logit_rows) TORCH_CHECK(r >= 0 && r < N, "Stack.forward: logit row ", r, " out of range");
  TORCH_CHECK(logit_rows.empty() || head_, "Stack.forward: logits need set_head");
  const int64_t nl = static_cast<int64_t>(logit_rows.size());

  x = x.clone(at::MemoryFormat::Contiguous);  // the residual stream, updated in place
  auto opts = x.options();
  auto h = at::empty({N, hidden}, opts), qkv = at::empty({N, width}, opts), attn = at::empty({N, H * D}, opts);
  auto a = at::empty({N, hidden}, opts), gu = at::empty({N, 2 * I}, opts), m = at::empty({N, I}, opts);
  auto hn = at::empty({N, hidden}, opts), picked = at::empty({nl, hidden}, opts);
  auto logits = at::empty({nl, head_ ? head_->rows() : 0}, opts);
  std::vector<at::Tensor> captured;
  for (size_t c = 0; c < capture.size(); ++c) captured.push_back(at::empty({N, hidden}, opts));
  float *X = x.data_ptr<float>(), *Hp = h.data_ptr<float>(), *Q = qkv.data_ptr<float>(), *At = attn.data_ptr<float>();
  float *Ap = a.data_ptr<float>(), *G = gu.data_ptr<float>(), *M = m.data_ptr<float>();
  float *Hn = hn.data_ptr<float>(), *P = picked.data_ptr<float>();
  // each row's segment and its index there (the cache slot it writes)
  std::vector<int64_t> seg_of(N), index_in(N);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t r = rows[s]; r < (s + 1 < S ? rows[s + 1] : N); ++r) seg_of[r] = s, index_in[r] = r - rows[s];
  // the products' inputs quantised for int8 activations, row by row by the thread that made them
  std::optional<QuantRows> hq, aq, mq, pq;  // of h (q/k/v, gate/up), attn (o), m (down), picked (the LM head)
  if (int8_) hq.emplace(N, hidden), aq.emplace(N, H * D), mq.emplace(N, I), pq.emplace(nl, hidden);
  const auto xq = [](const WeightParts& w, std::optional<QuantRows>& q) { return w.int8() ? &*q : nullptr; };

  // The glue runs row by row, each thread over its own rows [r0, r1) (the products and the
  // attention are split by outputs and by (row, head) instead), so a barrier separates each
  // product from the glue before and after it.
#pragma omp parallel num_threads(at::get_num_threads())
  {
    vs::FpMode mode;
    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads(), r0 = N * t / n, r1 = N * (t + 1) / n;
    // profiling: the first thread, just past a barrier, charges the time since its last mark to
    // the part that ran in between (every thread waited for it there)
    enum { kGlue, kQkv, kAttention, kO, kGateUp, kDown, kHead };
    auto last = std::chrono::steady_clock::now();
    const auto mark = [&](int part) {
      if (!profiling_ || t != 0) return;
      const auto now = std::chrono::steady_clock::now();
      part_seconds_[part] += std::chrono::duration<double>(now - last).count();
      last = now;
    };
    std::vector<float> tmp(D);
    std::vector<AttentionRows> jobs(S);
    // y = norm(y) where a post-norm is given, then x += y (a residual update)
    const auto residual = [&](const std::optional<at::Tensor>& post, float* y) {
      for (int64_t r = r0; r < r1; ++r) {
        float* yr = y + r * hidden;
        if (post) vs::rmsnorm(yr, ptr(post), yr, hidden, eps_);
        for (int64_t j = 0; j < hidden; ++j) X[r * hidden + j] = X[r * hidden + j] + yr[j];
      }
    };
    const auto norm_rows = [&](const float* w, float* out) {
      for (int64_t r = r0; r < r1; ++r) vs::rmsnorm(X + r * hidden, w, out + r * hidden, hidden, eps_);
    };
    const auto quantize = [&](std::optional<QuantRows>& q, const WeightParts& w, const float* x) {
      if (w.int8()) q->quantize(x, r0, r1);
    };
    for (int64_t l = 0; l < L; ++l) {
      const Layer& W = layers_[l];
      // 1. the attention's input: the norm, then q/k/v
      if (l > 0) residual(layers_[l - 1].post_mlp_norm, Ap);  // the previous layer's MLP output
      for (size_t c = 0; c < capture.size(); ++c)
        if (capture[c] == l) std::copy(X + r0 * hidden, X + r1 * hidden, captured[c].data_ptr<float>() + r0 * hidden);
      norm_rows(W.attn_norm.data_ptr<float>(), Hp);
      quantize(hq, W.qkv, Hp);
#pragma omp barrier
      mark(kGlue);
      Product(Hp, N, W.qkv, Q, xq(W.qkv, hq)).share(t, n);
#pragma omp barrier
      mark(kQkv);
      // 2. bias, q/k norms, RoPE, keys and values into each segment's cache
      const float* cs = (W.local ? cos_local : cos).data_ptr<float>();
      const float* sn = (W.local ? sin_local : sin).data_ptr<float>();
      for (int64_t r = r0; r < r1; ++r) {
        float* row = Q + r * width;
        if (W.qkv_bias)
          for (int64_t j = 0; j < width; ++j) row[j] = row[j] + ptr(W.qkv_bias)[j];
        for (int64_t hh = 0; hh < QK; ++hh) {
          float* v = row + hh * D;
          if (W.qk_norm) vs::rmsnorm(v, ptr(W.qk_norm) + hh * D, v, D, eps_);
          vs::rope(v, cs + r * D, sn + r * D, D, tmp.data());
        }
        const int64_t s = seg_of[r], A = keys[s].size(2), slot = starts[s] + index_in[r];
        float* kc = keys[s].data_ptr<float>() + l * KVH * A * D;
        float* vc = values[s].data_ptr<float>() + l * KVH * A * D;
        for (int64_t g = 0; g < KVH; ++g) {
          std::copy(row + (H + g) * D, row + (H + g + 1) * D, kc + (g * A + slot) * D);
          std::copy(row + (QK + g) * D, row + (QK + g + 1) * D, vc + (g * A + slot) * D);
        }
      }
      for (int64_t s = 0; s < S; ++s) {
        const int64_t q0 = rows[s], T = (s + 1 < S ? rows[s + 1] : N) - q0, A = keys[s].size(2);
        jobs[s] = AttentionRows{Q + q0 * width, width, keys[s].data_ptr<float>() + l * KVH * A * D,
                                values[s].data_ptr<float>() + l * KVH * A * D, At + q0 * H * D, T, H, KVH, D, A, starts[s], W.window,
                                scale_, parents[s] ? &paths[s] : nullptr, parents[s] ? &offsets[s] : nullptr};
      }
#pragma omp barrier
      mark(kGlue);
      // 3. attention, then its projection
      for (int64_t s = 0; s < S; ++s) jobs[s].share(t, n);
#pragma omp barrier
      mark(kAttention);
      if (W.o.int8()) {
        quantize(aq, W.o, At);
#pragma omp barrier
        mark(kGlue);
      }
      Product(At, N, W.o, Ap, xq(W.o, aq)).share(t, n);
#pragma omp barrier
      mark(kO);
      // 4. the MLP
      residual(W.post_attn_norm, Ap);
      norm_rows(W.mlp_norm.data_ptr<float>(), Hp);
      quantize(hq, W.gate_up, Hp);
#pragma omp barrier
      mark(kGlue);
      Product(Hp, N, W.gate_up, G, xq(W.gate_up, hq)).share(t, n);
#pragma omp barrier
      mark(kGateUp);
      for (int64_t r = r0; r < r1; ++r) vs::gated(G + r * 2 * I, G + r * 2 * I + I, M + r * I, I, gelu_);
      quantize(mq, W.down, M);
#pragma omp barrier
      mark(kGlue);
      Product(M, N, W.down, Ap, xq(W.down, mq)).share(t, n);
#pragma omp barrier
      mark(kDown);
    }
    // 5. the final norm, and the LM head over the rows that want logits
    residual(layers_[L - 1].post_mlp_norm, Ap);
    if (norm_) {
      norm_rows(norm_->data_ptr<float>(), Hn);
      for (int64_t i = 0; i < nl; ++i)
        if (logit_rows[i] >= r0 && logit_rows[i] < r1) {
          std::copy_n(Hn + logit_rows[i] * hidden, hidden, P + i * hidden);
          if (head_->int8()) pq->quantize(P, i, i + 1);
        }
    }
    if (nl) {
#pragma omp barrier
      mark(kGlue);
      Product(P, nl, *head_, logits.data_ptr<float>(), xq(*head_, pq)).share(t, n);
    }
    if (profiling_) {  // every thread reads the same flag, so all or none meet here
#pragma omp barrier
      mark(nl ? kHead : kGlue);
    }
  }
  if (profiling_) ++profiled_;
  return {norm_ ? hn : x, logits, captured};
}
