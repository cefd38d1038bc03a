// Products, unpacking and row lookups over GGUF weight blocks kept as loaded (quant.h), and over
// weights stacked from parts of different formats (a fused q/k/v whose v is Q6_K beside Q4_K q
// and k, as Q4_K_M files have).
//
// A Weight is (parts, types): part p holds rows [o_p, o_p + rows_p) of the stacked matrix, as
// float32 [rows_p, in] (type F32) or as its blocks, uint8 [rows_p, row bytes]. Work split as in
// rows_mm (rowwise.cpp): threads take blocks of consecutive outputs of a part; every (output, row)
// pair is ops.h's dot over the unpacked weights, whatever R, the neighbours or the thread.
// A part's type with kInt8 added (types[p] + 256) asks for int8 activations (quant8.h): x is
// quantised once per call, and each (output, row) pair gets quant8.h's arithmetic instead, or for
// the 32-weight formats tile8.h's (over the file's rows, or over tiles of 16 rows: 3-D parts).
#include "rowwise.h"
#include "quant.h"
#include "quant8.h"
#include "tile8.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>
#include <vector>

namespace {

// outputs [b0 * OB, b1 * OB) of one part for rows x[0..R) (OB: outputs_per_block<R>), or with
// Tail, the single outputs [b0, b1). X: the rows as float32 (const float*), or quantised for
// int8 activations (const vs::XQ&: quant8.h's products)
template <int T, int R, bool Tail, class X>
void part_range(X x, const uint8_t* w, float* y, int64_t in, int64_t ldy, int64_t b0, int64_t b1) {
  constexpr int OB = vs::outputs_per_block<R>();
  constexpr bool int8 = std::is_same_v<X, const vs::XQ&>;
  if constexpr (T == vs::F32 && !int8) {
    const float* wf = reinterpret_cast<const float*>(w);
    for (int64_t b = b0; b < b1; ++b) {
      if constexpr (Tail) vs::products<R, 1>(x, wf, y, in, ldy, b);
      else vs::products<R, OB>(x, wf, y, in, ldy, b * OB);
    }
  } else {
    const auto products = [&](auto ob, auto short_rows, int64_t o0) {
      if constexpr (int8) vs::products_i8<T, R, decltype(ob)::value, decltype(short_rows)::value>(x, w, vs::row_bytes<T>(in), y, in, ldy, o0);
      else vs::products_q<T, R, decltype(ob)::value, decltype(short_rows)::value>(x, w, vs::row_bytes<T>(in), y, in, ldy, o0);
    };
    using One = std::integral_constant<int, 1>;
    using Block = std::integral_constant<int, OB>;
    // 32-weight blocks whose rows are short prefetch the next block of outputs in address order
    const bool short_rows = vs::Format<T>::kElems == 32 && vs::row_bytes<T>(in) * OB <= vs::kShortBlock;
    for (int64_t b = b0; b < b1; ++b) {
      if constexpr (Tail) products(One{}, std::false_type{}, b);
      else if (short_rows) products(Block{}, std::true_type{}, b * OB);
      else products(Block{}, std::false_type{}, b * OB);
    }
  }
}

template <int T, bool Tail, class X>
constexpr RangeFn<X> kRange[9] = {nullptr, part_range<T, 1, Tail, X>, part_range<T, 2, Tail, X>, part_range<T, 3, Tail, X>,
                                  part_range<T, 4, Tail, X>, part_range<T, 5, Tail, X>, part_range<T, 6, Tail, X>,
                                  part_range<T, 7, Tail, X>, part_range<T, 8, Tail, X>};

template <int T>
constexpr RangeFn<const vs::XQ&> kBlockRange[9] = {nullptr, vs::block_range<T, 1>, vs::block_range<T, 2>, vs::block_range<T, 3>,
                                                   vs::block_range<T, 4>, vs::block_range<T, 5>, vs::block_range<T, 6>,
                                                   vs::block_range<T, 7>, vs::block_range<T, 8>};
template <int T>
constexpr RangeFn<const vs::XQ&> kTileRange[9] = {nullptr, vs::tile_range<T, 1>, vs::tile_range<T, 2>, vs::tile_range<T, 3>,
                                                  vs::tile_range<T, 4>, vs::tile_range<T, 5>, vs::tile_range<T, 6>,
                                                  vs::tile_range<T, 7>, vs::tile_range<T, 8>};

// the K-quants' tiles for 9-16 rows in one pass, on every build (ktile8.h: the vector registers
// hold 16 rows' accumulators beside a sub-block's quants)
template <int T>
constexpr RangeFn<const vs::XQ&> kWideKTileRange[17] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                        vs::ktile_range<T, 9>, vs::ktile_range<T, 10>, vs::ktile_range<T, 11>,
                                                        vs::ktile_range<T, 12>, vs::ktile_range<T, 13>, vs::ktile_range<T, 14>,
                                                        vs::ktile_range<T, 15>, vs::ktile_range<T, 16>};

