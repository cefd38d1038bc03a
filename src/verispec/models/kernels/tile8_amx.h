// tile8.h's products through AMX (Intel's tile matrix unit: this build when the CPU has amx_int8,
// rowwise.py): for kAmxRows+ rows, one tile instruction forms a block's integer dot products for
// all rows and the tile's 16 outputs at once (TDPBSUD: x signed by the unsigned 4- and 5-bit
// quants; TDPBSSD: by Q8_0's signed ones). The integers are exact, and the float work on them is
// tile8.h's, lane by lane, so the results are the bits of the vector path (and of every variant).
// A tile block costs AMX about the same for any number of rows, more than the vector path's for a
// few (docs/design/quant.md).
// Linux hands the tile registers to a process that asks (arch_prctl); amx_ready() asks once, and
// where it is refused the vector path runs instead.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

namespace vs {

constexpr int kAmxRows = 5;  // from this many rows on AMX is the faster (docs/design/quant.md)

inline bool amx_ready() {
  static const bool ready = [] {
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return ready;
}

// tiles: 0, 1 the dot products (R rows x 16 int32), 2 x (R rows x 32 bytes), 3, 4 the quants
// (8 rows of 64 bytes: a tile block's groups of 4 weights)
inline void amx_configure(int R) {
  struct alignas(64) Config {
    uint8_t palette = 1, start = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } c;
  c.rows[0] = c.rows[1] = c.rows[2] = static_cast<uint8_t>(R);
  c.colsb[0] = c.colsb[1] = 64;
  c.colsb[2] = 32;
  c.rows[3] = c.rows[4] = 8;
  c.colsb[3] = c.colsb[4] = 64;
  _tile_loadconfig(&c);
}

// tile8.h's tile_range for R >= 2 rows through AMX; the same results
template <int T, int R>
inline void tile_range_amx(const XQ& xq, const uint8_t* __restrict w, float* __restrict y, int64_t in, int64_t ldy, int64_t t0, int64_t t1) {
  using F = Tile<T>;
  constexpr bool kSignedQuants = T == Q8_0;  // raw int8 quants: TDPBSSD
  const int64_t nb = in / 32;
  amx_configure(R);
  // the 4- and 5-bit quants unpacked to bytes two blocks ahead, into a ring of buffers: a tile
  // load of bytes stored just before waits for the stores (docs/design/quant.md)
  alignas(64) uint8_t quants[4][8 * 64];
  alignas(64) int32_t dots[2][R * 16];
  const auto unpack = [&](const uint8_t* tb, uint8_t* out) {
    if constexpr (!kSignedQuants) {
      Q64 u[8];
      F::quants(tb, u);
      for (int g = 0; g < 8; ++g) q64_store(out + 64 * g, u[g]);
    }
  };
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* tile = w + t * nb * F::kTile;
    V acc[R];
    for (int r = 0; r < R; ++r) acc[r] = zero();
    for (int64_t b = 0; b < 2 && b < nb; ++b) unpack(tile + b * F::kTile, quants[b]);
    // block b's tile instructions are issued before block b - 1's float work, which then runs
    // while they do
    const auto finish = [&](int64_t b) {
      const uint8_t* tb = tile + b * F::kTile;
      const V ws = half16(tb);
      V wm = zero();
      if constexpr (F::kMin) wm = half16(tb + 32);
      const int32_t* d = dots[b & 1];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) block_acc<F, F::kRawOffset>(xq, b, r, i16_load(d + 16 * r), ws, wm, acc[r]);
    };
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* tb = tile + b * F::kTile;
      for (int p = 0; p < F::kTile; p += 64) prefetch(reinterpret_cast<const float*>(tb + 4 * F::kTile + p));
      if (b + 2 < nb) unpack(tb + 2 * F::kTile, quants[(b + 2) & 3]);
      const uint8_t* q = kSignedQuants ? tb + 32 : quants[b & 3];
      _tile_loadd(2, xq.q + 32 * b, xq.n);
      if ((b & 1) == 0) {  // two sets of tiles, so that block b + 1 need not wait for b's
        _tile_loadd(3, q, 64);
        _tile_zero(0);
        if constexpr (kSignedQuants) _tile_dpbssd(0, 2, 3);
        else _tile_dpbsud(0, 2, 3);
        _tile_stored(0, dots[0], 64);
      } else {
        _tile_loadd(4, q, 64);
        _tile_zero(1);
        if constexpr (kSignedQuants) _tile_dpbssd(1, 2, 4);
        else _tile_dpbsud(1, 2, 4);
        _tile_stored(1, dots[1], 64);
      }
      if (b > 0) finish(b - 1);
    }
    finish(nb - 1);
    for (int r = 0; r < R; ++r) store(y + r * ldy + kTileRows * t, acc[r]);
  }
}

}  // namespace vs
