// Products, unpacking and row lookups over GGUF weight blocks kept as loaded (quant.h), and over
// weights stacked from parts of different formats (a fused q/k/v whose v is Q6_K beside Q4_K q
// and k, as Q4_K_M files have).
//
// A Weight is (parts, types): part p holds rows [o_p, o_p + rows_p) of the stacked matrix, as
// float32 [rows_p, in] (type F32) or as its blocks, uint8 [rows_p, row bytes]. Work split as in
// rows_mm (rowwise.cpp): threads take blocks of consecutive outputs of a part; every (output, row)
// pair is ops.h's dot over the unpacked weights, whatever R, the neighbours or the thread.
// A part's type with kInt8 added (types[p] + 256) asks for int8 activations (quant8.h): x is
// quantised once per call, and each (output, row) pair gets quant8.h's arithmetic instead.
#include "rowwise.h"
#include "quant.h"
#include "quant8.h"

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

template <class X>
using RangeFn = void (*)(X, const uint8_t*, float*, int64_t, int64_t, int64_t, int64_t);

template <int T, bool Tail, class X>
constexpr RangeFn<X> kRange[9] = {nullptr, part_range<T, 1, Tail, X>, part_range<T, 2, Tail, X>, part_range<T, 3, Tail, X>,
                                  part_range<T, 4, Tail, X>, part_range<T, 5, Tail, X>, part_range<T, 6, Tail, X>,
                                  part_range<T, 7, Tail, X>, part_range<T, 8, Tail, X>};

constexpr int64_t kInt8 = 256;  // added to a part's type: int8 activations

int64_t base_type(int64_t type) { return type >= kInt8 ? type - kInt8 : type; }  // without the int8 flag

constexpr const char* kFormats = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K";

// a format's properties, read from its vs::Format<T>: weights and bytes per block, the range and
// tail products for R rows, the row unpacking (none for F32)
struct Props {
  int64_t elems = 0, bytes = 0;
  RangeFn<const float*> range[9] = {}, tail[9] = {};
  RangeFn<const vs::XQ&> range8[9] = {}, tail8[9] = {};  // int8 activations (formats quant8.h defines)
  void (*unpack)(const uint8_t*, float*, int64_t) = nullptr;
};

Props props(int64_t type) {
  Props p;
  const bool int8 = type >= kInt8;
  const bool known = vs::with_format(base_type(type), [&](auto t) {
    constexpr int T = decltype(t)::value;
    p.elems = vs::Format<T>::kElems;
    p.bytes = vs::Format<T>::kBytes;
    for (int R = 1; R <= 8; ++R) p.range[R] = kRange<T, false, const float*>[R], p.tail[R] = kRange<T, true, const float*>[R];
    if constexpr (T != vs::F32) p.unpack = vs::unpack_row<T>;
    if constexpr (vs::Int8<T>::kDefined)
      if (int8)
        for (int R = 1; R <= 8; ++R) p.range8[R] = kRange<T, false, const vs::XQ&>[R], p.tail8[R] = kRange<T, true, const vs::XQ&>[R];
  });
  TORCH_CHECK(known, "weight format ", type, " is not supported (", kFormats, ", plus ", kInt8, " for int8 activations)");
  TORCH_CHECK(!int8 || p.range8[1] != nullptr, "weight format ", type - kInt8, " has no int8-activation products (quant8.h)");
  return p;
}

constexpr int kOB[9] = {0, vs::outputs_per_block<1>(), vs::outputs_per_block<2>(), vs::outputs_per_block<3>(), vs::outputs_per_block<4>(),
                        vs::outputs_per_block<5>(), vs::outputs_per_block<6>(), vs::outputs_per_block<7>(), vs::outputs_per_block<8>()};

// the checked part of a weight over `in` columns, of format `type` (its properties f): its bytes
const uint8_t* part_data(const at::Tensor& t, int64_t type, const Props& f, int64_t in) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 2 && t.is_contiguous(), "weight parts: contiguous 2-D CPU tensors");
  TORCH_CHECK(in % f.elems == 0, "weight format ", type, ": ", in, " columns are not whole blocks of ", f.elems);
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
  for (const auto& t : std::get<0>(w)) n += t.size(0);
  return n;
}

