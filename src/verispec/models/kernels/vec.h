// The row arithmetic, defined once: a vector of 16 float32 lanes and the few operations the
// kernels use, implemented for one instruction set per build (VERISPEC_VARIANT, set by
// models/kernels/rowwise.py):
//   VERISPEC_AVX512   one __m512
//   VERISPEC_AVX2     two __m256 (lanes 0-7, 8-15), FMA3
//   VERISPEC_NEON     four float32x4_t (AArch64)
//   VERISPEC_SCALAR   16 floats in plain C++ (std::fma): the reference
// Every operation is lane by lane and rounds once (IEEE add, sub, mul, div, fused multiply-add),
// so the variants give bit-identical lanes. The only cross-lane operation, the sum, is the
// explicit tree below (never _mm512_reduce_add_ps, whose order the compiler may choose):
//   s8[i] = l[i] + l[i + 8]   (i < 8)
//   s4[i] = s8[i] + s8[i + 4] (i < 4)
//   s2[i] = s4[i] + s4[i + 2] (i < 2)
//   sum   = s2[0] + s2[1]
// Unpacking GGUF blocks (quant.h): bytes16 + bits, from_i8 and word_bits turn bytes, int8 and the
// bits of a word into float lanes (small integers: exact on every variant); lookup16 / lookup32
// pick lanes of a 16- or 32-entry table by 4-bit indices (and a fifth bit): a block's every
// possible weight computed once, then looked up (AVX-512: one permute per 16 weights).
// max(a, b) is a > b ? a : b and min(a, b) is a < b ? a : b (x86's rule: the second operand when
// either is NaN). FpMode pins the floating-point environment (round to nearest even, no
// flush-to-zero, no denormals-as-zero) for the duration of a kernel call, on each thread.
// Built with -ffp-contract=off: no fused multiply-add but the written ones.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(VERISPEC_AVX512) || defined(VERISPEC_AVX2)
#include <immintrin.h>
#elif defined(VERISPEC_NEON)
#include <arm_neon.h>
#elif !defined(VERISPEC_SCALAR)
#error "define one of VERISPEC_AVX512, VERISPEC_AVX2, VERISPEC_NEON, VERISPEC_SCALAR"
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace vs {

#if defined(VERISPEC_AVX512)
constexpr const char* kVariant = "avx512";
constexpr int kRegisters = 32;  // 16-lane vectors the registers hold, for the products' blocking
struct V { __m512 v; };
inline V zero() { return {_mm512_setzero_ps()}; }
inline V set1(float a) { return {_mm512_set1_ps(a)}; }
inline V broadcast(const float* p) { return {_mm512_broadcastss_ps(_mm_load_ss(p))}; }  // *p in every lane, from memory
inline V load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline __mmask16 first(int n) { return static_cast<__mmask16>((1u << n) - 1); }
inline V load_n(const float* p, int n) { return {_mm512_maskz_loadu_ps(first(n), p)}; }  // n < 16, zeros beyond
inline void store(float* p, V a) { _mm512_storeu_ps(p, a.v); }
inline void store_n(float* p, V a, int n) { _mm512_mask_storeu_ps(p, first(n), a.v); }
inline V add(V a, V b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V sub(V a, V b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V mul(V a, V b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V div(V a, V b) { return {_mm512_div_ps(a.v, b.v)}; }
inline V fmadd(V a, V b, V c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }   // a * b + c
inline V fnmadd(V a, V b, V c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; } // c - a * b
inline V max(V a, V b) { return {_mm512_max_ps(a.v, b.v)}; }
inline V min(V a, V b) { return {_mm512_min_ps(a.v, b.v)}; }
inline V round_even(V a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
// 2^n for integral n in [-126, 127]
inline V pow2i(V n) { return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127)), 23))}; }
inline V zero_where_less(V a, V x, V lo) { return {_mm512_maskz_mov_ps(static_cast<__mmask16>(~_mm512_cmp_ps_mask(x.v, lo.v, _CMP_LT_OQ)), a.v)}; }
inline float sum(V a) {
  const __m256 lo = _mm512_castps512_ps256(a.v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1));
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
// out[m] = sum(a[m]) for 16 vectors, the same additions as sum's tree (lane l with l + 8, then
// l + 4, l + 2, l + 1), done for all 16 at once: each step adds the halves of two vectors' lanes
constexpr int kSumBlock = 16;  // vectors sum_block reduces together (other variants: 4, each by sum)
inline void sum_block(const V* a, float* out) {
  __m512 s8[8], s4[4], s2[2];
  for (int m = 0; m < 8; ++m)  // [a[2m] lanes 0-7 + 8-15, a[2m + 1] lanes 0-7 + 8-15]
    s8[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * m].v, a[2 * m + 1].v, _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm512_shuffle_f32x4(a[2 * m].v, a[2 * m + 1].v, _MM_SHUFFLE(3, 2, 3, 2)));
  for (int m = 0; m < 4; ++m)  // 4 lanes each of vectors 4m .. 4m + 3
    s4[m] = _mm512_add_ps(_mm512_shuffle_f32x4(s8[2 * m], s8[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_f32x4(s8[2 * m], s8[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int m = 0; m < 2; ++m)  // 128-bit lane g: 2 lanes of vector 8m + g, then of 8m + 4 + g
    s2[m] = _mm512_add_ps(_mm512_shuffle_ps(s4[2 * m], s4[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm512_shuffle_ps(s4[2 * m], s4[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // lane 4g + k: vector 4k + g
  const __m512 s1 = _mm512_add_ps(_mm512_shuffle_ps(s2[0], s2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_ps(s2[0], s2[1], _MM_SHUFFLE(3, 1, 3, 1)));
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), s1));
}
inline void prefetch(const float* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
// Unpacking (quant.h): B16 is 16 bytes zero-extended to 32-bit lanes; bits(b, shift, mask) the
// lanes ((b >> shift) & mask) as floats; from_i8 16 int8 as floats (to_i8 back: integral lanes in [-128, 127], NaN to 0); word_bits bits first.. of w
struct B16 { __m512i v; };
inline B16 bytes16(const uint8_t* p) { return {_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))}; }
inline V bits(B16 b, int shift, int mask) {
  return {_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srl_epi32(b.v, _mm_cvtsi32_si128(shift)), _mm512_set1_epi32(mask)))};
}
inline V from_i8(const int8_t* p) { return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))}; }
inline void to_i8(V a, int8_t* p) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(a.v))); }  // NaN: 0x80000000, low byte 0
inline V word_bits(uint32_t w, int first) {
  const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(first), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  return {_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(w)), idx), _mm512_set1_epi32(1)))};
}
inline V iota() { return {_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)}; }
// table lookups: lane i = t[(b_i >> shift) & 15]; lookup32: from hi instead where bit i of `bits`
// (or bit hshift of h_i) is set
inline V lookup16(V t, B16 b, int shift) { return {_mm512_permutexvar_ps(_mm512_srl_epi32(b.v, _mm_cvtsi32_si128(shift)), t.v)}; }
// (one two-table permute: index bit 4, set where the high bit is, picks hi)
inline V lookup32(V lo, V hi, B16 b, int shift, uint32_t bits) {
  __m512i i = _mm512_and_si512(_mm512_srl_epi32(b.v, _mm_cvtsi32_si128(shift)), _mm512_set1_epi32(15));
  i = _mm512_mask_or_epi32(i, static_cast<__mmask16>(bits & 0xFFFF), i, _mm512_set1_epi32(16));
  return {_mm512_permutex2var_ps(lo.v, i, hi.v)};
}
inline V lookup32(V lo, V hi, B16 b, int shift, B16 h, int hshift) {
  const __mmask16 m = _mm512_test_epi32_mask(h.v, _mm512_set1_epi32(1 << hshift));
  __m512i i = _mm512_and_si512(_mm512_srl_epi32(b.v, _mm_cvtsi32_si128(shift)), _mm512_set1_epi32(15));
  i = _mm512_mask_or_epi32(i, m, i, _mm512_set1_epi32(16));
  return {_mm512_permutex2var_ps(lo.v, i, hi.v)};
}
// 6-bit quants: lanes (((a >> shift) & 15) | (((h >> hshift) & 3) << 4)) - 32 as floats
inline __m512i shift_to4(__m512i h, int hshift) {  // bits hshift, hshift + 1 of h to bits 4, 5
  return hshift <= 4 ? _mm512_sll_epi32(h, _mm_cvtsi32_si128(4 - hshift)) : _mm512_srl_epi32(h, _mm_cvtsi32_si128(hshift - 4));
}
inline V q6(B16 a, int shift, B16 h, int hshift) {
  const __m512i lo = _mm512_srl_epi32(a.v, _mm_cvtsi32_si128(shift));
  const __m512i q = _mm512_and_si512(_mm512_ternarylogic_epi32(lo, shift_to4(h.v, hshift), _mm512_set1_epi32(0x0F), 0xE4), _mm512_set1_epi32(0x3F));
  return {_mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(32)))};
}

