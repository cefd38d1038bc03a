// Row operations on raw float32 pointers, written once over vec.h's 16-lane vector (no torch
// here, so a test can build them alone). Each gives a row one fixed arithmetic, whatever the
// rows beside it, the blocking or the thread that runs it:
//   dot(a, b)    acc = 0; for each 16-float block of the inputs, in order: acc = fma(a, b, acc)
//                (a short last block: zeros beyond the end); the sum tree of acc
//   products     y[r, o] = dot(w[o], x[r]) for a block of outputs and up to 8 rows
//   attend       one query row over its keys (attend_slots: keys stored out of order, for trees; attend_many:
//                several rows over the same keys, each block of keys read once for all): scores = dot(q * scale, k_j)
//                (kSumBlock keys at a time where D is whole vectors: vec.h's sum_block, the same bits), their maximum,
//                e^(s - max) (vs::exp) summed in 16 lanes then the tree, the values' weighted sum
//                key by key in order, divided by that sum
//   rmsnorm      y = (x * r) * w, r = 1 / sqrt(dot(x, x) / n + eps)
//   gated        y = act(g) * u (SiLU, or GELU's tanh form), 16 lanes at a time
//   rope         x * cos + rotate_half(x) * sin (sin with its first half negated: RopeTable)
//   argmax       torch.argmax's answer for one row: the first index of the largest value, a NaN
//                larger than everything (the first NaN wins)
#pragma once

#include "vec.h"

namespace vs {

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  V acc = zero();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = fmadd(load(a + i), load(b + i), acc);
  if (i < n) acc = fmadd(load_n(a + i, static_cast<int>(n - i)), load_n(b + i, static_cast<int>(n - i)), acc);
  return sum(acc);
}

// outputs o0 .. o0 + OB - 1 for rows x[0..R): y[r * ldy + o] = dot(w[o], x[r]); the block's
// weights are read once for all R rows, and the next block's are prefetched
template <int R, int OB>
inline void products(const float* __restrict x, const float* __restrict w, float* __restrict y, int64_t in, int64_t ldy, int64_t o0) {
  V acc[OB][R];
  for (int b = 0; b < OB; ++b)
    for (int r = 0; r < R; ++r) acc[b][r] = zero();
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    V xv[R];
    for (int r = 0; r < R; ++r) xv[r] = load(x + r * in + i);
    for (int b = 0; b < OB; ++b) {
      const float* wp = w + (o0 + b) * in + i;
      prefetch(wp + OB * in);
      const V wv = load(wp);
      for (int r = 0; r < R; ++r) acc[b][r] = fmadd(wv, xv[r], acc[b][r]);
    }
  }
  if (i < in) {
    const int n = static_cast<int>(in - i);
    V xv[R];
    for (int r = 0; r < R; ++r) xv[r] = load_n(x + r * in + i, n);
    for (int b = 0; b < OB; ++b) {
      const V wv = load_n(w + (o0 + b) * in + i, n);
      for (int r = 0; r < R; ++r) acc[b][r] = fmadd(wv, xv[r], acc[b][r]);
    }
  }
  for (int b = 0; b < OB; ++b)
    for (int r = 0; r < R; ++r) y[r * ldy + o0 + b] = sum(acc[b][r]);
}

// outputs per block for R rows: as many accumulators as the vector registers hold (speed only:
// an output's arithmetic does not depend on it); tuned on AVX-512's 32 registers, halved with fewer
template <int R>
constexpr int outputs_per_block() {
  constexpr int ob = R == 1 ? 8 : R == 2 ? 6 : R <= 4 ? 4 : 2;
  return kRegisters >= 32 ? ob : (ob / 2 > 0 ? ob / 2 : 1);
}

// attend's weighted sum of the values and its division, with out[0..D) held in registers for
// D == kD (where they hold it): the same fma per value, key by key, as through memory. False
// (nothing done) for another D.
template <int kD, class Slot>
inline bool weigh_values(const float* scores, const float* values, float* out, int64_t first, int64_t S, int64_t D, float total, Slot slot) {
  constexpr int n = kD / 16;
  if (D != kD || n > kRegisters / 2) return false;
  V o[n];
  for (int c = 0; c < n; ++c) o[c] = zero();
  for (int64_t k = 0; k < S; ++k) {
    const V p = set1(scores[k]);
    const float* v = values + slot(first + k) * D;
    for (int c = 0; c < n; ++c) o[c] = fmadd(p, load(v + 16 * c), o[c]);
  }
  const V t = set1(total);
  for (int c = 0; c < n; ++c) store(out + 16 * c, div(o[c], t));
  return true;
}

