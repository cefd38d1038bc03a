// Products over GGUF blocks with int8 activations (weights_format "gguf-int8"), as llama.cpp
// computes them: each row of x is quantised in blocks of 32, the weights' integer quants are
// multiplied by it in integers, and the float scales applied per group of 4 weights. Here: the
// K-quants (Q4_K, Q5_K, Q6_K); the 32-weight formats apply their scales per block (tile8.h).
//
// The arithmetic, defined once (every variant computes the same bits; no torch here):
//   x, one block of 32 values:  a = max |x_i|;  d = a / 127;  q_i = round_even(x_i * (127 / a))
//     (q = 0 and d = 0 where a = 0), clamped to [-127, 127]. Per group g of 4 values (a lane):
//     s_g = sum of its q_i (an integer), dx_g = d, sx_g = d * s_g.
//   a weight row, 64 weights at a time (a quarter of a 256-weight block), 16 lanes, lane l
//   covering weights 4l .. 4l + 3: its integer quants u (unsigned, offset by o: the weight is
//   ws * (u - o) + wm), the lane's scale ws and min wm (format by format below).
//     i_l  = sum over the lane of u * q - o * s_g      (integers, exact)
//     acc_l = fma(float(i_l), ws_l * dx_g, acc_l)
//     acc_l = fma(wm_l, sx_g, acc_l)                  (formats with a min)
//   y = vec.h's sum tree over the 16 lanes.
// So a row's result depends on its own x and the weights only: batch invariance holds as in the
// float32 products. Prompts (48+ rows) keep the exact float32 path (models/decoder/transformer.py's _project).
#pragma once

#include <limits>

#include "int8.h"

namespace vs {

// x [R, in] quantised for the products: q [R, n], dx / sx [R, n / 4] float, s [R, n / 4] int32,
// n = in rounded up to 64 (zeros beyond in); per 32-value block (tile8.h's products) the sum of
// its q, sb [R, n / 32] int32, and sxb = d * float(sb) [R, n / 32] float
struct XQ {
  int8_t* q;
  float* dx;
  float* sx;
  int32_t* s;
  int64_t n;
  int32_t* sb;
  float* sxb;
};

inline int64_t padded64(int64_t in) { return (in + 63) / 64 * 64; }

// a 32-value block's groups of 4: s[g] = q[4g] + .. + q[4g + 3] (integers), dx[g] = d, sx[g] =
// d * float(s[g]); returns the block's sum of q
inline int32_t group_sums(const int8_t* q, float d, int32_t* s, float* dx, float* sx) {
#if defined(VERISPEC_AVX512) || defined(VERISPEC_AVX2)
  // two 16-byte loads, as to_i8 stored them (one 32-byte load of two fresh stores waits for both)
  const __m256i q32 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))),
                                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)), 1);
  const __m256i g = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q32), _mm256_set1_epi16(1));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(s), g);
  const __m256 vd = _mm256_set1_ps(d);
  _mm256_storeu_ps(dx, vd);
  _mm256_storeu_ps(sx, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(g)));
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
  return _mm_cvtsi128_si32(h);
#else
  int32_t sum = 0;
  for (int k = 0; k < 8; ++k) {
    s[k] = q[4 * k] + q[4 * k + 1] + q[4 * k + 2] + q[4 * k + 3];
    dx[k] = d;
    sx[k] = d * static_cast<float>(s[k]);
    sum += s[k];
  }
  return sum;
#endif
}

