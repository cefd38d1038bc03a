// Integer lanes for products with int8 activations (quant8.h, tile8.h), one implementation per
// variant as in vec.h. A Q64 holds 64 bytes of quants; an I16 16 int32 lanes, lane l covering
// bytes 4l .. 4l + 3 of a Q64 (AVX2: lanes 0-7 in .lo, bytes 0-31; 8-15 in .hi, bytes 32-63):
//   dot4u(u, x)          lane l = sum of u[i] * x[i] over its 4 bytes, u unsigned <= 128, x int8 in
//                        [-127, 127] (so AVX2's and AVX-512's saturating 16-bit pair sums never
//                        saturate: 2 * 128 * 127 < 32768)
//   dot4u_acc(a, u, x4)  a + the same with x's 4 bytes x4 in every lane (tile8.h: lane l an output);
//                        dot4s_acc for int8 u (as |u| times x with u's sign). kDotUnsigned: the
//                        variant's dot instruction takes any unsigned byte (VNNI), so int8 quants
//                        can enter as u + 128 (flip_sign) with 128 * sum(x) taken off after
// Integer sums are exact, so every variant gives the same lanes however it forms them; the
// float arithmetic on them (quant8.h, tile8.h) is vec.h's, lane by lane.
// Unpacking: nib32 (32 bytes: the K-quants' sub-block pairs), nib64 (64 bytes: a tile's runs),
// or_bits (a fifth bit per weight from a 64-bit word), or_test (Q5_K's fifth bits, one bit of a
// byte per half), q6 (Q6_K's 4 + 2 bits), half16 (16 float16 scales).
#pragma once

#include <limits>

#include "quant.h"  // half_at
#include "vec.h"

namespace vs {

#if defined(VERISPEC_AVX512)
struct Q64 { __m512i v; };
struct I16 { __m512i v; };
#if defined(__AVX512VNNI__)  // built with VNNI where the CPU has it (rowwise.py): one instruction, the same integers
constexpr bool kVnni = true;
inline __m512i dot4u_(__m512i u, __m512i x) { return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x); }
#else
constexpr bool kVnni = false;
inline __m512i dot4u_(__m512i u, __m512i x) { return _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), _mm512_set1_epi16(1)); }
#endif
inline I16 dot4u(Q64 u, const int8_t* x) { return {dot4u_(u.v, _mm512_loadu_si512(x))}; }
inline I16 sub_shifted(I16 a, const int32_t* b, int shift) {  // a - (b << shift)
  return {_mm512_sub_epi32(a.v, _mm512_slli_epi32(_mm512_loadu_si512(b), static_cast<unsigned>(shift)))};
}
inline V to_float(I16 a) { return {_mm512_cvtepi32_ps(a.v)}; }
inline V pair(float a, float b) { return {_mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b))}; }
inline V quad(float a, float b, float c, float d) {
  return {_mm512_setr_ps(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d)};
}
// lanes 0-7 = t[i], 8-15 = t[j] (spread2); lanes 4g .. 4g + 3 = t[i + g] (spread4), t 16 floats
inline V spread2(V t, int i, int j) {
  return {_mm512_permutexvar_ps(_mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(i), _mm512_set1_epi32(j)), t.v)};
}
inline V spread4(V t, int i) {
  return {_mm512_permutexvar_ps(_mm512_add_epi32(_mm512_set1_epi32(i), _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)), t.v)};
}
inline Q64 nib32(const uint8_t* p) {  // [p & 15, p >> 4], 32 bytes each
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i m = _mm256_set1_epi8(0x0F);
  return {_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m)), _mm256_and_si256(_mm256_srli_epi16(v, 4), m), 1)};
}
inline Q64 or_bits(Q64 q, uint64_t bits, int val) {  // byte i + val where bit i is set (q's bit is clear)
  return {_mm512_mask_add_epi8(q.v, static_cast<__mmask64>(bits), q.v, _mm512_set1_epi8(static_cast<char>(val)))};
}
inline Q64 or_test(Q64 q, const uint8_t* h, int bit0, int bit1, int val) {  // + val where bit bit0 (bytes 0-31) / bit1 (32-63) of h[i % 32]
  const __m512i hh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
  const __m512i sel = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << bit0)), _mm256_set1_epi8(static_cast<char>(1 << bit1)), 1);
  return {_mm512_mask_add_epi8(q.v, _mm512_test_epi8_mask(hh, sel), q.v, _mm512_set1_epi8(static_cast<char>(val)))};
}
// ((l[i] >> nshift) & 15) | (((h[i % 32] >> (i < 32 ? hs0 : hs1)) & 3) << 4), i < 64
inline Q64 q6(const uint8_t* l, const uint8_t* h, int nshift, int hs0, int hs1) {
  const __m512i lo = _mm512_and_si512(_mm512_srl_epi16(_mm512_loadu_si512(l), _mm_cvtsi32_si128(nshift)), _mm512_set1_epi8(0x0F));
  const __m512i hh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
  const __m512i cnt = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(hs0)), _mm256_set1_epi16(static_cast<short>(hs1)), 1);
  const __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(hh, cnt), _mm512_set1_epi8(0x03));
  return {_mm512_or_si512(lo, _mm512_slli_epi16(hb, 4))};
}