#if defined(__AMX_INT8__)
// tiles for 9-16 rows in one pass (AMX tiles hold 16 rows); the AMX path only (Product asks amx_ready first)
template <int T>
constexpr RangeFn<const vs::XQ&> kWideTileRange[17] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                       vs::tile_range_amx<T, 9>, vs::tile_range_amx<T, 10>, vs::tile_range_amx<T, 11>,
                                                       vs::tile_range_amx<T, 12>, vs::tile_range_amx<T, 13>, vs::tile_range_amx<T, 14>,
                                                       vs::tile_range_amx<T, 15>, vs::tile_range_amx<T, 16>};
#endif

constexpr int64_t kInt8 = 256;  // added to a part's type: int8 activations

int64_t base_type(int64_t type) { return type >= kInt8 ? type - kInt8 : type; }  // without the int8 flag

constexpr const char* kFormats = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K";

// a format's Props (rowwise.h), read from its vs::Format<T> (no unpacking for F32)
Props props(int64_t type) {
  Props p;
  const bool int8 = type >= kInt8;
  const bool known = vs::with_format(base_type(type), [&](auto t) {
    constexpr int T = decltype(t)::value;
    p.elems = vs::Format<T>::kElems;
    p.bytes = vs::Format<T>::kBytes;
    for (int R = 1; R <= 8; ++R) p.range[R] = kRange<T, false, const float*>[R], p.tail[R] = kRange<T, true, const float*>[R];
    if constexpr (T != vs::F32) p.unpack = vs::unpack_row<T>;
    if constexpr (vs::Int8<T>::kDefined)  // scales per group of 4 weights (quant8.h)
      if (int8)
        for (int R = 1; R <= 8; ++R) p.range8[R] = kRange<T, false, const vs::XQ&>[R], p.tail8[R] = kRange<T, true, const vs::XQ&>[R];
    if constexpr (vs::Tile<T>::kDefined)  // per block (tile8.h): outputs one at a time over the file's rows, or tiles
      if (int8) {
        p.tile_bytes = vs::Tile<T>::kTile;
        p.untile = vs::untile_row<T>;
        for (int R = 1; R <= 8; ++R) p.range8[R] = p.tail8[R] = kBlockRange<T>[R], p.tiles8[R] = kTileRange<T>[R];
        if constexpr (vs::Tile<T>::kElems == 256) {
          for (int R = 9; R <= 16; ++R) p.tiles8[R] = kWideKTileRange<T>[R];
          p.wide_anywhere = true;
        }
#if defined(__AMX_INT8__)
        if constexpr (vs::Tile<T>::kElems == 32)  // AMX passes: the 32-weight formats' tiles
          for (int R = 9; R <= 16; ++R) p.tiles8[R] = kWideTileRange<T>[R];
#endif
      }
  });
  TORCH_CHECK(known, "weight format ", type, " is not supported (", kFormats, ", plus ", kInt8, " for int8 activations)");
  TORCH_CHECK(!int8 || p.range8[1] != nullptr, "weight format ", type - kInt8, " has no int8-activation products (quant8.h)");
  return p;
}

