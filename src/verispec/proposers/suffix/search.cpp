// Suffix decoding's search (search.h): TokenIndex.best, _walk and _grow of proposers/suffix/index.py,
// rule for rule, so both give the same draft; the arithmetic is Python's (doubles, the same
// operations in the same order).
#include "search.h"

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

// _grow: a tree of up to max_nodes nodes, `depth` deep, best first (the highest path probability,
// then the most recent occurrence, then the first pushed), parents before children.
SuffixDraft grow(const std::vector<int32_t>& rows, int64_t k, std::vector<int64_t> level, int64_t depth,
                 int64_t max_nodes, double min_token_prob) {
  struct Entry {
    double p;
    int64_t latest, order;
    int32_t token;
    int64_t parent, s;
    std::vector<int64_t> agreeing;
  };
  // the heap's top is the smallest (-p, -latest, order), as Python's heapq over those tuples
  auto after = [](const Entry& a, const Entry& b) {
    if (a.p != b.p) return a.p < b.p;
    if (a.latest != b.latest) return a.latest < b.latest;
    return a.order > b.order;
  };
  std::vector<Entry> heap;
  int64_t order = 0;
  SuffixDraft out;
  std::vector<std::pair<int32_t, std::pair<int64_t, int64_t>>> counts;  // token -> (count, latest), first met first
  auto expand = [&](int64_t node, int64_t s, const std::vector<int64_t>& from, double prob) {
    if (s >= depth) return;
    counts.clear();
    for (const int64_t r : from) {  // oldest first
      const int32_t t = rows[r * k + s];
      if (t == kEnd) continue;
      auto c = std::find_if(counts.begin(), counts.end(), [t](const auto& tc) { return tc.first == t; });
      if (c == counts.end()) counts.push_back({t, {1, r}});
      else c->second = {c->second.first + 1, r};
    }
    for (const auto& [token, cl] : counts) {
      const double p = prob * static_cast<double>(cl.first) / static_cast<double>(from.size());
      if (p < min_token_prob) continue;
      Entry e{p, cl.second, order++, token, node, s, {}};
      for (const int64_t r : from)
        if (rows[r * k + s] == token) e.agreeing.push_back(r);
      heap.push_back(std::move(e));
      std::push_heap(heap.begin(), heap.end(), after);
    }
  };
  expand(-1, 0, level, 1.0);
  while (!heap.empty() && static_cast<int64_t>(out.tokens.size()) < max_nodes) {
    std::pop_heap(heap.begin(), heap.end(), after);
    Entry e = std::move(heap.back());
    heap.pop_back();
    out.tokens.push_back(e.token);
    out.parents.push_back(e.parent);
    out.probs.push_back(e.p);
    expand(static_cast<int64_t>(out.tokens.size()) - 1, e.s + 1, e.agreeing, e.p);
  }
  return out;
}

// Candidate.rank: the sum of the main path's path probabilities (each node's likeliest child from
// the root: a chain's every token) no deeper than match_len
double rank_of(const SuffixDraft& d, int64_t match_len) {
  double total = 0.0;
  int64_t at = -1, depth = 0;
  for (size_t i = 0; i < d.probs.size(); ++i) {
    const int64_t parent = d.parents.empty() ? static_cast<int64_t>(i) - 1 : d.parents[i];
    if (parent == at) {
      at = static_cast<int64_t>(i);
      ++depth;
      if (depth <= match_len) total += d.probs[i];
    }
  }
  return total;
}

}  // namespace

SuffixDraft suffix_best(const int32_t* toks, int64_t n_toks, const int64_t* pos, int64_t n, const int32_t* tail,
                        int64_t depth, int64_t k, int64_t live_from, double max_spec_factor, double min_token_prob,
                        double beat, int64_t max_levels, int64_t max_nodes) {
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
    SuffixDraft c = max_nodes > 0 ? grow(rows, k, std::move(level), n_tokens, max_nodes, min_token_prob)
                                  : walk(rows, k, std::move(level), n_tokens, min_token_prob);
    const double rank = c.tokens.empty() ? -1.0 : rank_of(c, L);
    if (rank > best_rank) {
      best = std::move(c);
      best.match_len = L;
      best_rank = rank;
    }
  }
  return best;
}

}  // namespace vs
