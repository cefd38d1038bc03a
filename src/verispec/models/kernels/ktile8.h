// Products with int8 activations over the K-quants Q4_K and Q6_K with float work per 32-weight
// block of x, as tile8.h does for the 32-weight formats (weights_format "gguf-int8"). quant8.h's
// per-lane arithmetic (scales per group of 4 weights, ~40 float operations per 512 weights and row)
// stays for Q5_K.
//
// The arithmetic, defined once (every variant and both layouts give the same bits). x is quantised
// as quant8.h says (per 32-value block b: d_b, the q_k, S_b = their sum; s_g per group of 4). A
// 256-weight superblock holds 8 of x's blocks; for an output and a row, over the blocks b in order,
// acc starting at +0:
//   Q4_K (w = (d * sc_j) * u - dmin * m_j, u the 4-bit quant, j = the 32-weight sub-block):
//     i   = sum over the block of u_k * q_k                         (integers, exact)
//     acc = fma(float(i), ws * d_b, acc)       ws = d * float(sc_j)
//     acc = fma(wm, d_b * float(S_b), acc)     wm = (0 - dmin) * float(m_j)   (d_b * float(S_b): XQ's sxb)
//   Q6_K (w = (d * sc_h) * (u - 32), u the 6-bit quant, one scale per 16 weights), for the block's
//   halves h = 0, 1 (weights 16h .. 16h + 15 of the block):
//     i_h = sum over the half of u_k * q_k - 32 * (s_4h + .. + s_4h+3)
//     acc = fma(float(i_h), ws_h * d_b, acc)   ws_h = d * float(sc_h)
// y = acc. ws, wm are exact products (11 x 8 significant bits at most); one to three fused
// multiply-adds per 32 weights and row.
//
// Two layouts, the same results: the file's rows (`kblock_range`, one output at a time in plain
// code: a matrix's last rows past a whole 16, and the tests' reference), and tiles of 16 outputs
// (`ktile_range`; made when a model loads for gguf-int8, as tile8.h's), a tile block per
// superblock holding the 16 outputs' scales unpacked to bytes and their quants with output o's 4
// consecutive weights in bytes 4o .. 4o + 3 of each 64-byte run, so that the outputs are the lanes:
//   Q4_K (2368 bytes for 16 x 144): d[16], dmin[16] (float16), sc[8][16], m[8][16] (bytes), then
//     per sub-block j 256 bytes: run c (0..3) holds weights 8c .. 8c + 3 in its low nibbles and
//     8c + 4 .. 8c + 7 in its high ones.
//   Q6_K (3360 bytes, as 16 x 210): d[16] (float16), sc[16][16] (int8, per 16-weight group), then
//     per sub-block j 384 bytes: the low 4 bits as Q4_K's runs, then per group g of 4 weights two
//     64-bit words, bit 4o + i of the first set where weight 4g + i of output o has its bit 4, of
//     the second its bit 5.
#pragma once

#include "int8.h"
#include "quant8.h"