constexpr int kOB[9] = {0, vs::outputs_per_block<1>(), vs::outputs_per_block<2>(), vs::outputs_per_block<3>(), vs::outputs_per_block<4>(),
                        vs::outputs_per_block<5>(), vs::outputs_per_block<6>(), vs::outputs_per_block<7>(), vs::outputs_per_block<8>()};

// a part's rows (a tiled part holds 16 per tile)
int64_t part_rows(const at::Tensor& t) { return t.dim() == 3 ? t.size(0) * vs::kTileRows : t.size(0); }

// the checked part of a weight over `in` columns, of format `type` (its properties f): its bytes
const uint8_t* part_data(const at::Tensor& t, int64_t type, const Props& f, int64_t in) {
  TORCH_CHECK(in % f.elems == 0, "weight format ", type, ": ", in, " columns are not whole blocks of ", f.elems);
  if (t.dim() == 3) {  // tiles (tile8.h)
    TORCH_CHECK(f.blockwise(), "a tiled part (3-D) must be a format with tiles (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K) with int8 "
                "activations (type + ", 256, "), got type ", type);
    TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == at::kByte && t.size(1) == in / f.elems &&
                    t.size(2) == f.tile_bytes,
                "a tiled part over ", in, " columns must be contiguous uint8 [tiles, ", in / f.elems, ", ", f.tile_bytes, "], got ",
                t.scalar_type(), " ", t.sizes());
    return t.data_ptr<uint8_t>();
  }
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 2 && t.is_contiguous(), "weight parts: contiguous 2-D CPU tensors");
  if (type == vs::F32) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.size(1) == in, "a float32 part must be [rows, ", in, "], got ", t.sizes());
    return reinterpret_cast<const uint8_t*>(t.data_ptr<float>());
  }
  TORCH_CHECK(t.scalar_type() == at::kByte && t.size(1) == in / f.elems * f.bytes,
              "a part of format ", type, " over ", in, " columns must be uint8 [rows, ", in / f.elems * f.bytes, "], got ",
              t.scalar_type(), " ", t.sizes());
  return t.data_ptr<uint8_t>();
}

}  // namespace

int64_t weight_rows(const Weight& w) {
  int64_t n = 0;
  for (const auto& t : std::get<0>(w)) n += part_rows(t);
  return n;
}

WeightParts::WeightParts(const Weight& w, int64_t in) : keep_(w), in_(in) {
  const auto& [parts, types] = keep_;
  TORCH_CHECK(!parts.empty() && parts.size() == types.size(), "weight_mm: one type per part");
  for (size_t p = 0; p < parts.size(); ++p) {
    Part part{props(types[p]), nullptr, part_rows(parts[p]), out_, parts[p].dim() == 3};
    part.data = part_data(parts[p], base_type(types[p]), part.f, in);
    int8_ = int8_ || part.f.range8[1] != nullptr;
    wide_ = wide_ && part.tiled && part.f.tiles8[16] != nullptr;
    wide_anywhere_ = wide_anywhere_ && part.tiled && part.f.wide_anywhere;
    out_ += part.rows;
    parts_.push_back(part);
  }
}

int64_t WeightParts::pass_rows() const {
  if (wide_anywhere_) return 16;
#if defined(__AMX_INT8__)
  if (wide_ && vs::amx_ready()) return 16;
#endif
  return 8;
}

QuantRows::QuantRows(int64_t R, int64_t in) : in_(in), n64_(vs::padded64(in)) {
  q_.resize(R * n64_), dx_.resize(R * n64_ / 4), sx_.resize(R * n64_ / 4), s_.resize(R * n64_ / 4);
  sb_.resize(R * n64_ / 32), sxb_.resize(R * n64_ / 32);
}

void QuantRows::quantize(const float* x, int64_t r0, int64_t r1) {
  if (r0 >= r1) return;
  vs::FpMode mode;
  vs::quantize_rows(x + r0 * in_, r1 - r0, in_, from(r0));
}

