// Suffix decoding's chain search (suffix.h): TokenIndex.best and _walk of proposers/suffix.py,
// rule for rule, so both give the same draft; the arithmetic is Python's (doubles, the same
// operations in the same order).
#include "suffix.h"

#include <algorithm>
#include <utility>

namespace vs {
namespace {

constexpr int32_t kEnd = -1;

// _walk: the most frequent next token of the rows still agreeing (ties: the token of the most
// recent occurrence, i.e. the first met reading the rows newest first) while the path's
// probability stays at or above min_token_prob. rows: [n][k] continuations; level: the rows of
// this match level, oldest first.
SuffixDraft walk(const std::vector<int32_t>& rows, int64_t k, std::vector<int64_t> level, int64_t n_tokens,
                 double min_token_prob) {
  SuffixDraft out;
  std::vector<std::pair<int32_t, int64_t>> counts;  // (token, count) in the order first met
  double prob = 1.0;
  for (int64_t s = 0; s < n_tokens && !level.empty(); ++s) {
    counts.clear();
    for (auto it = level.rbegin(); it != level.rend(); ++it) {
      const int32_t t = rows[*it * k + s];
      if (t == kEnd) continue;
      auto c = std::find_if(counts.begin(), counts.end(), [t](const auto& tc) { return tc.first == t; });
      if (c == counts.end()) counts.emplace_back(t, 1);
      else ++c->second;
    }
    if (counts.empty()) break;
    auto top = counts.begin();  // the first largest count
    for (auto c = counts.begin(); c != counts.end(); ++c)
      if (c->second > top->second) top = c;
    prob *= static_cast<double>(top->second) / static_cast<double>(level.size());
    if (prob < min_token_prob) break;
    out.tokens.push_back(top->first);
    out.probs.push_back(prob);
    const int32_t token = top->first;
    level.erase(std::remove_if(level.begin(), level.end(), [&](int64_t r) { return rows[r * k + s] != token; }),
                level.end());
  }
  return out;
}

// Candidate.rank of a chain: the sum of its first match_len path probabilities
double chain_rank(const SuffixDraft& d, int64_t match_len) {
  double total = 0.0;
  for (size_t i = 0; i < d.probs.size(); ++i)
    if (static_cast<int64_t>(i) + 1 <= match_len) total += d.probs[i];
  return total;
}

}  // namespace

SuffixDraft suffix_best_chain(const int32_t* toks, int64_t n_toks, const int64_t* pos, int64_t n,
                              const int32_t* tail, int64_t depth, int64_t k, int64_t live_from,
                              double max_spec_factor, double min_token_prob, double beat, int64_t max_levels) {
  SuffixDraft best;
  if (n <= 0 || k < 1) return best;
  // each occurrence's match length (tokens of the tail ending at it) and continuation [k]
  std::vector<int64_t> lv(n);
  std::vector<int32_t> rows(n * k);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = pos[i];
    int64_t m = 0;
    while (m < depth && p - m >= live_from && toks[p - m] == tail[depth - 1 - m]) ++m;
    lv[i] = m;
    for (int64_t j = 0; j < k; ++j) rows[i * k + j] = p + 1 + j < n_toks ? toks[p + 1 + j] : kEnd;
  }
  std::vector<int64_t> levels(lv);
  std::sort(levels.begin(), levels.end(), std::greater<int64_t>());
  levels.erase(std::unique(levels.begin(), levels.end()), levels.end());
  if (static_cast<int64_t>(levels.size()) > max_levels) levels.resize(max_levels);
  double best_rank = -1.0;
  for (const int64_t L : levels) {
    const int64_t n_tokens = std::min(k, static_cast<int64_t>(static_cast<double>(L) * max_spec_factor + 1e-6));
    if (n_tokens < 1 || static_cast<double>(std::min(L, n_tokens)) + 1e-6 <= std::max(beat, best_rank)) continue;
    std::vector<int64_t> level;
    for (int64_t i = 0; i < n; ++i)
      if (lv[i] >= L) level.push_back(i);
    SuffixDraft c = walk(rows, k, std::move(level), n_tokens, min_token_prob);
    const double rank = c.tokens.empty() ? -1.0 : chain_rank(c, L);
    if (rank > best_rank) {
      best = std::move(c);
      best.match_len = L;
      best_rank = rank;
    }
  }
  return best;
}

}  // namespace vs