inline void quantize_rows(const float* x, int64_t rows, int64_t in, const XQ& xq) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * in;
    int8_t* q = xq.q + r * xq.n;
    for (int64_t b = 0; b < xq.n / 32; ++b) {
      int8_t* qb = q + 32 * b;
      float d = 0.0f;
      if (32 * b < in) {  // `in` is a whole number of 32-blocks (every format's block size divides it)
        const float* xb = xr + 32 * b;
        const float a = max_abs32(xb);
        if (a > 0.0f && a <= 3.4028235e38f) {
          d = a / 127.0f;
          // q = round_even(x * id) clamped to [-127, 127] (a NaN, from 0 * an infinite id, to 0)
          const V id = set1(127.0f / a), lo = set1(-127.0f), hi = set1(127.0f);
          for (int i = 0; i < 32; i += 16) to_i8(min(hi, max(lo, round_even(mul(load(xb + i), id)))), qb + i);
        } else {  // zeros, or a non-finite value: q = 0 (and d NaN for the latter, so the product shows it)
          if (a != 0.0f) d = std::numeric_limits<float>::quiet_NaN();
          std::memset(qb, 0, 32);
        }
      } else {
        std::memset(qb, 0, 32);
      }
      const int64_t at = r * (xq.n / 4) + 8 * b;
      const int32_t sum = group_sums(qb, d, xq.s + at, xq.dx + at, xq.sx + at);
      xq.sb[r * (xq.n / 32) + b] = sum;
      xq.sxb[r * (xq.n / 32) + b] = d * static_cast<float>(sum);
    }
  }
}

// Int8<T>: a K-quant's 64-weight steps. kOffsetShift: o above as a power of 2 (-1: none); kMin: wm used.
template <int T>
struct Int8 {
  static constexpr bool kDefined = false;
};

// 256-weight blocks: prepare(block) once, then quarter(block, c, scales, u, ws, wm) for its four
// 64-weight steps c = 0..3.
// Q4_K / Q5_K: quarter c is sub-blocks 2c (the low nibbles of qs[32c ..]) and 2c + 1 (the high
// ones): ws = d * sc, wm = -(dmin * m) per sub-block (t: the 8 ws, then the 8 wm)
inline V k_scales(const uint8_t* b) {
  alignas(16) uint8_t sm[16];  // bytes sc0..7, m0..7
  k_scale_bytes(b, sm);
  return mul(bits(bytes16(sm), 0, 0xFF), pair(half_at(b), -half_at(b + 2)));
}

template <bool Five>
struct KQuarter {
  static constexpr bool kDefined = true, kMin = true;
  static constexpr int kOffsetShift = -1;
  static constexpr int kBytes = Five ? 176 : 144;
  VS_ALWAYS_INLINE static V prepare(const uint8_t* b) { return k_scales(b); }
  VS_ALWAYS_INLINE static void quarter(const uint8_t* b, int c, V t, Q64& u, V& ws, V& wm) {
    u = nib32(b + (Five ? 48 : 16) + 32 * c);
    if constexpr (Five) u = or_test(u, b + 16, 2 * c, 2 * c + 1, 16);
    ws = spread2(t, 2 * c, 2 * c + 1);
    wm = spread2(t, 8 + 2 * c, 9 + 2 * c);
  }
};
template <>
struct Int8<Q4_K> : KQuarter<false> {};
template <>
struct Int8<Q5_K> : KQuarter<true> {};

template <>
struct Int8<Q6_K> {  // w = (d * sc_j) * (q - 32), one scale per 16 weights
  static constexpr bool kDefined = true, kMin = false;
  static constexpr int kOffsetShift = 5;
  static constexpr int kBytes = 210;
  VS_ALWAYS_INLINE static V prepare(const uint8_t* b) {
    return mul(from_i8(reinterpret_cast<const int8_t*>(b + 192)), set1(half_at(b + 208)));
  }
  VS_ALWAYS_INLINE static void quarter(const uint8_t* b, int c, V t, Q64& u, V& ws, V&) {
    const int h = c >> 1, odd = c & 1;  // weights 64c ..: half h, runs 2 odd and 2 odd + 1
    u = q6(b + 64 * h, b + 128 + 32 * h, 4 * odd, 4 * odd, 4 * odd + 2);
    ws = spread4(t, 4 * c);
  }
};