namespace vs {

constexpr int kTileRows = 16;  // outputs per tile: the lanes

template <int T>
struct KTile {
  static constexpr bool kDefined = false;
};

// the 16-entry runs of a sub-block's low nibbles: weight kk (0..31) of output o
inline int knib_at(int o, int kk) { return 64 * (kk / 8) + 4 * o + kk % 4; }
inline int knib_shift(int kk) { return (kk % 8) >= 4 ? 4 : 0; }

template <>
struct KTile<Q4_K> {
  static constexpr bool kDefined = true, kMin = true;
  static constexpr int kElems = 256, kBytes = 144, kTile = 2368, kQuants = 320, kSub = 256;
  // the file block's 4-bit quant of weight k (sub-block k / 32)
  static int u(const uint8_t* blk, int k) {
    const int j = k / 32, kk = k % 32;
    const uint8_t b = blk[16 + 32 * (j / 2) + kk];
    return j % 2 ? b >> 4 : b & 15;
  }
  static void scale_min(const uint8_t* blk, int j, int& sc, int& m) { scale_min_k4(j, blk + 4, sc, m); }
  static float ws(const uint8_t* blk, int j) {
    int sc, m;
    scale_min(blk, j, sc, m);
    return half_at(blk) * static_cast<float>(sc);
  }
  static float wm(const uint8_t* blk, int j) {
    int sc, m;
    scale_min(blk, j, sc, m);
    return (0.0f - half_at(blk + 2)) * static_cast<float>(m);
  }
  static void pack(const uint8_t* blk, int o, uint8_t* tb) {
    std::memcpy(tb + 2 * o, blk, 2);
    std::memcpy(tb + 32 + 2 * o, blk + 2, 2);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      scale_min(blk, j, sc, m);
      tb[64 + 16 * j + o] = static_cast<uint8_t>(sc);
      tb[192 + 16 * j + o] = static_cast<uint8_t>(m);
      for (int kk = 0; kk < 32; ++kk) {
        uint8_t& byte = tb[kQuants + kSub * j + knib_at(o, kk)];
        byte = static_cast<uint8_t>(byte | (u(blk, 32 * j + kk) << knib_shift(kk)));
      }
    }
  }
  // the file's bytes back: the 12 scale bytes packed as ggml packs them (scale_min_k4's inverse)
  static void unpack(const uint8_t* tb, int o, uint8_t* blk) {
    std::memset(blk, 0, kBytes);
    std::memcpy(blk, tb + 2 * o, 2);
    std::memcpy(blk + 2, tb + 32 + 2 * o, 2);
    uint8_t* q = blk + 4;
    for (int j = 0; j < 8; ++j) {
      const int sc = tb[64 + 16 * j + o], m = tb[192 + 16 * j + o];
      if (j < 4) {
        q[j] = static_cast<uint8_t>(q[j] | (sc & 63));
        q[j + 4] = static_cast<uint8_t>(q[j + 4] | (m & 63));
      } else {
        q[j + 4] = static_cast<uint8_t>((sc & 15) | ((m & 15) << 4));
        q[j - 4] = static_cast<uint8_t>(q[j - 4] | ((sc >> 4) << 6));
        q[j] = static_cast<uint8_t>(q[j] | ((m >> 4) << 6));
      }
      for (int kk = 0; kk < 32; ++kk) {
        const int v = (tb[kQuants + kSub * j + knib_at(o, kk)] >> knib_shift(kk)) & 15;
        uint8_t& b = blk[16 + 32 * (j / 2) + kk];
        b = static_cast<uint8_t>(b | (j % 2 ? v << 4 : v));
      }
    }
  }
};