// scores[m] = dot(qs, keys + slot(j + m) * D) for the kSumBlock keys from j: each dot as dot()
// forms it, their sums together (vec.h's sum_block). D whole vectors.
template <class Slot>
inline void score_block(const float* qs, const float* keys, int64_t j, int64_t D, float* scores, Slot slot) {
  V acc[kSumBlock];
  for (int m = 0; m < kSumBlock; ++m) acc[m] = zero();
  for (int64_t i = 0; i < D; i += 16) {
    const V qv = load(qs + i);
    for (int m = 0; m < kSumBlock; ++m) acc[m] = fmadd(qv, load(keys + slot(j + m) * D + i), acc[m]);
  }
  sum_block(acc, scores);
}

// scores[0..S) -> e^(s - max) in place (vs::exp, 16 lanes); returns their sum (16 lanes, then the tree)
inline float softmax_weights(float* scores, int64_t S) {
  // the largest score (NaNs passed over): 16 lanes, then across them and the tail
  V lanes = set1(-INFINITY);
  int64_t j = 0;
  for (; j + 16 <= S; j += 16) lanes = max(load(scores + j), lanes);
  float mx = -INFINITY, l[16];
  store(l, lanes);
  for (int i = 0; i < 16; ++i) mx = l[i] > mx ? l[i] : mx;
  for (; j < S; ++j) mx = scores[j] > mx ? scores[j] : mx;
  const V vmx = set1(mx);
  V vsum = zero();
  j = 0;
  for (; j + 16 <= S; j += 16) {
    const V e = exp(sub(load(scores + j), vmx));
    store(scores + j, e);
    vsum = add(vsum, e);
  }
  if (j < S) {
    const int n = static_cast<int>(S - j);
    // lanes past the end: exp(0 - max) would count, so they are zeroed (load_n of a zero vector)
    float tail[16];
    store(tail, exp(sub(load_n(scores + j, n), vmx)));
    for (int i = n; i < 16; ++i) tail[i] = 0.0f;
    const V e = load(tail);
    store_n(scores + j, e, n);
    vsum = add(vsum, e);
  }
  return sum(vsum);
}

// out[0..D) = the values' sum weighted by scores, key by key in order, divided by total
template <class Slot>
inline void weigh(const float* scores, const float* values, float* out, int64_t first, int64_t S, int64_t D, float total, Slot slot) {
  if (weigh_values<64>(scores, values, out, first, S, D, total, slot) || weigh_values<128>(scores, values, out, first, S, D, total, slot) ||
      weigh_values<256>(scores, values, out, first, S, D, total, slot))
    return;
  for (int64_t d = 0; d < D; ++d) out[d] = 0.0f;
  for (int64_t k = 0; k < S; ++k) {
    const V p = set1(scores[k]);
    const float* v = values + slot(first + k) * D;
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) store(out + d, fmadd(p, load(v + d), load(out + d)));
    if (d < D) {
      const int n = static_cast<int>(D - d);
      store_n(out + d, fmadd(p, load_n(v + d, n), load_n(out + d, n)), n);
    }
  }
  for (int64_t d = 0; d < D; ++d) out[d] = out[d] / total;
}

// out[0..D) = softmax over keys first..last of (q * scale) . k, applied to the values; key
// (position) j is stored at row slot(j) of keys and values. A chain's slot is the identity; a
// token tree's node sees its ancestors, stored wherever the tree put them (rowwise.cpp): the
// same keys in the same order give the same bits, wherever they lie.
template <class Slot>
inline void attend_slots(const float* q, const float* keys, const float* values, float* out, int64_t first, int64_t last,
                         int64_t D, float scale, float* qs, float* scores, Slot slot) {
  for (int64_t d = 0; d < D; ++d) qs[d] = q[d] * scale;
  const int64_t S = last - first + 1;
  int64_t j0 = 0;
  if (D % 16 == 0)
    for (; j0 + kSumBlock <= S; j0 += kSumBlock) score_block(qs, keys, first + j0, D, scores + j0, slot);
  for (int64_t j = j0; j < S; ++j) scores[j] = dot(qs, keys + slot(first + j) * D, D);
  weigh(scores, values, out, first, S, D, softmax_weights(scores, S), slot);
}

inline void attend(const float* q, const float* keys, const float* values, float* out, int64_t first, int64_t last,
                   int64_t D, float scale, float* qs, float* scores) {
  attend_slots(q, keys, values, out, first, last, D, scale, qs, scores, [](int64_t j) { return j; });
}

