// Products with int8 activations whose float work is per 32-weight block (weights_format
// "gguf-int8" for the 32-weight formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), the way llama.cpp's own dot products form them.
// quant8.h's other formats apply their scales per group of 4 weights instead.
//
// The arithmetic, defined once (every variant and both layouts below give the same bits): x is
// quantised as quant8.h says (per 32-value block: d, the q_k, S = their sum). For an output and a
// row, over the row's blocks b = 0, 1, ... in order, acc starting at +0:
//   i   = sum over the block of w_k * q_k              (integers, exact)
//   acc = fma(float(i), ws * d, acc)
//   acc = fma(wm, d * float(S), acc)                   (Q4_1, Q5_1; d * float(S) is XQ's sxb)
// y = acc. w_k: Q4_0 the 4-bit quant - 8, Q4_1 the 4-bit quant, Q5_0 the 5-bit quant - 16, Q5_1
// the 5-bit quant, Q8_0 the int8 quant; ws, wm: the block's float16 scale and min. One product and one or two fused multiply-adds per block and
// row, where quant8.h's arithmetic spends about four operations per 4 weights and row.
//
// Two layouts, the same results:
//  - the file's rows, uint8 [rows, row bytes]: `block_range`, one output at a time in plain code
//    (any number of rows; the tests' reference and a matrix's last rows past a whole 16).
//  - tiles of 16 outputs, uint8 [rows / 16, blocks, kTile] (`tile_rows`, made when a model loads
//    for gguf-int8; `untile_row` gives an output's file bytes back). A tile block holds the 16
//    outputs' scales (float16), their mins (Q4_1), then the quants with output j's 4 consecutive
//    weights in bytes 4j .. 4j + 3 of each 64-byte run: the 16 outputs are the 16 lanes, one dot
//    instruction covers 4 weights of all of them for a row, and the float work above is lane by
//    lane, with no sum across lanes. Q4_0 / Q4_1: 4 runs, run c holding weights 8c .. 8c + 3 in
//    its low nibbles and 8c + 4 .. 8c + 7 in its high ones; Q8_0: 8 runs, run g weights 4g .. 4g + 3.
#pragma once

#include "int8.h"
#include "ktile8.h"
#include "quant8.h"