template <>
struct KTile<Q6_K> {
  static constexpr bool kDefined = true, kMin = false;
  static constexpr int kElems = 256, kBytes = 210, kTile = 3360, kQuants = 288, kSub = 384;
  // weight k: the low nibble of ql[64h + 32 (r & 1) + l] (r < 2) or its high one, bits 2r, 2r + 1
  // of qh[32h + l] above it (h = k / 128, r = k % 128 / 32, l = k % 32)
  static int u(const uint8_t* blk, int k) {
    const int h = k / 128, r = k % 128 / 32, l = k % 32;
    const uint8_t lo = blk[64 * h + 32 * (r & 1) + l];
    return ((r < 2 ? lo : lo >> 4) & 15) | (((blk[128 + 32 * h + l] >> (2 * r)) & 3) << 4);
  }
  static float ws(const uint8_t* blk, int g16) {
    return half_at(blk + 208) * static_cast<float>(static_cast<int8_t>(blk[192 + g16]));
  }
  static void pack(const uint8_t* blk, int o, uint8_t* tb) {
    std::memcpy(tb + 2 * o, blk + 208, 2);
    for (int g = 0; g < 16; ++g) tb[32 + 16 * g + o] = blk[192 + g];
    for (int j = 0; j < 8; ++j) {
      uint8_t* sub = tb + kQuants + kSub * j;
      for (int kk = 0; kk < 32; ++kk) {
        const int v = u(blk, 32 * j + kk), bit = 4 * o + kk % 4;
        sub[knib_at(o, kk)] = static_cast<uint8_t>(sub[knib_at(o, kk)] | ((v & 15) << knib_shift(kk)));
        uint8_t* words = sub + 256 + 16 * (kk / 4);
        if (v & 16) words[bit / 8] = static_cast<uint8_t>(words[bit / 8] | (1 << (bit % 8)));
        if (v & 32) words[8 + bit / 8] = static_cast<uint8_t>(words[8 + bit / 8] | (1 << (bit % 8)));
      }
    }
  }
  static void unpack(const uint8_t* tb, int o, uint8_t* blk) {
    std::memset(blk, 0, kBytes);
    std::memcpy(blk + 208, tb + 2 * o, 2);
    for (int g = 0; g < 16; ++g) blk[192 + g] = tb[32 + 16 * g + o];
    for (int k = 0; k < 256; ++k) {
      const int j = k / 32, kk = k % 32, bit = 4 * o + kk % 4;
      const uint8_t* sub = tb + kQuants + kSub * j;
      const uint8_t* words = sub + 256 + 16 * (kk / 4);
      const int v = ((sub[knib_at(o, kk)] >> knib_shift(kk)) & 15) | (((words[bit / 8] >> (bit % 8)) & 1) << 4) |
                    (((words[8 + bit / 8] >> (bit % 8)) & 1) << 5);
      const int h = k / 128, r = k % 128 / 32, l = k % 32;
      uint8_t& lo = blk[64 * h + 32 * (r & 1) + l];
      lo = static_cast<uint8_t>(lo | (r < 2 ? v & 15 : (v & 15) << 4));
      blk[128 + 32 * h + l] = static_cast<uint8_t>(blk[128 + 32 * h + l] | ((v >> 4) << (2 * r)));
    }
  }
};

// the sum of x's q over half h (16 values) of block b of row r: s_4h + .. + s_4h+3
inline int32_t half_sum(const XQ& xq, int r, int64_t b, int h) {
  const int32_t* s = xq.s + r * (xq.n / 4) + 8 * b + 4 * h;
  return s[0] + s[1] + s[2] + s[3];
}

// file layout: outputs [o0, o1) for rows 0..R of xq: y[r * ldy + o], one at a time in plain code
template <int T, int R>
inline void kblock_range(const XQ& xq, const uint8_t* w, float* y, int64_t in, int64_t ldy, int64_t o0, int64_t o1) {
  using F = KTile<T>;
  const int64_t ns = in / 256, rb = ns * F::kBytes;
  for (int64_t o = o0; o < o1; ++o)
    for (int r = 0; r < R; ++r) {
      const int8_t* q = xq.q + r * xq.n;
      float acc = 0.0f;
      for (int64_t s = 0; s < ns; ++s) {
        const uint8_t* blk = w + o * rb + s * F::kBytes;
        for (int j = 0; j < 8; ++j) {
          const int64_t b = 8 * s + j;
          const float dx = xq.dx[r * (xq.n / 4) + 8 * b];
          if constexpr (T == Q4_K) {
            int32_t i = 0;
            for (int kk = 0; kk < 32; ++kk) i += F::u(blk, 32 * j + kk) * q[32 * b + kk];
            acc = std::fma(static_cast<float>(i), F::ws(blk, j) * dx, acc);
            acc = std::fma(F::wm(blk, j), xq.sxb[r * (xq.n / 32) + b], acc);
          } else {
            for (int h = 0; h < 2; ++h) {
              int32_t i = 0;
              for (int kk = 16 * h; kk < 16 * h + 16; ++kk) i += F::u(blk, 32 * j + kk) * q[32 * b + kk];
              i -= 32 * half_sum(xq, r, b, h);
              acc = std::fma(static_cast<float>(i), F::ws(blk, 2 * j + h) * dx, acc);
            }
          }
        }
      }
      y[r * ldy + o] = acc;
    }
}