vs::XQ QuantRows::from(int64_t r0) const {
  const int64_t g = n64_ / 4, b = n64_ / 32;
  return vs::XQ{const_cast<int8_t*>(q_.data()) + r0 * n64_, const_cast<float*>(dx_.data()) + r0 * g,
                const_cast<float*>(sx_.data()) + r0 * g, const_cast<int32_t*>(s_.data()) + r0 * g, n64_,
                const_cast<int32_t*>(sb_.data()) + r0 * b, const_cast<float*>(sxb_.data()) + r0 * b};
}

Product::Product(const float* x, int64_t R, const WeightParts& w, float* y, const QuantRows* xq)
    : x_(x), y_(y), R_(R), w_(w), xq_(xq) {
  if (w.int8_ && !xq_) {  // int8 activations: every row of x quantised once (quant8.h)
    own_.emplace(R, w.in_);
    own_->quantize(x, 0, R);
    xq_ = &*own_;
  }
}

void Product::share(int64_t t, int64_t n) const {
  const int64_t pass = w_.pass_rows();
  for (int64_t r0 = 0; r0 < R_; r0 += pass) {  // 8 or 16 rows per pass over the weights
    const int rn = static_cast<int>(R_ - r0 < pass ? R_ - r0 : pass);
    const int64_t in = w_.in_, out = w_.out_;
    const float* xr = x_ + r0 * in;
    float* yr = y_ + r0 * out;
    const vs::XQ xq = xq_ ? xq_->from(r0) : vs::XQ{};
    // outputs a block: a tile's 16, one for tile8.h's arithmetic over the file's rows, else ops.h's blocking
    const auto per_block = [&](const auto& p) -> int64_t { return p.tiled ? vs::kTileRows : p.f.blockwise() ? 1 : kOB[rn]; };
    // every part's whole output blocks as one range (a fused q/k/v split once, not three times),
    // at least 8 blocks a thread
    int64_t blocks = 0;
    for (const auto& p : w_.parts_) blocks += p.rows / per_block(p);
    const int64_t used = std::clamp<int64_t>(blocks / 8, 1, n);
    if (t >= used) continue;
    const int64_t b0 = blocks * t / used, b1 = blocks * (t + 1) / used;
    int64_t first_block = 0;
    for (const auto& p : w_.parts_) {
      const int64_t nb = p.rows / per_block(p), lo = std::max(b0, first_block), hi = std::min(b1, first_block + nb);
      if (lo < hi) {
        if (p.tiled) p.f.tiles8[rn](xq, p.data, yr + p.first_out, in, out, lo - first_block, hi - first_block);
        else if (p.f.range8[rn]) p.f.range8[rn](xq, p.data, yr + p.first_out, in, out, lo - first_block, hi - first_block);
        else p.f.range[rn](xr, p.data, yr + p.first_out, in, out, lo - first_block, hi - first_block);
      }
      first_block += nb;
    }
    if (t != used - 1) continue;
    for (const auto& p : w_.parts_) {  // the outputs past the whole blocks, one at a time
      const int64_t done = p.rows / per_block(p) * per_block(p);
      if (done < p.rows && p.f.range8[rn]) p.f.tail8[rn](xq, p.data, yr + p.first_out, in, out, done, p.rows);
      else if (done < p.rows) p.f.tail[rn](xr, p.data, yr + p.first_out, in, out, done, p.rows);
    }
  }
}

at::Tensor weight_mm(at::Tensor x, const Weight& w) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "weight_mm: x must be float32 [R, in] on the CPU");
  x = x.contiguous();
  const WeightParts parts(w, x.size(1));
  auto y = at::empty({x.size(0), parts.rows()}, x.options());
  const Product product(x.data_ptr<float>(), x.size(0), parts, y.data_ptr<float>());
  const int64_t n = at::get_num_threads();
  at::parallel_for(0, n, 1, [&](int64_t t0, int64_t t1) {
    vs::FpMode mode;
    for (int64_t t = t0; t < t1; ++t) product.share(t, n);
  });
  return y;
}