namespace vs {

// A format's blocks: kBytes a file block, kHead its scale (and min) bytes, w(blk, k) its k-th
// weight's integer, ws / wm its scale and min; kTile a tile block. Tile load(tb, u, ws, wm): the 8
// groups of 4 weights (u, for dot4u_acc, or for dot4s_acc where kSigned) minus kOffset * S.
template <int T>
struct Tile {
  static constexpr bool kDefined = false;
};

template <bool Min, bool Five = false>
struct Q4Tile {  // Q4_0 (w = q - 8, scale d), Q4_1 (w = q, scale d, min m); Five: Q5_0 (w = q - 16), Q5_1 (w = q)
  static constexpr bool kDefined = true, kMin = Min, kSigned = false;
  static constexpr int kElems = 32;  // weights a block (the K-quants' tiles: 256, ktile8.h)
  static constexpr int kQh = Min ? 4 : 2;  // a file block: d (and m), the fifth bits (Five), the quants
  static constexpr int kHead = kQh + (Five ? 4 : 0), kBytes = kHead + 16, kTile = 16 * kBytes;
  static constexpr int kOffset = Min ? 0 : Five ? 16 : 8;  // the tile's u are the raw quants
  static constexpr int kRawOffset = kOffset;  // the same where the quants enter the dot products as stored (AMX)
  static constexpr int kScales = Min ? 64 : 32;           // a tile block: scales (and mins), fifth bits, quants
  static constexpr int kQuants = kScales + (Five ? 64 : 0);
  static int w(const uint8_t* blk, int k) {
    int u = k < 16 ? blk[kHead + k] & 15 : blk[kHead + k - 16] >> 4;
    if constexpr (Five) u |= ((qh(blk) >> k) & 1) << 4;
    return u - kOffset;
  }
  static uint32_t qh(const uint8_t* blk) {  // the fifth bits
    uint32_t h;
    std::memcpy(&h, blk + kQh, 4);
    return h;
  }
  // the fifth bits in a tile block: 8 words of 64 bits, bit 4j + i of word g for weight 4g + i of output j
  static void set_fifth(uint8_t* tb, int j, int k) {
    uint8_t* word = tb + kScales + 8 * (k / 4);
    const int bit = 4 * j + k % 4;
    word[bit / 8] = static_cast<uint8_t>(word[bit / 8] | (1 << (bit % 8)));
  }
  static int fifth(const uint8_t* tb, int j, int k) {
    const int bit = 4 * j + k % 4;
    return (tb[kScales + 8 * (k / 4) + bit / 8] >> (bit % 8)) & 1;
  }
  static float ws(const uint8_t* blk) { return half_at(blk); }
  static float wm(const uint8_t* blk) { return Min ? half_at(blk + 2) : 0.0f; }
  // where weight k of output j lies in a tile block: its byte, and the nibble's shift there
  static int quant_at(int j, int k) { return kQuants + 64 * (k / 8) + 4 * j + k % 4; }
  static int quant_shift(int k) { return (k % 8) >= 4 ? 4 : 0; }
  static void pack(const uint8_t* blk, int j, uint8_t* tb) {
    std::memcpy(tb + 2 * j, blk, 2);
    if (Min) std::memcpy(tb + 32 + 2 * j, blk + 2, 2);
    for (int k = 0; k < 32; ++k) {
      const int u = w(blk, k) + kOffset;
      tb[quant_at(j, k)] = static_cast<uint8_t>(tb[quant_at(j, k)] | ((u & 15) << quant_shift(k)));
      if (Five && (u & 16)) set_fifth(tb, j, k);
    }
  }
  static void unpack(const uint8_t* tb, int j, uint8_t* blk) {
    std::memcpy(blk, tb + 2 * j, 2);
    if (Min) std::memcpy(blk + 2, tb + 32 + 2 * j, 2);
    std::memset(blk + kQh, 0, kBytes - kQh);
    uint32_t h = 0;
    for (int k = 0; k < 32; ++k) {
      const uint8_t u = (tb[quant_at(j, k)] >> quant_shift(k)) & 15;
      blk[kHead + k % 16] = static_cast<uint8_t>(blk[kHead + k % 16] | (k < 16 ? u : u << 4));
      if constexpr (Five) h |= static_cast<uint32_t>(fifth(tb, j, k)) << k;
    }
    if constexpr (Five) std::memcpy(blk + kQh, &h, 4);
  }
  VS_ALWAYS_INLINE static void load(const uint8_t* tb, Q64* u, V& s, V& m) {
    s = half16(tb);
    if constexpr (Min) m = half16(tb + 32);
    quants(tb, u);
  }
  VS_ALWAYS_INLINE static void quants(const uint8_t* tb, Q64* u) {
    for (int c = 0; c < 4; ++c) nib64(tb + kQuants + 64 * c, u[2 * c], u[2 * c + 1]);
    if constexpr (Five)
      for (int g = 0; g < 8; ++g) {
        uint64_t bits;
        std::memcpy(&bits, tb + kScales + 8 * g, 8);
        u[g] = or_bits(u[g], bits, 16);
      }
  }
};
template <>
struct Tile<Q4_0> : Q4Tile<false> {};
template <>
struct Tile<Q4_1> : Q4Tile<true> {};
template <>
struct Tile<Q5_0> : Q4Tile<false, true> {};
template <>
struct Tile<Q5_1> : Q4Tile<true, true> {};

template <>
struct Tile<Q8_0> {  // w = q (int8), scale d
  static constexpr bool kDefined = true, kMin = false;
  static constexpr int kElems = 32;
  static constexpr int kHead = 2, kBytes = 34, kTile = 16 * kBytes;
  // where the dot instruction takes unsigned bytes (VNNI) the tile's int8 quants go in as q + 128,
  // and 128 * S comes off: the same integers
  static constexpr bool kSigned = !kDotUnsigned;
  static constexpr int kOffset = kDotUnsigned ? 128 : 0, kRawOffset = 0;
  static int w(const uint8_t* blk, int k) { return static_cast<int8_t>(blk[2 + k]); }
  static float ws(const uint8_t* blk) { return half_at(blk); }
  static float wm(const uint8_t*) { return 0.0f; }
  static void pack(const uint8_t* blk, int j, uint8_t* tb) {
    std::memcpy(tb + 2 * j, blk, 2);
    for (int k = 0; k < 32; ++k) tb[32 + 64 * (k / 4) + 4 * j + k % 4] = blk[2 + k];
  }
  static void unpack(const uint8_t* tb, int j, uint8_t* blk) {
    std::memcpy(blk, tb + 2 * j, 2);
    for (int k = 0; k < 32; ++k) blk[2 + k] = tb[32 + 64 * (k / 4) + 4 * j + k % 4];
  }
  VS_ALWAYS_INLINE static void load(const uint8_t* tb, Q64* u, V& s, V&) {
    s = half16(tb);
    for (int g = 0; g < 8; ++g) u[g] = kDotUnsigned ? flip_sign(q64_load(tb + 32 + 64 * g)) : q64_load(tb + 32 + 64 * g);
  }
};

// the K-quants' tiles (ktile8.h): superblocks of 256 weights, their own arithmetic and products
template <>
struct Tile<Q4_K> : KTile<Q4_K> {};
template <>
struct Tile<Q6_K> : KTile<Q6_K> {};

}  // namespace vs

#if defined(__AMX_INT8__)
#include "tile8_amx.h"
#endif

