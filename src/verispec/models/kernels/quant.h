// GGUF weight blocks unpacked to float32, and the row products over them (no torch here).
//
// A format's dequantisation gives exactly the float32 values gguf-py's `quants.dequantize` gives
// (the reference the tests compare with): every step is the same IEEE float32 operation in the
// same order (w = d * q, d * q + m, (d * sc) * q - dmin * m, ...; -ffp-contract=off keeps the
// multiply and the add apart). So a product over blocks is, bit for bit, ops.h's products over
// the dequantised matrix: the blocks are unpacked into a small buffer (one block per output, in
// L1) and multiplied against every row with the same fused multiply-adds in the same order.
//
// Formats (ggml's type numbers): F32 0, F16 1, Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q4_K 12,
// Q5_K 13, Q6_K 14, BF16 30. Block layouts as ggml-common.h defines them (d, m: float16 scales;
// qs: low 4 bits, two to a byte; qh: high bits).
#pragma once

#include <type_traits>

#include "ops.h"

namespace vs {

// the unpacking must melt into the products' loop (B16 and V in registers, not on the stack)
#define VS_ALWAYS_INLINE __attribute__((always_inline))

enum Type : int { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30 };

// float16 -> float32, exact (normals, subnormals, infinities, NaN payloads)
inline float half(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000 | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = 113;
    while (!(man & 0x400)) {
      man <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((man & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(__F16C__)
  // the same exact conversion in one instruction (the x86 variants' builds); through vmovd, which
  // zeroes the register, not _cvtsh_ss, whose vpinsrw merges into the register's old value: a
  // dependency from block to block that slowed every product (docs/results/quant/2026-12-06-stack.md)
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
#else
  return half(h);
#endif
}

inline float bf16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes
inline void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Format<T>: kElems weights in kBytes bytes. each(block, f) calls f(j, w) for the block's 16-lane
// groups j = 0, 16, 32, ... in that order (the products' accumulation order), w the unpacked lanes.
// The 4- and 5-bit formats compute a block's (or sub-block's) 16 or 32 possible weights with
// gguf-py's operations in its order, then look each lane's up (lookup16 / lookup32); Q6_K and
// Q8_0 compose their integers in float lanes (small integers, so exactly) and scale them.
template <int T>
struct Format;

template <>
struct Format<F32> {  // plain float32 rows (ops.h's products): no unpacking
  static constexpr int kElems = 1, kBytes = 4;
};

// 16 float16 / bfloat16 values as floats: exact conversions, so every variant gives the same lanes
inline V halves16(const uint8_t* p) {
#if defined(VERISPEC_AVX512)
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
#elif defined(VERISPEC_AVX2)
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
#else
  float t[16];
  for (int i = 0; i < 16; ++i) t[i] = half_at(p + 2 * i);
  return load(t);
#endif
}

inline V bf16s16(const uint8_t* p) {
#if defined(VERISPEC_AVX512)
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16))};
#elif defined(VERISPEC_AVX2)
  const auto wide = [](const uint8_t* q) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))), 16));
  };
  return {wide(p), wide(p + 16)};
#else
  float t[16];
  for (int i = 0; i < 16; ++i) t[i] = bf16_at(p + 2 * i);
  return load(t);
#endif
}

template <>
struct Format<F16> {
  static constexpr int kElems = 32, kBytes = 64;
  template <class F>
  VS_ALWAYS_INLINE static void each(const uint8_t* b, F&& f) {
    f(0, halves16(b));
    f(16, halves16(b + 32));
  }
};

template <>
struct Format<BF16> {
  static constexpr int kElems = 32, kBytes = 64;
  template <class F>
  VS_ALWAYS_INLINE static void each(const uint8_t* b, F&& f) {
    f(0, bf16s16(b));
    f(16, bf16s16(b + 32));
  }
};

template <>
struct Format<Q4_0> {  // d, qs[16]: w = d * (q - 8); lanes 0-15 the low nibbles, 16-31 the high
  static constexpr int kElems = 32, kBytes = 18;
  template <class F>
  VS_ALWAYS_INLINE static void each(const uint8_t* b, F&& f) {
    const V t = mul(set1(half_at(b)), sub(iota(), set1(8.0f)));  // the 16 possible weights
    const B16 q = bytes16(b + 2);
    f(0, lookup16(t, q, 0));
    f(16, lookup16(t, q, 4));
  }
};

