"""Suffix decoding's index and search: `TokenIndex` holds documents of token ids and where every
bigram and token occurs; `best` finds the best draft continuing a context's tail (the rules: the
package's docstring), in C++ where the search module is built (native.py, search.cpp), else by the
Python walk (`_walk`) and tree growth (`_grow`) below, the reference (a test compares the two)."""

from __future__ import annotations

import heapq
import itertools
from array import array
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass

import numpy as np

from verispec.proposers.suffix import native

END = -1  # after each document: no occurrence continues past it
MAX_CANDIDATES = 64  # most recent occurrences of the tail's last bigram considered
MAX_LEVELS = 4  # match levels walked per source (the longest ones)
# Up to this many occurrences are gathered in plain Python, more with numpy: numpy's fixed cost
# pays only past a few occurrences (docs/design/suffix.md, "How it is stored").
FEW_OCCURRENCES = 8


@dataclass
class Candidate:
    tokens: list[int]
    probs: list[float]  # each node's (a chain's: each token's) path probability
    match_len: int
    parents: list[int] | None = None  # a tree (`_grow`): each node's parent, -1 = the root
    source: str = ""  # request (the request's own text) or global (earlier responses)

    @property
    def score(self) -> float:
        """Expected accepted tokens: the sum of the path probabilities."""
        return sum(self.probs)

    @property
    def rank(self) -> float:
        """What candidates are chosen by: the score of the main path's nodes (a chain's tokens; a
        tree's likeliest child of each node from the root: the chain `_walk` would give) no deeper
        than the match is long. A draft may run past that (max_spec_factor > 1), but those tokens
        rest on the same few occurrences: a 2-token match with one occurrence would otherwise
        outrank a 12-token match's slightly less sure draft by the length of its guess. A tree's
        branches do not count: a short match's bushy tree outranked a long match's sure path
        (docs/design/suffix.md, "The choice")."""
        at, depth, total = -1, 0, 0.0  # at: the main path's deepest node so far (nodes list parents first)
        for i, q in enumerate(self.probs):
            parent = i - 1 if self.parents is None else self.parents[i]
            if parent == at:
                at, depth = i, depth + 1
                total += q if depth <= self.match_len else 0.0
        return total