namespace vs {

// rows [16 t, 16 t + 16) of a file-layout matrix (rb bytes a row, nb blocks) -> tile t (nb * kTile bytes)
template <int T>
inline void tile_rows(const uint8_t* rows, int64_t rb, int64_t nb, uint8_t* tile) {
  using F = Tile<T>;
  std::memset(tile, 0, nb * F::kTile);
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < kTileRows; ++j) F::pack(rows + j * rb + b * F::kBytes, j, tile + b * F::kTile);
}

// output `row` of a tiled matrix (nb blocks a row) -> its file bytes (nb * kBytes)
template <int T>
inline void untile_row(const uint8_t* tiles, int64_t row, int64_t nb, uint8_t* out) {
  using F = Tile<T>;
  const uint8_t* tile = tiles + row / kTileRows * nb * F::kTile;
  for (int64_t b = 0; b < nb; ++b) F::unpack(tile + b * F::kTile, static_cast<int>(row % kTileRows), out + b * F::kBytes);
}

// file layout: outputs [o0, o1) (rows of `w`, one at a time) for rows 0..R of xq: y[r * ldy + o]
template <int T, int R>
inline void block_range32(const XQ& xq, const uint8_t* w, float* y, int64_t in, int64_t ldy, int64_t o0, int64_t o1) {
  using F = Tile<T>;
  const int64_t nb = in / 32, rb = nb * F::kBytes;
  for (int64_t o = o0; o < o1; ++o)
    for (int r = 0; r < R; ++r) {
      const int8_t* q = xq.q + r * xq.n;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + o * rb + b * F::kBytes;
        int32_t i = 0;
        for (int k = 0; k < 32; ++k) i += F::w(blk, k) * q[32 * b + k];
        acc = std::fma(static_cast<float>(i), F::ws(blk) * xq.dx[r * (xq.n / 4) + 8 * b], acc);
        if constexpr (F::kMin) acc = std::fma(F::wm(blk), xq.sxb[r * (xq.n / 32) + b], acc);
      }
      y[r * ldy + o] = acc;
    }
}

// tiles [t0, t1) (outputs 16 t0 .. 16 t1) for rows 0..R of xq: y[r * ldy + o]; each tile block
// unpacked once for all rows
template <int T, int R>
inline void tile_range32(const XQ& xq, const uint8_t* __restrict w, float* __restrict y, int64_t in, int64_t ldy, int64_t t0, int64_t t1) {
#if defined(__AMX_INT8__)
  if constexpr (R >= kAmxRows)
    if (amx_ready()) return tile_range_amx<T, R>(xq, w, y, in, ldy, t0, t1);
#endif
  using F = Tile<T>;
  const int64_t nb = in / 32;
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* tile = w + t * nb * F::kTile;
    V acc[R];
    for (int r = 0; r < R; ++r) acc[r] = zero();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* tb = tile + b * F::kTile;
      for (int p = 0; p < F::kTile; p += 64) prefetch(reinterpret_cast<const float*>(tb + 4 * F::kTile + p));
      Q64 u[8];
      V ws, wm = zero();
      F::load(tb, u, ws, wm);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        block_acc<F, F::kOffset>(xq, b, r, block_dot<F::kSigned>(xq, b, r, u), ws, wm, acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) store(y + r * ldy + kTileRows * t, acc[r]);
  }
}

// either layout for any format with tiles: the 32-weight formats' (above) or the K-quants' (ktile8.h)
template <int T, int R>
inline void block_range(const XQ& xq, const uint8_t* w, float* y, int64_t in, int64_t ldy, int64_t o0, int64_t o1) {
  if constexpr (Tile<T>::kElems == 256) kblock_range<T, R>(xq, w, y, in, ldy, o0, o1);
  else block_range32<T, R>(xq, w, y, in, ldy, o0, o1);
}
template <int T, int R>
inline void tile_range(const XQ& xq, const uint8_t* __restrict w, float* __restrict y, int64_t in, int64_t ldy, int64_t t0, int64_t t1) {
  if constexpr (Tile<T>::kElems == 256) ktile_range<T, R>(xq, w, y, in, ldy, t0, t1);
  else tile_range32<T, R>(xq, w, y, in, ldy, t0, t1);
}

// f(std::integral_constant<int, T>{}) for the formats with tiles; false for the others
template <class Fn>
inline bool with_tile_format(int64_t type, Fn&& f) {
  switch (type) {
    case Q4_0: f(std::integral_constant<int, Q4_0>{}); return true;
    case Q4_1: f(std::integral_constant<int, Q4_1>{}); return true;
    case Q5_0: f(std::integral_constant<int, Q5_0>{}); return true;
    case Q5_1: f(std::integral_constant<int, Q5_1>{}); return true;
    case Q8_0: f(std::integral_constant<int, Q8_0>{}); return true;
    case Q4_K: f(std::integral_constant<int, Q4_K>{}); return true;
    case Q6_K: f(std::integral_constant<int, Q6_K>{}); return true;
    default: return false;
  }
}

}  // namespace vs