#elif defined(VERISPEC_AVX2)
constexpr const char* kVariant = "avx2";
constexpr int kRegisters = 8;
struct V { __m256 lo, hi; };
inline __m256i first8(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
inline V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V set1(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
inline V broadcast(const float* p) { const __m256 v = _mm256_broadcast_ss(p); return {v, v}; }
inline V load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline V load_n(const float* p, int n) { return {_mm256_maskload_ps(p, first8(n)), _mm256_maskload_ps(p + 8, first8(n - 8))}; }
inline void store(float* p, V a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
inline void store_n(float* p, V a, int n) { _mm256_maskstore_ps(p, first8(n), a.lo); _mm256_maskstore_ps(p + 8, first8(n - 8), a.hi); }
inline V add(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V sub(V a, V b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V mul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V div(V a, V b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline V fmadd(V a, V b, V c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V fnmadd(V a, V b, V c) { return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)}; }
inline V max(V a, V b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline V min(V a, V b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline V round_even(V a) {
  return {_mm256_round_ps(a.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), _mm256_round_ps(a.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
inline __m256 pow2i8(__m256 n) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)); }
inline V pow2i(V n) { return {pow2i8(n.lo), pow2i8(n.hi)}; }
inline V zero_where_less(V a, V x, V lo) {
  return {_mm256_andnot_ps(_mm256_cmp_ps(x.lo, lo.lo, _CMP_LT_OQ), a.lo), _mm256_andnot_ps(_mm256_cmp_ps(x.hi, lo.hi, _CMP_LT_OQ), a.hi)};
}
inline float sum(V a) {
  const __m256 s8 = _mm256_add_ps(a.lo, a.hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
inline void prefetch(const float* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
struct B16 { __m256i lo, hi; };
inline B16 bytes16(const uint8_t* p) {
  return {_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline V bits(B16 b, int shift, int mask) {
  const __m128i sh = _mm_cvtsi32_si128(shift);
  const __m256i m = _mm256_set1_epi32(mask);
  return {_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srl_epi32(b.lo, sh), m)), _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srl_epi32(b.hi, sh), m))};
}
inline V from_i8(const int8_t* p) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))),
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))))};
}
inline __m128i to_i16x8(__m256 a) {  // NaN lanes to 0 first (cvtt gives 0x80000000, which packs would saturate)
  const __m256i i = _mm256_cvttps_epi32(_mm256_and_ps(a, _mm256_cmp_ps(a, a, _CMP_ORD_Q)));
  return _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
}
inline void to_i8(V a, int8_t* p) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(to_i16x8(a.lo), to_i16x8(a.hi))); }
inline V word_bits(uint32_t w, int first) {
  const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i ww = _mm256_set1_epi32(static_cast<int>(w)), one = _mm256_set1_epi32(1);
  return {_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(ww, idx), one)),
          _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(ww, _mm256_add_epi32(idx, _mm256_set1_epi32(8))), one))};
}
inline V iota() { return {_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15)}; }
// t[i & 15] for 8 lanes of indices: two 8-entry permutes, bit 3 picks
inline __m256 lookup8(V t, __m256i i) {
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t.lo, i), _mm256_permutevar8x32_ps(t.hi, i), _mm256_castsi256_ps(_mm256_slli_epi32(i, 28)));
}
inline V lookup16(V t, B16 b, int shift) {
  const __m128i sh = _mm_cvtsi32_si128(shift);
  return {lookup8(t, _mm256_srl_epi32(b.lo, sh)), lookup8(t, _mm256_srl_epi32(b.hi, sh))};
}
inline __m256 pick8(__m256 lo, __m256 hi, __m256i sel) { return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(sel)); }  // sign bit of sel
inline V lookup32(V lo, V hi, B16 b, int shift, uint32_t bits) {
  const V a = lookup16(lo, b, shift), z = lookup16(hi, b, shift);
  const __m256i s = _mm256_sllv_epi32(_mm256_set1_epi32(static_cast<int>(bits)), _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24));
  const __m256i s8 = _mm256_sllv_epi32(_mm256_set1_epi32(static_cast<int>(bits >> 8)), _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24));
  return {pick8(a.lo, z.lo, s), pick8(a.hi, z.hi, s8)};
}
inline V lookup32(V lo, V hi, B16 b, int shift, B16 h, int hshift) {
  const V a = lookup16(lo, b, shift), z = lookup16(hi, b, shift);
  const __m128i sh = _mm_cvtsi32_si128(31 - hshift);
  return {pick8(a.lo, z.lo, _mm256_sll_epi32(h.lo, sh)), pick8(a.hi, z.hi, _mm256_sll_epi32(h.hi, sh))};
}
inline __m256 q6_8(__m256i a, int shift, __m256i h, int hshift) {
  const __m256i lo = _mm256_and_si256(_mm256_srl_epi32(a, _mm_cvtsi32_si128(shift)), _mm256_set1_epi32(0x0F));
  const __m256i hb = _mm256_and_si256(hshift <= 4 ? _mm256_sll_epi32(h, _mm_cvtsi32_si128(4 - hshift)) : _mm256_srl_epi32(h, _mm_cvtsi32_si128(hshift - 4)),
                                      _mm256_set1_epi32(0x30));
  return _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_or_si256(lo, hb), _mm256_set1_epi32(32)));
}
inline V q6(B16 a, int shift, B16 h, int hshift) { return {q6_8(a.lo, shift, h.lo, hshift), q6_8(a.hi, shift, h.hi, hshift)}; }

