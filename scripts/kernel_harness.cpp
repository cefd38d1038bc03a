// Torch-free check of the kernel arithmetic (models/kernels/ops.h, quant.h, quant8.h, tile8.h, ktile8.h) for one variant: runs
// dot, products, attention, rmsnorm, both activations, and the unpacking of and products over every
// GGUF block format (exact float32, and with int8 activations where quant8.h defines them) on fixed
// pseudo-random inputs and prints
// every result's bits, so that builds of different variants (including NEON under qemu) can be
// compared with `cmp`. Built and run by scripts/check_variants_cross.sh.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ops.h"
#include "quant.h"
#include "quant8.h"
#include "tile8.h"

static unsigned state = 12345u;
static float next() {  // uniform-ish in [-2, 2), exact in float
  state = state * 1664525u + 1013904223u;
  return static_cast<float>(static_cast<int>(state >> 9) - (1 << 22)) / static_cast<float>(1 << 21);
}
static unsigned rnd() {  // 24 random bits
  state = state * 1664525u + 1013904223u;
  return state >> 8;
}
static void out(const float* p, int n) {
  for (int i = 0; i < n; ++i) {
    unsigned b;
    std::memcpy(&b, p + i, 4);
    std::printf("%08x\n", b);
  }
}

// rows x [R, n] quantised for the int8 products: quant8.h's XQ and the arrays behind it
struct Quantised {
  std::vector<int8_t> q;
  std::vector<float> dx, sx, sxb;
  std::vector<int32_t> s, sb;
  vs::XQ xq;
  Quantised(const float* x, int R, int n) {
    const int64_t n64 = vs::padded64(n);
    q.resize(R * n64), dx.resize(R * n64 / 4), sx.resize(R * n64 / 4), s.resize(R * n64 / 4), sb.resize(R * n64 / 32), sxb.resize(R * n64 / 32);
    xq = vs::XQ{q.data(), dx.data(), sx.data(), s.data(), n64, sb.data(), sxb.data()};
    vs::quantize_rows(x, R, n, xq);
  }
  Quantised(const Quantised&) = delete;  // xq points into this one's arrays
};