// sub-block j's 8 groups of 4 weights for the 16 outputs (u[g]: weights 4g .. 4g + 3)
template <int T>
VS_ALWAYS_INLINE inline void ksub_quants(const uint8_t* sub, Q64* u) {
  for (int c = 0; c < 4; ++c) nib64(sub + 64 * c, u[2 * c], u[2 * c + 1]);
  if constexpr (T == Q6_K)
    for (int g = 0; g < 8; ++g) {
      uint64_t b4, b5;
      std::memcpy(&b4, sub + 256 + 16 * g, 8);
      std::memcpy(&b5, sub + 256 + 16 * g + 8, 8);
      u[g] = or_bits(or_bits(u[g], b4, 16), b5, 32);
    }
}

// tiles [t0, t1) (outputs 16 t0 .. 16 t1) for rows 0..R of xq: y[r * ldy + o]; each sub-block's
// quants unpacked once for all rows
template <int T, int R>
inline void ktile_range(const XQ& xq, const uint8_t* __restrict w, float* __restrict y, int64_t in, int64_t ldy, int64_t t0, int64_t t1) {
  using F = KTile<T>;
  const int64_t ns = in / 256;
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* tile = w + t * ns * F::kTile;
    V acc[R];
    for (int r = 0; r < R; ++r) acc[r] = zero();
    for (int64_t s = 0; s < ns; ++s) {
      const uint8_t* tb = tile + s * F::kTile;
      const V d = half16(tb);
      V dmin = zero();
      if constexpr (T == Q4_K) dmin = sub(zero(), half16(tb + 32));
      for (int j = 0; j < 8; ++j) {
        const uint8_t* sub_block = tb + F::kQuants + F::kSub * j;
        for (int p = 0; p < F::kSub; p += 64) prefetch(reinterpret_cast<const float*>(sub_block + 2 * F::kTile + p));
        Q64 u[8];
        ksub_quants<T>(sub_block, u);
        const int64_t b = 8 * s + j;
        if constexpr (T == Q4_K) {
          const V ws = mul(d, bits(bytes16(tb + 64 + 16 * j), 0, 0xFF));
          const V wm = mul(dmin, bits(bytes16(tb + 192 + 16 * j), 0, 0xFF));
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) block_acc<F, 0>(xq, b, r, block_dot<false>(xq, b, r, u), ws, wm, acc[r]);  // as Q4_1's tiles
        } else {
          const V ws0 = mul(d, from_i8(reinterpret_cast<const int8_t*>(tb + 32 + 16 * (2 * j))));
          const V ws1 = mul(d, from_i8(reinterpret_cast<const int8_t*>(tb + 32 + 16 * (2 * j + 1))));
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            int32_t x4[8];
            std::memcpy(x4, xq.q + r * xq.n + 32 * b, 32);
            I16 i0 = i16_zero(), i1 = i16_zero();  // the block's two halves, each its own scale
#pragma GCC unroll 4
            for (int g = 0; g < 4; ++g) i0 = dot4u_acc(i0, u[g], x4[g]), i1 = dot4u_acc(i1, u[g + 4], x4[g + 4]);
            const V dx = set1(xq.dx[r * (xq.n / 4) + 8 * b]);
            acc[r] = fmadd(to_float(sub_all(i0, 32 * half_sum(xq, r, b, 0))), mul(ws0, dx), acc[r]);
            acc[r] = fmadd(to_float(sub_all(i1, 32 * half_sum(xq, r, b, 1))), mul(ws1, dx), acc[r]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r) store(y + r * ldy + kTileRows * t, acc[r]);
  }
}

}  // namespace vs