#elif defined(VERISPEC_NEON)
constexpr const char* kVariant = "neon";
constexpr int kRegisters = 8;
struct V { float32x4_t q[4]; };
#define VS_EACH(expr) V r; for (int i = 0; i < 4; ++i) r.q[i] = (expr); return r
inline V zero() { VS_EACH(vdupq_n_f32(0.0f)); }
inline V set1(float a) { VS_EACH(vdupq_n_f32(a)); }
inline V broadcast(const float* p) { return set1(*p); }
inline V load(const float* p) { VS_EACH(vld1q_f32(p + 4 * i)); }
inline V load_n(const float* p, int n) {
  float t[16] = {0};
  for (int i = 0; i < n; ++i) t[i] = p[i];
  return load(t);
}
inline void store(float* p, V a) { for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, a.q[i]); }
inline void store_n(float* p, V a, int n) {
  float t[16];
  store(t, a);
  for (int i = 0; i < n; ++i) p[i] = t[i];
}
inline V add(V a, V b) { VS_EACH(vaddq_f32(a.q[i], b.q[i])); }
inline V sub(V a, V b) { VS_EACH(vsubq_f32(a.q[i], b.q[i])); }
inline V mul(V a, V b) { VS_EACH(vmulq_f32(a.q[i], b.q[i])); }
inline V div(V a, V b) { VS_EACH(vdivq_f32(a.q[i], b.q[i])); }
inline V fmadd(V a, V b, V c) { VS_EACH(vfmaq_f32(c.q[i], a.q[i], b.q[i])); }
inline V fnmadd(V a, V b, V c) { VS_EACH(vfmsq_f32(c.q[i], a.q[i], b.q[i])); }
inline V max(V a, V b) { VS_EACH(vbslq_f32(vcgtq_f32(a.q[i], b.q[i]), a.q[i], b.q[i])); }
inline V min(V a, V b) { VS_EACH(vbslq_f32(vcltq_f32(a.q[i], b.q[i]), a.q[i], b.q[i])); }
inline V round_even(V a) { VS_EACH(vrndnq_f32(a.q[i])); }
inline V pow2i(V n) { VS_EACH(vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n.q[i]), vdupq_n_s32(127)), 23))); }
inline V zero_where_less(V a, V x, V lo) {
  VS_EACH(vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(a.q[i]), vcltq_f32(x.q[i], lo.q[i]))));
}
#undef VS_EACH
inline float sum(V a) {
  const float32x4_t s8a = vaddq_f32(a.q[0], a.q[2]), s8b = vaddq_f32(a.q[1], a.q[3]);
  const float32x4_t s4 = vaddq_f32(s8a, s8b);
  const float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
  return vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
}
inline void prefetch(const float* p) { __builtin_prefetch(p); }
struct B16 { uint8_t b[16]; };
inline B16 bytes16(const uint8_t* p) { B16 r; std::memcpy(r.b, p, 16); return r; }
inline V bits(B16 b, int shift, int mask) {
  float t[16];
  for (int i = 0; i < 16; ++i) t[i] = static_cast<float>((b.b[i] >> shift) & mask);
  return load(t);
}
inline V from_i8(const int8_t* p) {
  float t[16];
  for (int i = 0; i < 16; ++i) t[i] = static_cast<float>(p[i]);
  return load(t);
}
inline void to_i8(V a, int8_t* p) {  // vcvtq: NaN to 0
  int16x8_t h[2];
  for (int i = 0; i < 2; ++i) h[i] = vcombine_s16(vmovn_s32(vcvtq_s32_f32(a.q[2 * i])), vmovn_s32(vcvtq_s32_f32(a.q[2 * i + 1])));
  vst1q_s8(p, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
}
inline V word_bits(uint32_t w, int first) {
  float t[16];
  for (int i = 0; i < 16; ++i) t[i] = static_cast<float>((w >> (first + i)) & 1);
  return load(t);
}
inline V iota() {
  float t[16];
  for (int i = 0; i < 16; ++i) t[i] = static_cast<float>(i);
  return load(t);
}
inline V lookup16(V t, B16 b, int shift) {
  float tt[16], r[16];
  store(tt, t);
  for (int i = 0; i < 16; ++i) r[i] = tt[(b.b[i] >> shift) & 15];
  return load(r);
}
inline V lookup32(V lo, V hi, B16 b, int shift, uint32_t bits) {
  float tl[16], th[16], r[16];
  store(tl, lo);
  store(th, hi);
  for (int i = 0; i < 16; ++i) r[i] = ((bits >> i) & 1) ? th[(b.b[i] >> shift) & 15] : tl[(b.b[i] >> shift) & 15];
  return load(r);
}
inline V lookup32(V lo, V hi, B16 b, int shift, B16 h, int hshift) {
  float tl[16], th[16], r[16];
  store(tl, lo);
  store(th, hi);
  for (int i = 0; i < 16; ++i) r[i] = ((h.b[i] >> hshift) & 1) ? th[(b.b[i] >> shift) & 15] : tl[(b.b[i] >> shift) & 15];
  return load(r);
}
inline V q6(B16 a, int shift, B16 h, int hshift) {
  float r[16];
  for (int i = 0; i < 16; ++i) r[i] = static_cast<float>((((a.b[i] >> shift) & 15) | (((h.b[i] >> hshift) & 3) << 4)) - 32);
  return load(r);
}

#else  // VERISPEC_SCALAR
constexpr const char* kVariant = "scalar";
constexpr int kRegisters = 8;
struct V { float l[16]; };
#define VS_EACH(expr) V r; for (int i = 0; i < 16; ++i) r.l[i] = (expr); return r
inline V zero() { VS_EACH(0.0f); }
inline V set1(float a) { VS_EACH(a); }
inline V broadcast(const float* p) { return set1(*p); }
inline V load(const float* p) { VS_EACH(p[i]); }
inline V load_n(const float* p, int n) { VS_EACH(i < n ? p[i] : 0.0f); }
inline void store(float* p, V a) { for (int i = 0; i < 16; ++i) p[i] = a.l[i]; }
inline void store_n(float* p, V a, int n) { for (int i = 0; i < n; ++i) p[i] = a.l[i]; }
inline V add(V a, V b) { VS_EACH(a.l[i] + b.l[i]); }
inline V sub(V a, V b) { VS_EACH(a.l[i] - b.l[i]); }
inline V mul(V a, V b) { VS_EACH(a.l[i] * b.l[i]); }
inline V div(V a, V b) { VS_EACH(a.l[i] / b.l[i]); }
inline V fmadd(V a, V b, V c) { VS_EACH(std::fma(a.l[i], b.l[i], c.l[i])); }
inline V fnmadd(V a, V b, V c) { VS_EACH(std::fma(-a.l[i], b.l[i], c.l[i])); }
inline V max(V a, V b) { VS_EACH(a.l[i] > b.l[i] ? a.l[i] : b.l[i]); }
inline V min(V a, V b) { VS_EACH(a.l[i] < b.l[i] ? a.l[i] : b.l[i]); }
inline V round_even(V a) { VS_EACH(std::nearbyint(a.l[i])); }  // FpMode pins round-to-nearest-even
inline float pow2i1(float n) {
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline V pow2i(V n) { VS_EACH(pow2i1(n.l[i])); }
inline V zero_where_less(V a, V x, V lo) { VS_EACH(x.l[i] < lo.l[i] ? 0.0f : a.l[i]); }
inline float sum(V a) {
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = a.l[i] + a.l[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  const float s2a = s4[0] + s4[2], s2b = s4[1] + s4[3];
  return s2a + s2b;
}
inline void prefetch(const float* p) { __builtin_prefetch(p); }
struct B16 { uint8_t b[16]; };
inline B16 bytes16(const uint8_t* p) { B16 r; std::memcpy(r.b, p, 16); return r; }
inline V bits(B16 b, int shift, int mask) { VS_EACH(static_cast<float>((b.b[i] >> shift) & mask)); }
inline V from_i8(const int8_t* p) { VS_EACH(static_cast<float>(p[i])); }
inline void to_i8(V a, int8_t* p) { for (int i = 0; i < 16; ++i) p[i] = a.l[i] == a.l[i] ? static_cast<int8_t>(a.l[i]) : 0; }
inline V word_bits(uint32_t w, int first) { VS_EACH(static_cast<float>((w >> (first + i)) & 1)); }
inline V iota() { VS_EACH(static_cast<float>(i)); }
inline V lookup16(V t, B16 b, int shift) { VS_EACH(t.l[(b.b[i] >> shift) & 15]); }
inline V lookup32(V lo, V hi, B16 b, int shift, uint32_t bits) { VS_EACH(((bits >> i) & 1) ? hi.l[(b.b[i] >> shift) & 15] : lo.l[(b.b[i] >> shift) & 15]); }
inline V lookup32(V lo, V hi, B16 b, int shift, B16 h, int hshift) {
  VS_EACH(((h.b[i] >> hshift) & 1) ? hi.l[(b.b[i] >> shift) & 15] : lo.l[(b.b[i] >> shift) & 15]);
}
inline V q6(B16 a, int shift, B16 h, int hshift) { VS_EACH(static_cast<float>((((a.b[i] >> shift) & 15) | (((h.b[i] >> hshift) & 3) << 4)) - 32)); }
#undef VS_EACH
#endif

#if !defined(VERISPEC_AVX512)
constexpr int kSumBlock = 4;
inline void sum_block(const V* a, float* out) {
  for (int m = 0; m < kSumBlock; ++m) out[m] = sum(a[m]);
}
#endif

// e^x in 16 lanes: x = n ln2 + r (|r| <= ln2 / 2, ln2 in two parts), the degree-6 Taylor
// polynomial of e^r (Horner), times 2^n; x above 88 counts as 88, below -87 gives 0.
inline V exp(V x) {
  const V lo = set1(-87.0f);
  const V xc = min(max(x, lo), set1(88.0f));
  const V n = round_even(mul(xc, set1(1.44269504088896341f)));
  V r = fnmadd(n, set1(0.693359375f), xc);
  r = fnmadd(n, set1(-2.12194440e-4f), r);
  V p = set1(1.0f / 720);
  p = fmadd(p, r, set1(1.0f / 120));
  p = fmadd(p, r, set1(1.0f / 24));
  p = fmadd(p, r, set1(1.0f / 6));
  p = fmadd(p, r, set1(0.5f));
  p = fmadd(p, r, set1(1.0f));
  p = fmadd(p, r, set1(1.0f));
  return zero_where_less(mul(p, pow2i(n)), x, lo);
}

// The floating-point environment every kernel runs in, whatever the caller set (torch's
// set_flush_denormal, another library): round to nearest even, denormals kept. Restored on exit.
class FpMode {
 public:
#if defined(__x86_64__) || defined(__i386__)
  FpMode() : saved_(_mm_getcsr()) { _mm_setcsr(0x1F80); }  // all exceptions masked, nearest, no FTZ / DAZ
  ~FpMode() { _mm_setcsr(saved_); }

 private:
  unsigned int saved_;
#elif defined(__aarch64__)
  FpMode() {
    __asm__ volatile("mrs %0, fpcr" : "=r"(saved_));
    const uint64_t pinned = saved_ & ~((uint64_t{3} << 22) | (uint64_t{1} << 24) | (uint64_t{1} << 19));  // RMode 0, FZ 0, FZ16 0
    __asm__ volatile("msr fpcr, %0" : : "r"(pinned));
  }
  ~FpMode() { __asm__ volatile("msr fpcr, %0" : : "r"(saved_)); }

 private:
  uint64_t saved_;
#else
  FpMode() {}
#endif
  FpMode(const FpMode&) = delete;
  FpMode& operator=(const FpMode&) = delete;
};

}  // namespace vs