class TokenIndex:
    """Documents of token ids back to back (each followed by END) and, for every bigram and every
    token, the positions of its (last) token, oldest first. Positions below `live_from` are evicted."""

    def __init__(self) -> None:
        self.tokens = array("i")
        self.where: dict[int, array] = {}  # bigram key -> positions of its second token
        self.where_token: dict[int, array] = {}  # token -> its positions (the one-token match level)
        self.live_from = 0

    def __len__(self) -> int:
        return len(self.tokens) - self.live_from

    @staticmethod
    def _key(a: int, b: int) -> int:
        return (a << 32) | b

    def extend(self, ids: list[int]) -> None:
        """Append tokens to the last (open) document."""
        toks, where, single = self.tokens, self.where, self.where_token
        prev = toks[-1] if toks else END
        for t in ids:
            if prev != END:
                key = self._key(prev, t)
                pos = where.get(key)
                if pos is None:
                    pos = where[key] = array("q")
                pos.append(len(toks))
            pos = single.get(t)
            if pos is None:
                pos = single[t] = array("q")
            pos.append(len(toks))
            toks.append(t)
            prev = t

    def close(self) -> None:
        """End the open document."""
        if self.tokens and self.tokens[-1] != END:
            self.tokens.append(END)

    def best(self, tail: list[int], k: int, max_depth: int, max_spec_factor: float, min_token_prob: float,
             exclude_from: int | None = None, max_nodes: int = 0, one_token: bool = False,
             beat: float = -1.0) -> Candidate | None:
        """The best draft of up to k tokens continuing `tail`, or None. Occurrences at or after
        `exclude_from` are ignored (the tail itself, in the request's own index). `max_nodes` > 0:
        a tree of up to that many nodes, k deep at most (`_grow`), instead of a chain. `one_token`:
        the occurrences of the tail's last token (where no source has its last two). `beat`: a
        rank the caller already has; levels that cannot exceed it are not walked (a draft's rank
        is at most min(L, its depth): at each depth the path probabilities sum to 1 at most), so
        the best draft is found as without it wherever it ranks above `beat`."""
        span = self._span(tail, k, exclude_from, one_token)
        if span is None:
            return None
        native_search = native.loaded()
        if native_search is not None:  # the same draft, searched in C++ (search.cpp)
            depth = min(len(tail), max_depth)
            got = native_search.suffix_best(self.tokens, *span, tail[-depth:], k, self.live_from, max_spec_factor,
                                     min_token_prob, beat, MAX_LEVELS, max_nodes)
            return None if got is None else Candidate(*got)
        rows, lv = self._gather(*span, tail, k, max_depth)
        best: Candidate | None = None
        best_rank = -1.0  # best.rank, computed once per candidate (Candidate.rank walks its nodes)
        for L in sorted(set(lv), reverse=True)[:MAX_LEVELS]:
            n_tokens = min(k, int(L * max_spec_factor + 1e-6))
            if n_tokens < 1 or min(L, n_tokens) + 1e-6 <= max(beat, best_rank):  # (sums may round up)
                continue
            level = [r for r, m in zip(rows, lv) if m >= L]
            c = _grow(level, n_tokens, max_nodes, min_token_prob, L) if max_nodes else _walk(level, n_tokens, min_token_prob, L)
            rank = c.rank if c.tokens else -1.0
            if rank > best_rank:
                best, best_rank = c, rank
        return best

    def _span(self, tail: list[int], k: int, exclude_from: int | None, one_token: bool = False) -> tuple[array, int, int] | None:
        """The occurrences of the tail's last bigram (`one_token`: of its last token) to consider:
        (their positions, from, to), the most recent MAX_CANDIDATES live ones before
        `exclude_from`; None where there are none."""
        if len(tail) < 2 or k < 1:
            return None
        if one_token:
            where, first = self.where_token.get(tail[-1]), 0
        else:
            where, first = self.where.get(self._key(tail[-2], tail[-1])), 1
        if where is None:
            return None
        lo = bisect_left(where, self.live_from + first)  # ascending: bisection finds the live ones before exclude_from
        hi = len(where) if exclude_from is None else bisect_left(where, exclude_from - 1)
        lo = max(lo, hi - MAX_CANDIDATES)
        return None if lo >= hi else (where, lo, hi)

    def _gather(self, where: array, lo: int, hi: int, tail: list[int], k: int, max_depth: int) -> tuple[list[list[int]], list[int]]:
        """The occurrences where[lo:hi] (`_span`): what followed each ([n][k] tokens, END past a
        document) and how many tokens of the tail each matched. A few occurrences (most drafts:
        SmolLM2's Spec-Bench) in plain Python, more as numpy arrays: the same lists."""
        depth = min(len(tail), max_depth)
        if hi - lo <= FEW_OCCURRENCES:
            return self._few(where[lo:hi].tolist(), tail, k, depth)
        toks = np.frombuffer(self.tokens, dtype=np.int32)
        p = np.frombuffer(where, dtype=np.int64)[lo:hi]
        levels = self._match_lengths(toks, p, tail, depth)  # [n] tokens of tail matched at each
        # continuations [n, k]: END past a document's end (and past the index's end)
        idx = p[:, None] + 1 + np.arange(k)
        cont = np.where(idx < len(toks), toks[np.minimum(idx, len(toks) - 1)], END)
        return cont.tolist(), levels.tolist()

    def _few(self, positions: list[int], tail: list[int], k: int, depth: int) -> tuple[list[list[int]], list[int]]:
        """_gather's lists for a few positions, token by token."""
        toks, live_from = self.tokens, self.live_from
        rows, levels = [], []
        for p in positions:
            m = 0  # tokens of the tail that end at p
            while m < depth and p - m >= live_from and toks[p - m] == tail[-1 - m]:
                m += 1
            row = toks[p + 1 : p + 1 + k].tolist()
            rows.append(row + [END] * (k - len(row)))
            levels.append(m)
        return rows, levels

    def _match_lengths(self, toks: np.ndarray, p: np.ndarray, tail: list[int], depth: int) -> np.ndarray:
        """How many tokens of `tail` end at each position of p (at most `depth`): one gather of
        the tokens before each position, compared with the tail read backwards."""
        back = np.asarray(tail[::-1][:depth], dtype=np.int32)  # [depth]
        at = p[:, None] - np.arange(depth)  # [n, depth]
        same = (toks[np.maximum(at, 0)] == back) & (at >= self.live_from)
        return same.cumprod(axis=1).sum(axis=1)

    def compact(self) -> None:
        """Drop the evicted prefix and rebuild the positions (amortised: called when at
        least half the index is evicted)."""
        live = self.tokens[self.live_from :]
        self.tokens, self.where, self.where_token, self.live_from = array("i"), {}, {}, 0
        start = 0
        for i, t in enumerate(live):
            if t == END:
                self.extend(live[start:i].tolist())
                self.close()
                start = i + 1
        if start < len(live):
            self.extend(live[start:].tolist())

    @property
    def nbytes(self) -> int:
        """Memory held: the tokens, the position arrays and the dictionaries' entries (estimated)."""
        positions = itertools.chain(self.where.values(), self.where_token.values())
        return (self.tokens.itemsize * len(self.tokens) + sum(a.itemsize * len(a) for a in positions)
                + (len(self.where) + len(self.where_token)) * 150)