at::Tensor weight_mm(at::Tensor x, const Weight& w) {
  const auto& [parts, types] = w;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "weight_mm: x must be float32 [R, in] on the CPU");
  TORCH_CHECK(!parts.empty() && parts.size() == types.size(), "weight_mm: one type per part");
  x = x.contiguous();
  const int64_t R = x.size(0), in = x.size(1), out = weight_rows(w);
  const size_t P = parts.size();
  auto y = at::empty({R, out}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  std::vector<Props> f(P);
  std::vector<const uint8_t*> data(P);
  std::vector<int64_t> first_out(P + 1, 0);
  bool int8 = false;
  for (size_t p = 0; p < P; ++p) {
    f[p] = props(types[p]);
    data[p] = part_data(parts[p], base_type(types[p]), f[p], in);
    first_out[p + 1] = first_out[p] + parts[p].size(0);
    int8 = int8 || f[p].range8[1] != nullptr;
  }
  // int8 activations: every row of x quantised once (quant8.h)
  const int64_t n64 = vs::padded64(in);
  std::vector<int8_t> xq_q(int8 ? R * n64 : 0);
  std::vector<float> xq_dx(int8 ? R * n64 / 4 : 0), xq_sx(xq_dx.size());
  std::vector<int32_t> xq_s(xq_dx.size());
  if (int8) {
    vs::FpMode mode;
    vs::quantize_rows(xp, R, in, vs::XQ{xq_q.data(), xq_dx.data(), xq_sx.data(), xq_s.data(), n64});
  }
  for (int64_t r0 = 0; r0 < R; r0 += 8) {  // 8 rows per pass over the weights
    const int n = static_cast<int>(R - r0 < 8 ? R - r0 : 8);
    const float* xr = xp + r0 * in;
    float* yr = yp + r0 * out;
    const vs::XQ xq{xq_q.data() + r0 * n64, xq_dx.data() + r0 * n64 / 4, xq_sx.data() + r0 * n64 / 4, xq_s.data() + r0 * n64 / 4, n64};
    // one parallel region over every part's whole output blocks (a fused q/k/v is one region,
    // not three: each region costs a wake-up and a barrier)
    std::vector<int64_t> first_block(P + 1, 0);
    for (size_t p = 0; p < P; ++p) first_block[p + 1] = first_block[p] + parts[p].size(0) / kOB[n];
    at::parallel_for(0, first_block[P], 8, [&](int64_t b0, int64_t b1) {
      vs::FpMode mode;
      for (size_t p = 0; p < P; ++p) {
        const int64_t lo = std::max(b0, first_block[p]), hi = std::min(b1, first_block[p + 1]);
        if (lo >= hi) continue;
        if (f[p].range8[n]) f[p].range8[n](xq, data[p], yr + first_out[p], in, out, lo - first_block[p], hi - first_block[p]);
        else f[p].range[n](xr, data[p], yr + first_out[p], in, out, lo - first_block[p], hi - first_block[p]);
      }
    });
    vs::FpMode mode;
    for (size_t p = 0; p < P; ++p) {
      const int64_t rows = parts[p].size(0), done = rows / kOB[n] * kOB[n];
      if (done < rows && f[p].range8[n]) f[p].tail8[n](xq, data[p], yr + first_out[p], in, out, done, rows);
      else if (done < rows) f[p].tail[n](xr, data[p], yr + first_out[p], in, out, done, rows);
    }
  }
  return y;
}

// the whole stacked matrix as float32 [rows, in]: each value exactly gguf-py's dequantisation
at::Tensor dequantize(const Weight& w, int64_t in) {
  const auto& [parts, types] = w;
  auto out = at::empty({weight_rows(w), in}, at::dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  int64_t o0 = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const int64_t type = base_type(types[p]);  // (the arithmetic flag does not matter here)
    const Props f = props(type);
    const uint8_t* wp = part_data(parts[p], type, f, in);
    const int64_t rows = parts[p].size(0);
    if (type == vs::F32) {
      out.narrow(0, o0, rows).copy_(parts[p]);
    } else {
      const auto unpack = f.unpack;
      const int64_t rb = parts[p].size(1);
      at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) unpack(wp + r * rb, op + (o0 + r) * in, in);
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
    while (r >= parts[p].size(0)) r -= parts[p++].size(0);
    const int64_t type = base_type(types[p]);  // (the arithmetic flag does not matter here)
    const Props f = props(type);
    const uint8_t* wp = part_data(parts[p], type, f, in);
    float* o = out.data_ptr<float>() + i * in;
    if (type == vs::F32) {
      std::memcpy(o, reinterpret_cast<const float*>(wp) + r * in, in * sizeof(float));
    } else {
      f.unpack(wp + r * parts[p].size(1), o, in);
    }
  }
  return out;
}