// the float16 pair at p, p + 2 (a block's d and m) as two broadcast vectors: one conversion for
// both on the x86 variants (the same values as half_at)
VS_ALWAYS_INLINE inline void set1_halves(const uint8_t* p, V& a, V& b) {
#if defined(VERISPEC_AVX512)
  uint32_t w;
  std::memcpy(&w, p, 4);
  const __m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(w))));
  a = {_mm512_permutexvar_ps(_mm512_setzero_si512(), f)};
  b = {_mm512_permutexvar_ps(_mm512_set1_epi32(1), f)};
#elif defined(VERISPEC_AVX2)
  uint32_t w;
  std::memcpy(&w, p, 4);
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(w)));
  const __m256 lo = _mm256_broadcastss_ps(f), hi = _mm256_broadcastss_ps(_mm_movehdup_ps(f));
  a = {lo, lo};
  b = {hi, hi};
#else
  a = set1(half_at(p));
  b = set1(half_at(p + 2));
#endif
}

template <>
struct Format<Q4_1> {  // d, m, qs[16]: w = d * q + m
  static constexpr int kElems = 32, kBytes = 20;
  template <class F>
  VS_ALWAYS_INLINE static void each(const uint8_t* b, F&& f) {
    V d, m;
    set1_halves(b, d, m);
    const V t = add(mul(d, iota()), m);
    const B16 q = bytes16(b + 4);
    f(0, lookup16(t, q, 0));
    f(16, lookup16(t, q, 4));
  }
};

template <>
struct Format<Q5_0> {  // d, qh (32 bits), qs[16]: w = d * (q - 16)
  static constexpr int kElems = 32, kBytes = 22;
  template <class F>
  VS_ALWAYS_INLINE static void each(const uint8_t* b, F&& f) {
    const V d = set1(half_at(b)), sixteen = set1(16.0f);
    const V lo = mul(d, sub(iota(), sixteen)), hi = mul(d, iota());  // q - 16 for q < 16, q >= 16
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const B16 q = bytes16(b + 6);
    f(0, lookup32(lo, hi, q, 0, qh));
    f(16, lookup32(lo, hi, q, 4, qh >> 16));
  }
};

template <>
struct Format<Q5_1> {  // d, m, qh, qs[16]: w = d * q + m
  static constexpr int kElems = 32, kBytes = 24;
  template <class F>
  VS_ALWAYS_INLINE static void each(const uint8_t* b, F&& f) {
    V d, m;
    set1_halves(b, d, m);
    const V lo = add(mul(d, iota()), m), hi = add(mul(d, add(iota(), set1(16.0f))), m);
    uint32_t qh;
    std::memcpy(&qh, b + 4, 4);
    const B16 q = bytes16(b + 8);
    f(0, lookup32(lo, hi, q, 0, qh));
    f(16, lookup32(lo, hi, q, 4, qh >> 16));
  }
};

template <>
struct Format<Q8_0> {  // d, qs[32] (int8): w = q * d
  static constexpr int kElems = 32, kBytes = 34;
  template <class F>
  VS_ALWAYS_INLINE static void each(const uint8_t* b, F&& f) {
    const V d = set1(half_at(b));
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
    f(0, mul(from_i8(qs), d));
    f(16, mul(from_i8(qs + 16), d));
  }
};

// A block's per-sub-block scales are computed as vectors and stored; each is then broadcast from
// memory, which takes a load port, where a broadcast from a register takes the permute port the
// lookups need. The compiler barrier keeps the compiler from forwarding the stores into register
// permutes.
#define VS_FROM_MEMORY() asm volatile("" ::: "memory")

// Q4_K / Q5_K: the 12 bytes of 6-bit scales and mins as 16 bytes: sc0..7, then m0..7
// (scale_min_k4 for every sub-block at once, in 32-bit words)
inline void k_scale_bytes(const uint8_t* b, uint8_t out[16]) {
  uint32_t u[4];
  std::memcpy(u, b + 4, 12);
  constexpr uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
  u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
  const uint32_t low_mins = u[1] & k1;
  u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
  u[2] = low_mins;
  u[0] &= k1;
  std::memcpy(out, u, 16);
}