// tiles (tile8.h): 16 outputs in the 16 lanes, x's 4 bytes broadcast to every lane
constexpr bool kDotUnsigned = kVnni;  // a signed weight's dot product as (w + 128) * x - 128 * sum(x): one instruction
inline Q64 q64_load(const uint8_t* p) { return {_mm512_loadu_si512(p)}; }
inline void nib64(const uint8_t* p, Q64& lo, Q64& hi) {  // lo = p & 15, hi = p >> 4, 64 bytes
  const __m512i v = _mm512_loadu_si512(p), m = _mm512_set1_epi8(0x0F);
  lo = {_mm512_and_si512(v, m)};
  hi = {_mm512_and_si512(_mm512_srli_epi16(v, 4), m)};
}
inline Q64 flip_sign(Q64 w) { return {_mm512_xor_si512(w.v, _mm512_set1_epi8(static_cast<char>(0x80)))}; }  // int8 w -> w + 128
inline I16 i16_zero() { return {_mm512_setzero_si512()}; }
inline I16 add(I16 a, I16 b) { return {_mm512_add_epi32(a.v, b.v)}; }
inline I16 sub_all(I16 a, int32_t b) { return {_mm512_sub_epi32(a.v, _mm512_set1_epi32(b))}; }
#if defined(__AVX512VNNI__)
inline I16 dot4u_acc(I16 a, Q64 u, int32_t x) { return {_mm512_dpbusd_epi32(a.v, u.v, _mm512_set1_epi32(x))}; }
#else
inline I16 dot4u_acc(I16 a, Q64 u, int32_t x) { return {_mm512_add_epi32(a.v, dot4u_(u.v, _mm512_set1_epi32(x)))}; }
#endif
inline I16 dot4s_acc(I16 a, Q64 w, int32_t x) {
  const __m512i xv = _mm512_set1_epi32(x);
  return add(a, {dot4u_(_mm512_abs_epi8(w.v), _mm512_mask_sub_epi8(xv, _mm512_movepi8_mask(w.v), _mm512_setzero_si512(), xv))});
}
inline V half16(const uint8_t* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
inline void q64_store(uint8_t* p, Q64 q) { _mm512_storeu_si512(p, q.v); }
inline I16 i16_load(const int32_t* p) { return {_mm512_loadu_si512(p)}; }

#elif defined(VERISPEC_AVX2)
struct Q64 { __m256i lo, hi; };
struct I16 { __m256i lo, hi; };
inline __m256i ld32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m128i ld16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256i dot4u8(__m256i u, __m256i x) { return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)); }
inline I16 dot4u(Q64 u, const int8_t* x) {
  const uint8_t* xb = reinterpret_cast<const uint8_t*>(x);
  return {dot4u8(u.lo, ld32(xb)), dot4u8(u.hi, ld32(xb + 32))};
}
inline I16 sub_shifted(I16 a, const int32_t* b, int shift) {
  const __m128i s = _mm_cvtsi32_si128(shift);
  const uint8_t* bb = reinterpret_cast<const uint8_t*>(b);
  return {_mm256_sub_epi32(a.lo, _mm256_sll_epi32(ld32(bb), s)), _mm256_sub_epi32(a.hi, _mm256_sll_epi32(ld32(bb + 32), s))};
}
inline V to_float(I16 a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
inline V pair(float a, float b) { return {_mm256_set1_ps(a), _mm256_set1_ps(b)}; }
inline V quad(float a, float b, float c, float d) { return {_mm256_setr_ps(a, a, a, a, b, b, b, b), _mm256_setr_ps(c, c, c, c, d, d, d, d)}; }
inline Q64 nib32(const uint8_t* p) {
  const __m256i v = ld32(p), m = _mm256_set1_epi8(0x0F);
  return {_mm256_and_si256(v, m), _mm256_and_si256(_mm256_srli_epi16(v, 4), m)};
}
inline __m256i bytes_of_bits(uint32_t bits) {  // byte i = 0xFF where bit i is set
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                                             _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i sel = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
}
inline Q64 or_bits(Q64 q, uint64_t bits, int val) {
  const __m256i v = _mm256_set1_epi8(static_cast<char>(val));
  return {_mm256_or_si256(q.lo, _mm256_and_si256(bytes_of_bits(static_cast<uint32_t>(bits)), v)),
          _mm256_or_si256(q.hi, _mm256_and_si256(bytes_of_bits(static_cast<uint32_t>(bits >> 32)), v))};
}
inline Q64 or_test(Q64 q, const uint8_t* h, int bit0, int bit1, int val) {
  const __m256i hv = ld32(h), v = _mm256_set1_epi8(static_cast<char>(val));
  const __m256i s0 = _mm256_set1_epi8(static_cast<char>(1 << bit0)), s1 = _mm256_set1_epi8(static_cast<char>(1 << bit1));
  return {_mm256_or_si256(q.lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, s0), s0), v)),
          _mm256_or_si256(q.hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, s1), s1), v))};
}
inline Q64 q6(const uint8_t* l, const uint8_t* h, int nshift, int hs0, int hs1) {
  const __m128i ns = _mm_cvtsi32_si128(nshift);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03), hv = ld32(h);
  const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(hv, _mm_cvtsi32_si128(hs0)), m2);
  const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(hv, _mm_cvtsi32_si128(hs1)), m2);
  return {_mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(ld32(l), ns), m4), _mm256_slli_epi16(h0, 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(ld32(l + 32), ns), m4), _mm256_slli_epi16(h1, 4))};
}