def _walk(rows: list[list[int]], n_tokens: int, min_token_prob: float, match_len: int) -> Candidate:
    """Greedy walk down the continuations `rows` (the occurrences of the match level's
    `match_len` tokens, oldest first): the most frequent next token while the path's probability
    stays at or above min_token_prob. Ties: the most recent occurrence's token (text being copied
    or a loop goes on as it went last; prompt lookup, too, takes the most recent match)."""
    out: list[int] = []
    probs: list[float] = []
    prob = 1.0
    for s in range(n_tokens):
        counts: dict[int, int] = {}  # the most recent occurrence's token first
        for r in reversed(rows):
            if r[s] != END:
                counts[r[s]] = counts.get(r[s], 0) + 1
        if not counts:
            break
        token, count = max(counts.items(), key=lambda kv: kv[1])  # ties: the first counted
        prob *= count / len(rows)
        if prob < min_token_prob:
            break
        out.append(token)
        probs.append(prob)
        rows = [r for r in rows if r[s] == token]
    return Candidate(out, probs, match_len)


def _grow(rows: list[list[int]], depth: int, max_nodes: int, min_token_prob: float, match_len: int) -> Candidate:
    """A token tree over the continuations `rows` (oldest first), best first: the node with the
    highest path probability (its share of the occurrences agreeing so far, multiplied along its
    path) joins next, then its children become candidates; up to max_nodes nodes, `depth` deep,
    none below min_token_prob. Nodes come out best first and parents before children, so any
    first n of them are a tree too (Draft.node_probs). Ties: the node whose most recent
    occurrence is the later one first, as `_walk`.
    Example: rows [[5, 6], [5, 6], [5, 7], [9, 1]], depth 2: nodes 5 (0.75), 5-6 (0.5), then at
    0.25 9 and 9-1 (the last row) before 5-7: tokens [5, 6, 9, 1, 7], parents [-1, 0, -1, 2, 0]."""
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    heap: list[tuple] = []
    order = itertools.count()

    def expand(node: int, s: int, rows: list[tuple[int, list[int]]], prob: float) -> None:
        if s >= depth:
            return
        counts: Counter = Counter()
        latest: dict[int, int] = {}  # token -> the index of its most recent occurrence
        for i, r in rows:
            if r[s] != END:
                counts[r[s]] += 1
                latest[r[s]] = i
        for token, count in counts.items():
            p = prob * count / len(rows)
            if p >= min_token_prob:
                agreeing = [(i, r) for i, r in rows if r[s] == token]
                heapq.heappush(heap, (-p, -latest[token], next(order), token, node, s, agreeing))

    expand(-1, 0, list(enumerate(rows)), 1.0)
    while heap and len(tokens) < max_nodes:
        neg, _, _, token, parent, s, agreeing = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        probs.append(-neg)
        expand(len(tokens) - 1, s + 1, agreeing, -neg)
    return Candidate(tokens, probs, match_len, parents)
