// The Python module over suffix decoding's search (search.h): pybind11 only, no ATen, so it
// builds in seconds.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <vector>

#include "search.h"

namespace {

// search.h's search over a TokenIndex's buffers: tokens (array('i')), the positions of the tail's
// last bigram or token (array('q')) from lo to hi; (tokens, probs, match length, parents or None) or None
pybind11::object suffix_best(pybind11::buffer tokens, pybind11::buffer positions, int64_t lo, int64_t hi,
                             const std::vector<int32_t>& tail, int64_t k, int64_t live_from, double max_spec_factor,
                             double min_token_prob, double beat, int64_t max_levels, int64_t max_nodes) {
  const pybind11::buffer_info t = tokens.request(), p = positions.request();
  if (t.ndim != 1 || t.itemsize != 4 || p.ndim != 1 || p.itemsize != 8)
    throw pybind11::value_error("suffix_best: want int32 tokens and int64 positions, one dimension each");
  if (lo < 0 || hi > p.shape[0] || lo > hi || live_from < 0)
    throw pybind11::value_error("suffix_best: positions [lo, hi) out of range");
  const vs::SuffixDraft d =
      vs::suffix_best(static_cast<const int32_t*>(t.ptr), t.shape[0], static_cast<const int64_t*>(p.ptr) + lo, hi - lo,
                      tail.data(), static_cast<int64_t>(tail.size()), k, live_from, max_spec_factor, min_token_prob, beat,
                      max_levels, max_nodes);
  if (d.match_len == 0) return pybind11::none();
  return pybind11::make_tuple(d.tokens, d.probs, d.match_len,
                              max_nodes > 0 ? pybind11::cast(d.parents) : pybind11::object(pybind11::none()));
}

}  // namespace


PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("suffix_best", &suffix_best);  // short: holds the GIL (it reads Python's buffers)
}