// One query of attend_many: its row q and out, the keys it sees (first..last), its buffers (qs:
// D floats; scores: last - first + 1), and for a token tree's row its path (attend_slots): key
// j >= start is read from row start + path[j - start]; without a path, key j from row j
struct Query {
  const float* q;
  float* out;
  int64_t first, last;
  float* qs;
  float* scores;
  const int64_t* path = nullptr;
  int64_t start = 0;
  int64_t slot(int64_t j) const { return path != nullptr && j >= start ? start + path[j - start] : j; }
  int64_t in_order_end() const { return path != nullptr && start <= last ? start : last + 1; }  // keys before it: row j
};

constexpr int kAttendMany = 64;  // the most queries attend_many takes at once

// weigh for kQ chain queries (no path) of D == kD at once, their sums in registers: each value
// row is read once for all of them, and each query still adds its keys' weighted values in order
template <int kD, int kQ>
inline void weigh_together(const Query* qv, const float* totals, const float* values) {
  constexpr int n = kD / 16;
  V o[kQ][n];
  int64_t lo = qv[0].first, hi = qv[0].last;
  for (int i = 0; i < kQ; ++i) {
    for (int c = 0; c < n; ++c) o[i][c] = zero();
    lo = qv[i].first < lo ? qv[i].first : lo;
    hi = qv[i].last > hi ? qv[i].last : hi;
  }
  for (int64_t j = lo; j <= hi; ++j) {
    V v[n];
    for (int c = 0; c < n; ++c) v[c] = load(values + j * kD + 16 * c);
    for (int i = 0; i < kQ; ++i) {
      if (j < qv[i].first || j > qv[i].last) continue;
      const V p = set1(qv[i].scores[j - qv[i].first]);
      for (int c = 0; c < n; ++c) o[i][c] = fmadd(p, v[c], o[i][c]);
    }
  }
  for (int i = 0; i < kQ; ++i) {
    const V t = set1(totals[i]);
    for (int c = 0; c < n; ++c) store(qv[i].out + 16 * c, div(o[i][c], t));
  }
}

// attend for several queries over the same keys and values (a verification's rows, the query
// heads that share a kv head): each query gets exactly attend_slots' bits, while each block of
// kSumBlock keys stored in order is read once for every query that sees all of it (then from L1)
inline void attend_many(const Query* qv, int n, const float* keys, const float* values, int64_t D, float scale) {
  int64_t lo = qv[0].first, hi = qv[0].last;
  for (int i = 0; i < n; ++i) {
    for (int64_t d = 0; d < D; ++d) qv[i].qs[d] = qv[i].q[d] * scale;
    lo = qv[i].first < lo ? qv[i].first : lo;
    hi = qv[i].last > hi ? qv[i].last : hi;
  }
  int64_t blocked_lo[kAttendMany], blocked_hi[kAttendMany];  // each query's keys scored in whole blocks: [lo, hi)
  for (int i = 0; i < n; ++i) blocked_lo[i] = blocked_hi[i] = qv[i].first;
  const auto in_order = [](int64_t j) { return j; };
  if (D % 16 == 0)
    for (int64_t b = lo; b + kSumBlock - 1 <= hi; b += kSumBlock)
      for (int i = 0; i < n; ++i) {
        if (b < qv[i].first || b + kSumBlock > qv[i].in_order_end()) continue;
        if (blocked_hi[i] == blocked_lo[i]) blocked_lo[i] = b;
        score_block(qv[i].qs, keys, b, D, qv[i].scores + (b - qv[i].first), in_order);
        blocked_hi[i] = b + kSumBlock;
      }
  float totals[kAttendMany];
  for (int i = 0; i < n; ++i) {
    const Query& Q = qv[i];
    for (int64_t j = Q.first; j < blocked_lo[i]; ++j) Q.scores[j - Q.first] = dot(Q.qs, keys + Q.slot(j) * D, D);
    for (int64_t j = blocked_hi[i]; j <= Q.last; ++j) Q.scores[j - Q.first] = dot(Q.qs, keys + Q.slot(j) * D, D);
    totals[i] = softmax_weights(Q.scores, Q.last - Q.first + 1);
  }
  // the values: chain queries several at a time where their sums fit the registers together
  const auto chains = [&](int i, int k) {
    for (int m = i; m < i + k; ++m)
      if (qv[m].path != nullptr) return false;
    return true;
  };
  for (int i = 0; i < n;) {
    if (kRegisters >= 32 && D == 64 && i + 4 <= n && chains(i, 4)) {
      weigh_together<64, 4>(qv + i, totals + i, values);
      i += 4;
    } else if (kRegisters >= 32 && D == 128 && i + 2 <= n && chains(i, 2)) {
      weigh_together<128, 2>(qv + i, totals + i, values);
      i += 2;
    } else {
      const Query& Q = qv[i];
      weigh(Q.scores, values, Q.out, Q.first, Q.last - Q.first + 1, D, totals[i], [&Q](int64_t j) { return Q.slot(j); });
      ++i;
    }
  }
}