// Q4_K / Q5_K: weights 64c .. 64c + 63 (c = 0..3) are sub-block 2c (the low nibbles of
// qs[32c ..]) then 2c + 1 (the high nibbles); sub-block s: w = (d * sc_s) * q - dmin * m_s, with
// Q5_K's fifth bit s of qh[l]. The 16 products d * sc_s and dmin * m_s in two vector multiplies
// per block, kept in memory: each sub-block's pair is then a broadcast load (VS_FROM_MEMORY).
template <bool Five, class F>
VS_ALWAYS_INLINE inline void each_k(const uint8_t* b, F&& f) {
  alignas(64) uint8_t sm[16];
  k_scale_bytes(b, sm);
  alignas(64) float ds[16], ms[16];  // lanes 0-7: d * sc_s; 8-15: dmin * m_s
  const V lanes = bits(bytes16(sm), 0, 0xFF);
  store(ds, mul(lanes, set1(half_at(b))));
  store(ms, mul(lanes, set1(half_at(b + 2))));
  VS_FROM_MEMORY();
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (Five ? 48 : 16);
  const V sixteen = set1(16.0f);
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const B16 q0 = bytes16(qs + 32 * c), q1 = bytes16(qs + 32 * c + 16);
    B16 h0{}, h1{};
    if (Five) h0 = bytes16(qh), h1 = bytes16(qh + 16);
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      const int s = 2 * c + half;
      const V d_sc = broadcast(ds + s), m = broadcast(ms + 8 + s);
      const V lo = sub(mul(d_sc, iota()), m);  // the sub-block's possible weights
      if (Five) {
        const V hi = sub(mul(d_sc, add(iota(), sixteen)), m);
        f(64 * c + 32 * half, lookup32(lo, hi, q0, 4 * half, h0, s));
        f(64 * c + 32 * half + 16, lookup32(lo, hi, q1, 4 * half, h1, s));
      } else {
        f(64 * c + 32 * half, lookup16(lo, q0, 4 * half));
        f(64 * c + 32 * half + 16, lookup16(lo, q1, 4 * half));
      }
    }
  }
}

template <>
struct Format<Q4_K> {  // d, dmin, scales[12], qs[128]
  static constexpr int kElems = 256, kBytes = 144;
  template <class F>
  VS_ALWAYS_INLINE static void each(const uint8_t* b, F&& f) { each_k<false>(b, f); }
};

template <>
struct Format<Q5_K> {  // d, dmin, scales[12], qh[32], qs[128]
  static constexpr int kElems = 256, kBytes = 176;
  template <class F>
  VS_ALWAYS_INLINE static void each(const uint8_t* b, F&& f) { each_k<true>(b, f); }
};

template <>
struct Format<Q6_K> {  // ql[128], qh[64], scales[16] (int8), d: w = (d * sc_(i / 16)) * (q - 32)
  static constexpr int kElems = 256, kBytes = 210;
  // weights 128h .. 128h + 127: runs r = 0..3 of 32, the low (r < 2) or high nibbles of
  // ql[64h + 32 (r & 1) ..] with bits 2r, 2r + 1 of qh[32h ..] above them
  template <class F>
  VS_ALWAYS_INLINE static void each(const uint8_t* b, F&& f) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    alignas(64) float ds[16];  // d * sc_g, the 16 scales' products in one multiply
    store(ds, mul(set1(half_at(b + 208)), from_i8(reinterpret_cast<const int8_t*>(b + 192))));
    VS_FROM_MEMORY();
    auto run = [&](int i, B16 a, B16 z, int shift, B16 h0, B16 h1, int hshift) VS_ALWAYS_INLINE {
      const V qa = q6(a, shift, h0, hshift), qz = q6(z, shift, h1, hshift);  // q - 32, composed in integers
      f(i, mul(broadcast(ds + i / 16), qa));
      f(i + 16, mul(broadcast(ds + i / 16 + 1), qz));
    };
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const uint8_t* l = ql + 64 * h;
      const B16 h0 = bytes16(qh + 32 * h), h1 = bytes16(qh + 32 * h + 16);
      const B16 l0 = bytes16(l), l1 = bytes16(l + 16);
      run(128 * h, l0, l1, 0, h0, h1, 0);
      const B16 l2 = bytes16(l + 32), l3 = bytes16(l + 48);
      run(128 * h + 32, l2, l3, 0, h0, h1, 2);
      run(128 * h + 64, l0, l1, 4, h0, h1, 4);
      run(128 * h + 96, l2, l3, 4, h0, h1, 6);
    }
  }
};

// f(std::integral_constant<int, T>{}) for the format T numbered `type`; false for an unknown number
template <class F>
inline bool with_format(int64_t type, F&& f) {
  switch (type) {
#define VS_FORMAT(T) \
  case T: f(std::integral_constant<int, T>{}); return true;
    VS_FORMAT(F32) VS_FORMAT(F16) VS_FORMAT(BF16) VS_FORMAT(Q4_0) VS_FORMAT(Q4_1) VS_FORMAT(Q5_0) VS_FORMAT(Q5_1)
    VS_FORMAT(Q8_0) VS_FORMAT(Q4_K) VS_FORMAT(Q5_K) VS_FORMAT(Q6_K)
#undef VS_FORMAT
  }
  return false;
}