// one output's 64-weight step s (quants u, scales ws, mins wm) into rows 0..R of xq: acc[r]
template <int T, int R>
VS_ALWAYS_INLINE inline void accumulate(const XQ& xq, int64_t s, Q64 u, V ws, V wm, V* acc) {
  using F = Int8<T>;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int8_t* xs = xq.q + r * xq.n + 64 * s;
    const int64_t g = r * (xq.n / 4) + 16 * s;
    I16 i = dot4u(u, xs);
    if constexpr (F::kOffsetShift >= 0) i = sub_shifted(i, xq.s + g, F::kOffsetShift);
    acc[r] = fmadd(to_float(i), mul(ws, load(xq.dx + g)), acc[r]);
    if constexpr (F::kMin) acc[r] = fmadd(wm, load(xq.sx + g), acc[r]);
  }
}

// outputs o0 .. o0 + OB - 1 (rows of `w`, `rb` bytes each) for rows 0..R of xq: y[r * ldy + o],
// the arithmetic above; each step's weights unpacked once for all rows. Prefetch as products_q.
template <int T, int R, int OB, bool Short = false>  // (Short: K-quant rows are long; kept for quant.cpp's one call shape)
inline void products_i8(const XQ& xq, const uint8_t* __restrict w, int64_t rb, float* __restrict y, int64_t in, int64_t ldy, int64_t o0) {
  using F = Int8<T>;
  constexpr int E = Format<T>::kElems, B = Format<T>::kBytes;
  V acc[OB][R];
  for (int b = 0; b < OB; ++b)
    for (int r = 0; r < R; ++r) acc[b][r] = zero();
  static_assert(E == 256, "quant8.h's products are the K-quants' (the 32-weight formats: tile8.h)");
  for (int64_t k = 0; k < in / E; ++k) {
    for (int b = 0; b < OB; ++b) {
      const uint8_t* blk = w + (o0 + b) * rb + k * B;
      for (int p = 0; p < B; p += 64) prefetch(reinterpret_cast<const float*>(blk + OB * rb + p));
      const V t = F::prepare(blk);
      V a[R];  // this output's accumulators in registers (in acc[b] they would chain through memory)
      for (int r = 0; r < R; ++r) a[r] = acc[b][r];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        Q64 u;
        V ws, wm = zero();
        F::quarter(blk, c, t, u, ws, wm);
        accumulate<T, R>(xq, 4 * k + c, u, ws, wm, a);
      }
      for (int r = 0; r < R; ++r) acc[b][r] = a[r];
    }
  }
  for (int b = 0; b < OB; ++b)
    for (int r = 0; r < R; ++r) y[r * ldy + o0 + b] = sum(acc[b][r]);
}

// The per-32-block steps of tile8.h's and ktile8.h's products (the 16 outputs in the lanes):
// block_dot, block b's integer dot products of row r with the block's 8 groups of 4 weights u[g]
// (unsigned, or signed int8 where Signed); block_acc, the arithmetic's float steps, i those dot
// products (before the offset), ws / wm the outputs' scales and mins.
template <bool Signed>
VS_ALWAYS_INLINE inline I16 block_dot(const XQ& xq, int64_t b, int r, const Q64* u) {
  int32_t x4[8];
  std::memcpy(x4, xq.q + r * xq.n + 32 * b, 32);
  I16 i0 = i16_zero(), i1 = i16_zero();  // two chains; integer sums, so the grouping does not matter
#pragma GCC unroll 4
  for (int g = 0; g < 8; g += 2) {
    if constexpr (Signed) i0 = dot4s_acc(i0, u[g], x4[g]), i1 = dot4s_acc(i1, u[g + 1], x4[g + 1]);
    else i0 = dot4u_acc(i0, u[g], x4[g]), i1 = dot4u_acc(i1, u[g + 1], x4[g + 1]);
  }
  return add(i0, i1);
}

template <class F, int Offset>
VS_ALWAYS_INLINE inline void block_acc(const XQ& xq, int64_t b, int r, I16 i, V ws, V wm, V& acc) {
  if constexpr (Offset != 0) i = sub_all(i, Offset * xq.sb[r * (xq.n / 32) + b]);
  acc = fmadd(to_float(i), mul(ws, set1(xq.dx[r * (xq.n / 4) + 8 * b])), acc);
  if constexpr (F::kMin) acc = fmadd(wm, set1(xq.sxb[r * (xq.n / 32) + b]), acc);
}

}  // namespace vs