// random blocks of format T: random bytes, then sane float16 scales where the format keeps them
template <int T>
static void check_format(const std::vector<float>& x, int R) {
  constexpr int E = vs::Format<T>::kElems, B = vs::Format<T>::kBytes;
  const int in = 2 * 256, outs = 11, nb = in / E;
  std::vector<uint8_t> w(outs * nb * B);
  for (auto& b : w) b = static_cast<uint8_t>(rnd() & 0xFF);
  auto f16 = [&](uint8_t* p) {  // 2^-5 .. 2^-4 with a random mantissa, random sign
    const unsigned h = 0x2800u | (rnd() & 0x3FF) | ((rnd() & 1) << 15);
    p[0] = h & 0xFF;
    p[1] = h >> 8;
  };
  for (int blk = 0; blk < outs * nb; ++blk) {
    uint8_t* b = w.data() + blk * B;
    if (T == vs::Q4_0 || T == vs::Q5_0 || T == vs::Q8_0) f16(b);
    if (T == vs::Q4_1 || T == vs::Q5_1 || T == vs::Q4_K || T == vs::Q5_K) { f16(b); f16(b + 2); }
    if (T == vs::Q6_K) f16(b + 208);
    if (T == vs::F16) for (int i = 0; i < E; ++i) f16(b + 2 * i);
    if (T == vs::BF16)  // finite values (NaN payloads are not part of the arithmetic's promise)
      for (int i = 0; i < E; ++i) {
        const unsigned h = 0x3C00u | (rnd() & 0xFF) | ((rnd() & 1) << 15);
        b[2 * i] = h & 0xFF;
        b[2 * i + 1] = h >> 8;
      }
  }
  const int64_t rb = nb * B;
  std::vector<float> row(in), y(R * outs);
  for (int o = 0; o < outs; ++o) {
    vs::unpack_row<T>(w.data() + o * rb, row.data(), in);
    out(row.data(), in);
  }
  for (int o = 0; o + 2 <= outs; o += 2) vs::products_q<T, 3, 2>(x.data(), w.data(), rb, y.data(), in, outs, o);
  vs::products_q<T, 3, 1>(x.data(), w.data(), rb, y.data(), in, outs, outs - 1);
  out(y.data(), 3 * outs);
  if constexpr (vs::Int8<T>::kDefined || vs::Tile<T>::kDefined) {  // int8 activations: whole rows, and (32-weight formats) 3 blocks, an odd count
    const int sizes[2] = {in, 96};
    for (int which = 0; which < (E == 32 ? 2 : 1); ++which) {
      const int n = sizes[which];
      const int64_t rbn = n / E * B;
      std::vector<float> xn(R * n);
      for (int r = 0; r < R; ++r) std::memcpy(xn.data() + r * n, x.data() + r * in, n * sizeof(float));
      const Quantised xr(xn.data(), R, n);
      const vs::XQ& xq = xr.xq;
      std::vector<uint8_t> wn(outs * rbn);
      for (int o = 0; o < outs; ++o) std::memcpy(wn.data() + o * rbn, w.data() + o * rb, rbn);
      if constexpr (vs::Tile<T>::kDefined) {  // per block (tile8.h, ktile8.h): 32 rows (the outputs repeated) as rows and as 2 tiles
        const int rows = 2 * vs::kTileRows;
        const int64_t tile_bytes = n / E * vs::Tile<T>::kTile;  // a tile (a K-quant's is larger than its 16 rows)
        std::vector<uint8_t> w32(rows * rbn), tiles(2 * tile_bytes);
        for (int o = 0; o < rows; ++o) std::memcpy(w32.data() + o * rbn, wn.data() + (o % outs) * rbn, rbn);
        for (int t = 0; t < 2; ++t) vs::tile_rows<T>(w32.data() + t * vs::kTileRows * rbn, rbn, n / E, tiles.data() + t * tile_bytes);
        constexpr int R6 = 6;  // 6 rows (x's rows repeated, the last two scaled): AMX where built with it
        std::vector<float> x6(R6 * n);
        for (int r = 0; r < R6; ++r)
          for (int i = 0; i < n; ++i) x6[r * n + i] = xn[(r % R) * n + i] * (r < R ? 1.0f : 0.5f + r);
        const Quantised x6q(x6.data(), R6, n);
        const vs::XQ& xq6 = x6q.xq;
        std::vector<float> y1(R6 * rows), y2(R6 * rows), y3(3 * rows);
        vs::block_range<T, R6>(xq6, w32.data(), y1.data(), n, rows, 0, rows);
        vs::tile_range<T, R6>(xq6, tiles.data(), y2.data(), n, rows, 0, 2);
        vs::tile_range<T, 3>(xq6, tiles.data(), y3.data(), n, rows, 0, 2);  // 3 rows: the dot instructions
        if (std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)) != 0 ||
            std::memcmp(y1.data(), y3.data(), y3.size() * sizeof(float)) != 0) {
          std::fprintf(stderr, "tiles differ from rows (format %d)\n", T);
          std::exit(1);
        }
        // 16 rows in one pass (quant.cpp's wide passes: the K-quants' tiles anywhere, the others
        // through AMX): the 6 rows again, scaled
        bool wide = E == 256;
#if defined(__AMX_INT8__)
        wide = wide || vs::amx_ready();
#endif
        if (wide) {
          constexpr int R16 = 16;
          std::vector<float> x16(R16 * n);
          for (int r = 0; r < R16; ++r)
            for (int i = 0; i < n; ++i) x16[r * n + i] = x6[(r % R6) * n + i] * (1.0f + 0.25f * (r / R6));
          const Quantised x16q(x16.data(), R16, n);
          const vs::XQ& xq16 = x16q.xq;
          std::vector<float> z1(R16 * rows), z2(R16 * rows);
          vs::block_range<T, R16>(xq16, w32.data(), z1.data(), n, rows, 0, rows);
          if constexpr (E == 256) vs::ktile_range<T, R16>(xq16, tiles.data(), z2.data(), n, rows, 0, 2);
#if defined(__AMX_INT8__)
          else vs::tile_range_amx<T, R16>(xq16, tiles.data(), z2.data(), n, rows, 0, 2);
#endif
          if (std::memcmp(z1.data(), z2.data(), z1.size() * sizeof(float)) != 0 ||
              std::memcmp(z1.data(), y1.data(), y1.size() * sizeof(float)) != 0) {
            std::fprintf(stderr, "16 rows in one pass differ from rows (format %d)\n", T);
            std::exit(1);
          }
        }
        out(y2.data(), R6 * rows);
      } else {
        for (int o = 0; o + 2 <= outs; o += 2) vs::products_i8<T, 3, 2>(xq, wn.data(), rbn, y.data(), n, outs, o);
        vs::products_i8<T, 3, 1>(xq, wn.data(), rbn, y.data(), n, outs, outs - 1);
        out(y.data(), 3 * outs);
      }
    }
  }
}