// Bytes of one row of `in` weights in format T.
template <int T>
inline int64_t row_bytes(int64_t in) {
  return in / Format<T>::kElems * Format<T>::kBytes;
}

// One row of `in` weights unpacked: out[0..in)
template <int T>
inline void unpack_row(const uint8_t* row, float* out, int64_t in) {
  constexpr int E = Format<T>::kElems, B = Format<T>::kBytes;
  for (int64_t k = 0; k < in / E; ++k) {
    float* o = out + k * E;
    Format<T>::each(row + k * B, [o](int j, V w) { store(o + j, w); });
  }
}

// outputs o0 .. o0 + OB - 1 (rows of `w`, `rb` bytes each) for rows x[0..R): y[r * ldy + o] =
// dot(unpacked w[o], x[r]), ops.h's dot to the bit: 16 lanes at a time in order, then the sum
// tree. The lanes are unpacked in registers and used at once by every row.
// Prefetching, 32-weight blocks: with Short (a block of OB rows within kShortBlock bytes), the
// next block's bytes one cache line an iteration in address order: its rows lie back to back, and
// a short row (Gemma's head: 680 bytes) is too short for the hardware prefetcher to follow on its
// own; otherwise each row's next block position. (Prefetching past the matrix's end is harmless.)
constexpr int64_t kShortBlock = 16384;

template <int T, int R, int OB, bool Short = false>
inline void products_q(const float* __restrict x, const uint8_t* __restrict w, int64_t rb, float* __restrict y, int64_t in,
                       int64_t ldy, int64_t o0) {
  constexpr int E = Format<T>::kElems, B = Format<T>::kBytes;
  V acc[OB][R];
  for (int b = 0; b < OB; ++b)
    for (int r = 0; r < R; ++r) acc[b][r] = zero();
  for (int64_t k = 0; k < in / E; ++k) {
    const float* xk = x + k * E;
    if constexpr (E == 32 && kRegisters >= 32 && (R == 2 || R >= 5)) {
      // small blocks, AVX-512, 2 or 5-8 rows: the OB blocks unpacked first, then each row's x
      // loaded once for all OB outputs (not once per output). The same fused multiply-adds in the
      // same order per accumulator. Faster only at these row counts; 3-4 rows (4 outputs a block)
      // keep the other path (docs/design/quant.md, "Unpacking in registers").
      V wv[OB][2];
#pragma GCC unroll 8
      for (int b = 0; b < OB; ++b) {
        const uint8_t* blk = w + (o0 + b) * rb + k * B;
        if constexpr (Short) prefetch(reinterpret_cast<const float*>(w + (o0 + OB) * rb + (k * OB + b) * 64));
        else prefetch(reinterpret_cast<const float*>(blk + OB * rb));
        Format<T>::each(blk, [&](int j, V v) VS_ALWAYS_INLINE { wv[b][j >> 4] = v; });
      }
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const V xr = load(xk + r * in + 16 * j);
#pragma GCC unroll 8
          for (int b = 0; b < OB; ++b) acc[b][r] = fmadd(wv[b][j], xr, acc[b][r]);
        }
      }
    } else if constexpr (E == 32) {  // small blocks: the outputs' loop unrolled, every accumulator in a register
#pragma GCC unroll 8
      for (int b = 0; b < OB; ++b) {
        V* ab = acc[b];
        const uint8_t* blk = w + (o0 + b) * rb + k * B;
        if constexpr (Short) prefetch(reinterpret_cast<const float*>(w + (o0 + OB) * rb + (k * OB + b) * 64));
        else prefetch(reinterpret_cast<const float*>(blk + OB * rb));
        Format<T>::each(blk, [&](int j, V wv) VS_ALWAYS_INLINE {
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) ab[r] = fmadd(wv, load(xk + r * in + j), ab[r]);
        });
      }
    } else {  // 256-weight blocks: one output at a time, its accumulators copied into registers
      for (int b = 0; b < OB; ++b) {
        V a[R];
        for (int r = 0; r < R; ++r) a[r] = acc[b][r];
        const uint8_t* blk = w + (o0 + b) * rb + k * B;
        for (int p = 0; p < B; p += 64) prefetch(reinterpret_cast<const float*>(blk + OB * rb + p));
        Format<T>::each(blk, [&](int j, V wv) VS_ALWAYS_INLINE {
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) a[r] = fmadd(wv, load(xk + r * in + j), a[r]);
        });
        for (int r = 0; r < R; ++r) acc[b][r] = a[r];
      }
    }
  }
  for (int b = 0; b < OB; ++b)
    for (int r = 0; r < R; ++r) y[r * ldy + o0 + b] = sum(acc[b][r]);
}

}  // namespace vs