// one block part's rows unpacked to float32 (each value exactly gguf-py's dequantisation); a tiled
// part's row is first put back into the file's bytes (in buf)
class RowUnpacker {
 public:
  RowUnpacker(const at::Tensor& t, int64_t type, int64_t in) : f_(props(type)), in_(in), tiled_(t.dim() == 3) {
    data_ = part_data(t, base_type(type), f_, in);
    rb_ = in / f_.elems * f_.bytes;
  }
  void operator()(int64_t r, float* out, std::vector<uint8_t>& buf) const {
    if (!tiled_) return f_.unpack(data_ + r * rb_, out, in_);
    buf.resize(rb_);
    f_.untile(data_, r, in_ / f_.elems, buf.data());
    f_.unpack(buf.data(), out, in_);
  }

 private:
  Props f_;
  int64_t in_, rb_;
  bool tiled_;
  const uint8_t* data_;
};

// the whole stacked matrix as float32 [rows, in]: each value exactly gguf-py's dequantisation
at::Tensor dequantize(const Weight& w, int64_t in) {
  const auto& [parts, types] = w;
  auto out = at::empty({weight_rows(w), in}, at::dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  int64_t o0 = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const int64_t rows = part_rows(parts[p]);
    if (types[p] == vs::F32) {
      out.narrow(0, o0, rows).copy_(parts[p]);
    } else {
      const RowUnpacker unpack(parts[p], types[p], in);
      at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
        std::vector<uint8_t> buf;
        for (int64_t r = r0; r < r1; ++r) unpack(r, op + (o0 + r) * in, buf);
      });
    }
    o0 += rows;
  }
  return out;
}

// rows ids of the stacked matrix as float32 [n, in] (an embedding lookup)
at::Tensor take_rows(const Weight& w, int64_t in, at::Tensor ids) {
  const auto& [parts, types] = w;
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "take_rows: ids must be int64 [n]");
  ids = ids.contiguous();
  const int64_t n = ids.size(0), total = weight_rows(w);
  auto out = at::empty({n, in}, at::dtype(at::kFloat));
  const int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = ip[i];
    TORCH_CHECK(r >= 0 && r < total, "take_rows: id ", r, " out of range [0, ", total, ")");
    size_t p = 0;
    while (r >= part_rows(parts[p])) r -= part_rows(parts[p++]);
    float* o = out.data_ptr<float>() + i * in;
    if (types[p] == vs::F32) {
      std::memcpy(o, parts[p].data_ptr<float>() + r * in, in * sizeof(float));
    } else {
      std::vector<uint8_t> buf;
      RowUnpacker(parts[p], types[p], in)(r, o, buf);
    }
  }
  return out;
}

at::Tensor tile_weight(at::Tensor part, int64_t type) {
  TORCH_CHECK(part.device().is_cpu() && part.dim() == 2 && part.is_contiguous() && part.scalar_type() == at::kByte,
              "tile_weight: a contiguous uint8 [rows, row bytes] part");
  at::Tensor out;
  const bool known = vs::with_tile_format(type, [&](auto t) {
    constexpr int T = decltype(t)::value;
    using F = vs::Tile<T>;
    const int64_t rows = part.size(0), rb = part.size(1), nb = rb / F::kBytes;
    TORCH_CHECK(rb % F::kBytes == 0 && rows % vs::kTileRows == 0,
                "tile_weight: rows must be a multiple of ", vs::kTileRows, " and row bytes of ", F::kBytes, ", got ", part.sizes());
    out = at::empty({rows / vs::kTileRows, nb, F::kTile}, at::dtype(at::kByte));
    const uint8_t* src = part.data_ptr<uint8_t>();
    uint8_t* dst = out.data_ptr<uint8_t>();
    at::parallel_for(0, rows / vs::kTileRows, 16, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) vs::tile_rows<T>(src + t * vs::kTileRows * rb, rb, nb, dst + t * nb * F::kTile);
    });
  });
  TORCH_CHECK(known, "tile_weight: type ", type, " has no tiles (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K do)");
  return out;
}