constexpr bool kDotUnsigned = false;
inline Q64 q64_load(const uint8_t* p) { return {ld32(p), ld32(p + 32)}; }
inline void nib64(const uint8_t* p, Q64& lo, Q64& hi) {
  const __m256i a = ld32(p), b = ld32(p + 32), m = _mm256_set1_epi8(0x0F);
  lo = {_mm256_and_si256(a, m), _mm256_and_si256(b, m)};
  hi = {_mm256_and_si256(_mm256_srli_epi16(a, 4), m), _mm256_and_si256(_mm256_srli_epi16(b, 4), m)};
}
inline Q64 flip_sign(Q64 w) {
  const __m256i f = _mm256_set1_epi8(static_cast<char>(0x80));
  return {_mm256_xor_si256(w.lo, f), _mm256_xor_si256(w.hi, f)};
}
inline I16 i16_zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline I16 add(I16 a, I16 b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
inline I16 sub_all(I16 a, int32_t b) {
  const __m256i v = _mm256_set1_epi32(b);
  return {_mm256_sub_epi32(a.lo, v), _mm256_sub_epi32(a.hi, v)};
}
inline I16 dot4u_acc(I16 a, Q64 u, int32_t x) {
  const __m256i xv = _mm256_set1_epi32(x);
  return {_mm256_add_epi32(a.lo, dot4u8(u.lo, xv)), _mm256_add_epi32(a.hi, dot4u8(u.hi, xv))};
}
inline I16 dot4s_acc(I16 a, Q64 w, int32_t x) {
  const __m256i xv = _mm256_set1_epi32(x);
  return {_mm256_add_epi32(a.lo, dot4u8(_mm256_abs_epi8(w.lo), _mm256_sign_epi8(xv, w.lo))),
          _mm256_add_epi32(a.hi, dot4u8(_mm256_abs_epi8(w.hi), _mm256_sign_epi8(xv, w.hi)))};
}
inline V half16(const uint8_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
}

#else  // NEON and scalar: plain C++ over the bytes (the reference for the integer lanes)
struct Q64 { uint8_t b[64]; };
struct I16 { int32_t l[16]; };
inline I16 dot4u(Q64 u, const int8_t* x) {
  I16 r;
  for (int l = 0; l < 16; ++l) {
    int32_t s = 0;
    for (int i = 4 * l; i < 4 * l + 4; ++i) s += static_cast<int32_t>(u.b[i]) * x[i];
    r.l[l] = s;
  }
  return r;
}
inline I16 sub_shifted(I16 a, const int32_t* b, int shift) {
  for (int l = 0; l < 16; ++l) a.l[l] -= b[l] * (1 << shift);
  return a;
}
inline V to_float(I16 a) {
  float t[16];
  for (int l = 0; l < 16; ++l) t[l] = static_cast<float>(a.l[l]);
  return load(t);
}
inline V pair(float a, float b) {
  float t[16];
  for (int l = 0; l < 16; ++l) t[l] = l < 8 ? a : b;
  return load(t);
}
inline V quad(float a, float b, float c, float d) {
  const float s[4] = {a, b, c, d};
  float t[16];
  for (int l = 0; l < 16; ++l) t[l] = s[l / 4];
  return load(t);
}
inline Q64 nib32(const uint8_t* p) {
  Q64 q;
  for (int i = 0; i < 32; ++i) q.b[i] = p[i] & 15, q.b[32 + i] = p[i] >> 4;
  return q;
}
inline Q64 or_bits(Q64 q, uint64_t bits, int val) {
  for (int i = 0; i < 64; ++i)
    if ((bits >> i) & 1) q.b[i] = static_cast<uint8_t>(q.b[i] + val);
  return q;
}
inline Q64 or_test(Q64 q, const uint8_t* h, int bit0, int bit1, int val) {
  for (int i = 0; i < 64; ++i)
    if ((h[i % 32] >> (i < 32 ? bit0 : bit1)) & 1) q.b[i] = static_cast<uint8_t>(q.b[i] + val);
  return q;
}
inline Q64 q6(const uint8_t* l, const uint8_t* h, int nshift, int hs0, int hs1) {
  Q64 q;
  for (int i = 0; i < 64; ++i) q.b[i] = static_cast<uint8_t>(((l[i] >> nshift) & 15) | (((h[i % 32] >> (i < 32 ? hs0 : hs1)) & 3) << 4));
  return q;
}
constexpr bool kDotUnsigned = false;
inline Q64 q64_load(const uint8_t* p) { Q64 q; std::memcpy(q.b, p, 64); return q; }
inline void nib64(const uint8_t* p, Q64& lo, Q64& hi) {
  for (int i = 0; i < 64; ++i) lo.b[i] = p[i] & 15, hi.b[i] = p[i] >> 4;
}
inline Q64 flip_sign(Q64 w) {
  for (int i = 0; i < 64; ++i) w.b[i] ^= 0x80;
  return w;
}
inline I16 i16_zero() { I16 r; std::memset(r.l, 0, sizeof r.l); return r; }
inline I16 add(I16 a, I16 b) {
  for (int l = 0; l < 16; ++l) a.l[l] += b.l[l];
  return a;
}
inline I16 sub_all(I16 a, int32_t b) {
  for (int l = 0; l < 16; ++l) a.l[l] -= b;
  return a;
}
inline I16 dot4u_acc(I16 a, Q64 u, int32_t x) {
  int8_t xb[4];
  std::memcpy(xb, &x, 4);
  for (int l = 0; l < 16; ++l)
    for (int i = 0; i < 4; ++i) a.l[l] += static_cast<int32_t>(u.b[4 * l + i]) * xb[i];
  return a;
}
inline I16 dot4s_acc(I16 a, Q64 w, int32_t x) {
  int8_t xb[4];
  std::memcpy(xb, &x, 4);
  for (int l = 0; l < 16; ++l)
    for (int i = 0; i < 4; ++i) a.l[l] += static_cast<int32_t>(static_cast<int8_t>(w.b[4 * l + i])) * xb[i];
  return a;
}
inline V half16(const uint8_t* p) {
  float t[16];
  for (int l = 0; l < 16; ++l) t[l] = half_at(p + 2 * l);
  return load(t);
}
#endif

// the largest |x[i]| of 32 floats, NaN where one is NaN (the block's products then show it:
// quant8.h); the plain loop (max_abs32_loop) or a few vector instructions, the same answer
inline float max_abs32_loop(const float* x) {
  float a = 0.0f;
  for (int i = 0; i < 32; ++i) {
    const float v = std::fabs(x[i]);
    if (v != v) return std::numeric_limits<float>::quiet_NaN();
    a = v > a ? v : a;
  }
  return a;
}
#if defined(VERISPEC_AVX512)
inline float max_abs32(const float* x) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  if (_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q)) return std::numeric_limits<float>::quiet_NaN();
  return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
}
#elif defined(VERISPEC_AVX2)
inline float max_abs32(const float* x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  int nan = 0;
  for (int i = 0; i < 32; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    nan |= _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
  }
  if (nan) return std::numeric_limits<float>::quiet_NaN();
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}
#else
inline float max_abs32(const float* x) { return max_abs32_loop(x); }
#endif

#if !defined(VERISPEC_AVX512)
inline V spread2(V t, int i, int j) {
  float f[16];
  store(f, t);
  return pair(f[i], f[j]);
}
inline V spread4(V t, int i) {
  float f[16];
  store(f, t);
  return quad(f[i], f[i + 1], f[i + 2], f[i + 3]);
}
#endif

}  // namespace vs