int main() {
  vs::FpMode mode;
  const int in = 77, outs = 13, R = 5;
  std::vector<float> x(R * in), w(outs * in), y(R * outs);
  for (auto& v : x) v = next();
  for (auto& v : w) v = next();
  for (int o = 0; o < outs; ++o) vs::products<R, 1>(x.data(), w.data(), y.data(), in, outs, o);
  out(y.data(), R * outs);
  float d = vs::dot(x.data(), w.data(), in);
  out(&d, 1);
  // D not whole vectors (24), whole ones (the blocked scores: sum_block) with values in registers (64, 128, 256)
  for (const auto& [D, S] : {std::pair<int, int>{24, 37}, {64, 37}, {256, 70}, {128, 18}, {64, 16}}) {
    std::vector<float> q(D), k(S * D), v(S * D), o(D), qs(D), scores(S);
    for (auto& a : q) a = 3 * next();
    for (auto& a : k) a = next();
    for (auto& a : v) a = next();
    vs::attend(q.data(), k.data(), v.data(), o.data(), 2, S - 1, D, 0.2f, qs.data(), scores.data());
    out(o.data(), D);
    // attend_many: four queries over the same keys, ranges apart; each must equal attend's
    std::vector<float> q3(4 * D), o3(4 * D), qs3(4 * D), s3(4 * S), one(D);
    for (auto& a : q3) a = 3 * next();
    const int64_t firsts[4] = {0, 2, 5, 0}, lasts[4] = {S - 1, S - 3, S / 2, S - 2};
    std::vector<vs::Query> queries;
    for (int i = 0; i < 4; ++i) queries.push_back({q3.data() + i * D, o3.data() + i * D, firsts[i], lasts[i], qs3.data() + i * D, s3.data() + i * S});
    vs::attend_many(queries.data(), 4, k.data(), v.data(), D, 0.2f);
    out(o3.data(), 4 * D);
    for (int i = 0; i < 4; ++i) {
      vs::attend(q3.data() + i * D, k.data(), v.data(), one.data(), firsts[i], lasts[i], D, 0.2f, qs.data(), scores.data());
      if (std::memcmp(one.data(), o3.data() + i * D, D * sizeof(float)) != 0) {
        std::fprintf(stderr, "attend_many differs from attend (D %d, query %d)\n", D, i);
        return 1;
      }
    }
    // a token tree's row (keys past start read along its path) beside a chain row: attend_slots' bits
    const int64_t tstart = S - 6, path[3] = {0, 2, 5};
    queries.resize(2);
    queries[0] = {q3.data(), o3.data(), 1, tstart + 2, qs3.data(), s3.data(), path, tstart};
    queries[1] = {q3.data() + D, o3.data() + D, 0, S - 1, qs3.data() + D, s3.data() + S};
    vs::attend_many(queries.data(), 2, k.data(), v.data(), D, 0.2f);
    out(o3.data(), 2 * D);
    vs::attend_slots(q3.data(), k.data(), v.data(), one.data(), 1, tstart + 2, D, 0.2f, qs.data(), scores.data(),
                     [&](int64_t j) { return j < tstart ? j : tstart + path[j - tstart]; });
    if (std::memcmp(one.data(), o3.data(), D * sizeof(float)) != 0) {
      std::fprintf(stderr, "attend_many differs from attend_slots on a tree row (D %d)\n", D);
      return 1;
    }
  }
  std::vector<float> g(50), u(50), m(50), n(50);
  for (int i = 0; i < 50; ++i) { g[i] = 8 * next(); u[i] = next(); }
  g[0] = -200.0f; g[1] = 200.0f; g[2] = -87.5f;
  vs::gated(g.data(), u.data(), m.data(), 50, false);
  out(m.data(), 50);
  vs::gated(g.data(), u.data(), m.data(), 50, true);
  out(m.data(), 50);
  vs::rmsnorm(g.data(), u.data(), n.data(), 50, 1e-6f);
  out(n.data(), 50);
  std::vector<float> xq(3 * 512);
  for (auto& a : xq) a = next();
  check_format<vs::F16>(xq, 3);
  check_format<vs::BF16>(xq, 3);
  check_format<vs::Q4_0>(xq, 3);
  check_format<vs::Q4_1>(xq, 3);
  check_format<vs::Q5_0>(xq, 3);
  check_format<vs::Q5_1>(xq, 3);
  check_format<vs::Q8_0>(xq, 3);
  check_format<vs::Q4_K>(xq, 3);
  check_format<vs::Q5_K>(xq, 3);
  check_format<vs::Q6_K>(xq, 3);
  return 0;
}