inline void rmsnorm(const float* x, const float* w, float* y, int64_t n, float eps) {
  const float r = 1.0f / std::sqrt(dot(x, x, n) / static_cast<float>(n) + eps);
  for (int64_t j = 0; j < n; ++j) y[j] = (x[j] * r) * w[j];
}

// SiLU g / (1 + e^-g), or GELU's tanh form 0.5 g (1 + tanh(c (g + 0.044715 g^3))) with
// tanh z = 1 - 2 / (e^2z + 1)
inline V act(V g, bool gelu) {
  const V one = set1(1.0f);
  if (!gelu) return div(g, add(one, exp(sub(zero(), g))));
  const V g3 = mul(mul(g, g), g);
  const V z = mul(set1(0.7978845608028654f), add(g, mul(set1(0.044715f), g3)));
  const V e = exp(add(z, z));
  const V t = sub(one, div(set1(2.0f), add(e, one)));
  return mul(mul(set1(0.5f), g), add(one, t));
}

inline void gated(const float* g, const float* u, float* y, int64_t n, bool gelu) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store(y + i, mul(act(load(g + i), gelu), load(u + i)));
  if (i < n) {
    const int m = static_cast<int>(n - i);
    store_n(y + i, mul(act(load_n(g + i, m), gelu), load_n(u + i, m)), m);
  }
}

inline void rope(float* x, const float* cos, const float* sin, int64_t D, float* tmp) {
  const int64_t half = D / 2;
  for (int64_t d = 0; d < half; ++d) tmp[d] = x[d] * cos[d] + x[d + half] * sin[d];
  for (int64_t d = half; d < D; ++d) tmp[d] = x[d] * cos[d] + x[d - half] * sin[d];
  for (int64_t d = 0; d < D; ++d) x[d] = tmp[d];
}

// torch.argmax's rule one value at a time: the reference, and the path for rows holding an
// infinity or a NaN
inline int64_t argmax_exact(const float* x, int64_t n) {
  float best = x[0];
  if (best != best) return 0;
  int64_t at = 0;
  for (int64_t i = 1; i < n; ++i) {
    const float v = x[i];
    if (v != v) return i;
    if (v > best) best = v, at = i;
  }
  return at;
}

// The same index for a row of n >= 1 values: the largest value in vector lanes (every lane's
// v * 0 summed beside it: NaN once an infinity or a NaN is met, which sends the row to
// argmax_exact), then the first index holding it (x == best: -0 and +0 tie, as they do for
// torch's comparison, so the first of them wins), looked for only in the lanes whose largest
// value it is (lane k holds x[k], x[k + 16], ...), then in the tail
inline int64_t argmax(const float* x, int64_t n) {
  constexpr float lowest = -3.4028235e38f;  // the most negative finite float
  const int64_t body = n / 16 * 16;
  V m = set1(lowest), finite = zero();
  for (int64_t i = 0; i < body; i += 16) {
    const V v = load(x + i);
    m = max(v, m);
    finite = add(finite, mul(v, zero()));
  }
  alignas(64) float lanes[16], flags[16];
  store(lanes, m);
  store(flags, finite);
  float best = lowest;
  for (int k = 0; k < 16; ++k) {
    if (flags[k] != 0.0f) return argmax_exact(x, n);
    if (lanes[k] > best) best = lanes[k];
  }
  for (int64_t i = body; i < n; ++i) {
    if (!std::isfinite(x[i])) return argmax_exact(x, n);
    if (x[i] > best) best = x[i];
  }
  int64_t first = n;
  for (int k = 0; k < 16 && body > 0; ++k) {
    if (lanes[k] != best) continue;
    for (int64_t i = k; i < body && i < first; i += 16)
      if (x[i] == best) {
        first = i;
        break;
      }
  }
  for (int64_t i = body; i < n && i < first; ++i)
    if (x[i] == best) {
      first = i;
      break;
    }
  return first < n ? first : 0;  // first < n always: best is one of the row's values
}

}  // namespace vs
