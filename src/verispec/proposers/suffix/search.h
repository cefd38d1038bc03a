// Suffix decoding's search (proposers/suffix/index.py, TokenIndex.best) in C++: the same drafts as the
// Python walk and tree growth, which stays as the reference (tests compare the two) and as the
// path where the compiled module cannot be built. Plain C++: no ATen, no SIMD (it reads a few dozen
// short rows), its own small module (native.py).
#pragma once

#include <cstdint>
#include <vector>

namespace vs {

struct SuffixDraft {
  std::vector<int32_t> tokens;
  std::vector<double> probs;     // each node's path probability
  std::vector<int64_t> parents;  // a tree's: each node's parent, -1 = the root (empty: a chain)
  int64_t match_len = 0;      // 0: no draft
};

// The best draft continuing `tail`: a chain of up to k tokens, or (max_nodes > 0) a tree of up to
// max_nodes nodes k deep, (its last `depth` tokens: tail[depth - 1] is
// the newest) from the occurrences `pos[0..n)` (positions in `toks` of the tail's last token,
// oldest first) of an index whose positions below `live_from` are evicted. END (-1) ends a
// document; positions past `n_toks` read as END. Levels: the distinct match lengths, longest
// first, at most `max_levels`; a level whose best possible rank cannot exceed `beat` (or the best
// so far) is skipped. See suffix.py's TokenIndex.best, _walk and _grow for the rules, ties included.
SuffixDraft suffix_best(const int32_t* toks, int64_t n_toks, const int64_t* pos, int64_t n, const int32_t* tail,
                        int64_t depth, int64_t k, int64_t live_from, double max_spec_factor, double min_token_prob,
                        double beat, int64_t max_levels, int64_t max_nodes);

}  // namespace vs
