// Suffix decoding's chain search (proposers/suffix.py, TokenIndex.best for chains) in C++: the
// same drafts as the Python walk, which stays as the reference (tests compare the two) and as the
// path where the compiled module is not loaded. Plain C++: no ATen, no SIMD (it reads a few dozen
// short rows), so every variant compiles it alike.
#pragma once

#include <cstdint>
#include <vector>

namespace vs {

struct SuffixDraft {
  std::vector<int32_t> tokens;
  std::vector<double> probs;  // each token's path probability
  int64_t match_len = 0;      // 0: no draft
};

// The best chain of up to k tokens continuing `tail` (its last `depth` tokens: tail[depth - 1] is
// the newest) from the occurrences `pos[0..n)` (positions in `toks` of the tail's last token,
// oldest first) of an index whose positions below `live_from` are evicted. END (-1) ends a
// document; positions past `n_toks` read as END. Levels: the distinct match lengths, longest
// first, at most `max_levels`; a level whose best possible rank cannot exceed `beat` (or the best
// so far) is skipped. See suffix.py's TokenIndex.best and _walk for the rules, ties included.
SuffixDraft suffix_best_chain(const int32_t* toks, int64_t n_toks, const int64_t* pos, int64_t n,
                              const int32_t* tail, int64_t depth, int64_t k, int64_t live_from,
                              double max_spec_factor, double min_token_prob, double beat, int64_t max_levels);

}  // namespace vs
