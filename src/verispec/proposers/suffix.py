"""Suffix decoding: drafts from the request's own text and from every response this engine gave
before (the method of Arctic Inference and vLLM's `suffix`), with no model and no training.

Two sources, each a `TokenIndex` (documents of token ids, and where every bigram and token occurs):
- the request's own prompt + output, growing as it decodes;
- the engine's earlier responses (`GlobalResponses`): shared by all requests of an engine or a
  server, filled as requests end (each after the last 8 tokens of its prompt, so that a response's
  start can be matched: a chat template's assistant header), optionally from a corpus file,
  bounded by `max_cached_requests` (the oldest go first).

A draft comes from the occurrences of the context's tail. For each length L of tail that occurs
(a "match level"), the occurrences of those L tokens are the suffix tree's node for them, and what
followed each occurrence its children: the draft walks the most frequent child, token by token.
A token's probability is its share of the occurrences still agreeing (`count / total`, where
`total` counts occurrences whose text ended there), and its estimated probability of acceptance
is the product along the path. The walk stops where that falls below `min_token_prob` or after
`int(L * max_spec_factor)` tokens (longer matches earn longer drafts). The draft with the highest
rank wins, over all match levels and both sources: its score (the sum of those estimates: the
expected number of accepted tokens) over its first L tokens (a tree's: its main path's). A draft may run past L tokens
(max_spec_factor > 1, as a loop's short match drafts the loop's next lap), but is not chosen for
them: they rest on the same few occurrences as the rest. Where neither source has the tail's last
two tokens, its last token alone is the match (L = 1): after a word new to both (a batch job's
next input value), what followed the template's next token elsewhere.

Example: earlier responses "... the result is 42 . Done" (twice) and "... the result is 7 .";
context tail "the result is": the 3-token level has 3 occurrences; "42" follows 2 of 3 (p = 0.67),
then "." 2 of 2 (0.67), "Done" (0.67): the draft is "42 . Done", score 2.0, if min_token_prob < 0.67.

Drafts are searched in C++ (models/kernels/suffix.cpp) where this process has loaded the row-wise
kernels (the torch backend does), else by the Python walk and tree growth below: the same drafts
(a test compares them), the Python ones the reference.

Deterministic: no draft probabilities (verification treats the draft as one-hot), and the same
context and history give the same draft. Every verification is lossless whatever the draft. A
seeded sampled request drafts from its own text only, so its tokens do not depend on what else the
engine served (greedy tokens never do).
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
from array import array
from bisect import bisect_left
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verispec.config import SpeculativeConfig as _DEFAULTS  # the options' defaults: one source of truth
from verispec.errors import InvalidSpeculativeConfigError
from verispec.models.rowwise import loaded_kernel
from verispec.proposers.base import Draft, SequenceView, register

log = logging.getLogger("verispec")

END = -1  # after each document: no occurrence continues past it
MAX_CANDIDATES = 64  # most recent occurrences of the tail's last bigram considered
MAX_LEVELS = 4  # match levels walked per source (the longest ones)
# Up to this many occurrences are gathered in plain Python, more with numpy. Measured (us, Python
# against numpy): 1 / 8 / 32 occurrences of a 2-token match 1.4 / 5.6 / 21 against 13 / 16 / 24;
# of a 24-token match 3.1 / 19 / 82 against 13 / 16 / 24.
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
        (SmolLM2's repetitive workload: 4.02 tokens a step with trees against 4.11 with chains;
        4.09 ranked by the main path, and Gemma 3's int8 trees 6.54 -> 6.62)."""
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
        native = loaded_kernel()
        if native is not None:  # the same draft, searched in C++ (kernels/suffix.cpp)
            depth = min(len(tail), max_depth)
            got = native.suffix_best(self.tokens, *span, tail[-depth:], k, self.live_from, max_spec_factor,
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


class GlobalResponses:
    """Earlier responses of one engine, at most `max_requests` of them (the oldest evicted)."""

    def __init__(self, max_requests: int) -> None:
        self.index = TokenIndex()
        self.max_requests = max_requests
        self.ends: deque[int] = deque()  # where each cached response's END lies

    def add(self, ids: list[int], lead: list[int] | None = None) -> None:
        """Keep a response; `lead`: the last tokens of its prompt, kept before it so that the
        response's first tokens can be matched too (a chat template's assistant header)."""
        if not ids or self.max_requests == 0:
            return
        self.index.extend(list(lead or []) + list(ids))
        self.index.close()
        self.ends.append(len(self.index.tokens))
        while len(self.ends) > self.max_requests:
            self.index.live_from = self.ends.popleft()
        if self.index.live_from > len(self.index):  # more evicted than live: rebuild
            shift = self.index.live_from
            self.index.compact()
            self.ends = deque(e - shift for e in self.ends)

    def __len__(self) -> int:
        return len(self.ends)


PROMPT_LEAD = 8  # prompt tokens kept before each response (its start can then be matched too)
LONG_MATCH = 8  # matched tokens from which a draft counts as a long match (its own acceptance estimate)


@register("suffix")
class SuffixProposer:
    relative_cost = 0.0  # index lookups: small next to a forward
    labels_drafts = True  # kinds: request/global x long/short/one-token match, each with its acceptance estimate
    # Chains are sized like trees: each token's path probability (its share of the occurrences),
    # calibrated per kind and apart past the match (engine/policy.py, tree_shape), rather than by
    # the kind's acceptance rate alone. In-process A/B, gguf-int8 (methods rotated per question):
    # Gemma 3's repetitive workload 3.747x -> 3.918x its plain decoding, its Spec-Bench (24
    # questions) 3.216x -> 3.279x; SmolLM2's Spec-Bench (36) 1.248x -> 1.250x.
    sizes_by_node_probs = True
    shared_sources = frozenset({"global"})  # earlier responses: one estimate per kind for the engine (the decoder's)
    proposes_trees = True  # the occurrences' other continuations are the tree's branches

    def __init__(self, max_depth: int = _DEFAULTS.suffix_decoding_max_tree_depth,
                 max_cached_requests: int = _DEFAULTS.suffix_decoding_max_cached_requests,
                 max_spec_factor: float = _DEFAULTS.suffix_decoding_max_spec_factor,
                 min_token_prob: float = _DEFAULTS.suffix_decoding_min_token_prob) -> None:
        self.max_depth = max_depth
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.responses = GlobalResponses(max_cached_requests)
        self.stats = Counter()  # drafts by source: request, global, none

    @classmethod
    def create(cls, config, target) -> "SuffixProposer":
        p = cls(config.suffix_decoding_max_tree_depth, config.suffix_decoding_max_cached_requests,
                config.suffix_decoding_max_spec_factor, config.suffix_decoding_min_token_prob)
        if config.suffix_decoding_corpus:
            p.seed_corpus(Path(config.suffix_decoding_corpus), target.tokenizer)
        return p

    @property
    def memory_bytes(self) -> int:
        """The store of earlier responses, estimated (TokenIndex.nbytes); per-request indexes are
        freed with their request."""
        return self.responses.index.nbytes

    @property
    def cached_tokens(self) -> int:
        return len(self.responses.index)

    def seed_corpus(self, path: Path, tokenizer) -> int:
        """Add a corpus file's documents to the earlier responses: a .jsonl of strings or of
        objects with "text", else plain text with documents between blank lines. Returns how many."""
        try:
            raw = path.read_text(encoding="utf-8")
        except OSError as e:
            raise InvalidSpeculativeConfigError(f"cannot read suffix_decoding_corpus {path}: {e}") from e
        docs = _corpus_documents(path, raw)
        for text in docs:
            self.responses.add(tokenizer.encode(text))
        log.info("suffix decoding: %d documents from %s (%d cached)", len(docs), path, len(self.responses))
        return len(docs)

    def begin(self, seq: SequenceView) -> None:
        index = TokenIndex()
        index.extend(seq.tokens)
        seq.extra["suffix"] = index

    def _own(self, seq: SequenceView) -> TokenIndex:
        """The request's index, caught up with the tokens emitted since the last proposal."""
        index = seq.extra["suffix"]
        if len(index.tokens) < len(seq.tokens):
            index.extend(seq.tokens[len(index.tokens) :])
        return index

    def propose(self, seq: SequenceView, k: int) -> Draft:
        return self._propose(seq, k, 0)

    def propose_tree(self, seq: SequenceView, max_depth: int, max_nodes: int) -> Draft:
        return self._propose(seq, max_depth, max_nodes)

    def _propose(self, seq: SequenceView, k: int, max_nodes: int) -> Draft:
        """A chain of up to k tokens, or (max_nodes > 0) a tree of up to max_nodes nodes k deep."""
        pick = self.candidate(seq, k, max_nodes)
        if pick is None:
            self.stats["none"] += 1
            return Draft(tokens=[])
        return self.draft_of(pick)

    def candidate(self, seq: SequenceView, k: int, max_nodes: int = 0) -> Candidate | None:
        """The best draft of the two sources, with its score (expected accepted tokens) and
        `source` ("request" or "global"), or None."""
        own = self._own(seq)
        tail = seq.tokens[-self.max_depth :]
        args = (tail, k, self.max_depth, self.max_spec_factor, self.min_token_prob)
        # A seeded sampled request drafts from its own text only: which drafts it gets decides how
        # its random stream is consumed, and its tokens must not depend on what else the engine served
        seeded = seq.params.seed is not None and not seq.params.greedy
        # The earlier responses are walked only where they can outrank the request's own.
        for one_token in (False, True):  # the tail's last token alone only where no source has its last two
            mine = own.best(*args, exclude_from=len(own.tokens), max_nodes=max_nodes, one_token=one_token)
            if mine is not None:
                mine.source = "request"
            theirs = None
            if not seeded:
                theirs = self.responses.index.best(*args, max_nodes=max_nodes, one_token=one_token,
                                                   beat=mine.rank if mine is not None else -1.0)
            if theirs is not None:
                theirs.source = "global"
            if mine is not None or theirs is not None:
                break
        return max((c for c in (mine, theirs) if c is not None), key=lambda c: c.rank, default=None)

    def draft_of(self, pick: Candidate) -> Draft:
        """A candidate as a Draft, labelled by source and match length (and counted)."""
        self.stats[pick.source] += 1
        return Draft(tokens=pick.tokens, parents=pick.parents, node_probs=pick.probs, kind=self.kind_of(pick), past_match=pick.match_len)

    @staticmethod
    def kind_of(pick: Candidate) -> str:
        """A candidate's draft kind: its source and its match's length: long, short, or one token
        (drafts from one matched token are right less often: apart, they do not cut the others' k)."""
        length = "long" if pick.match_len >= LONG_MATCH else "one" if pick.match_len == 1 else "short"
        return f"{pick.source}:{length}"

    def accept(self, seq: SequenceView, num_accepted: int) -> None:
        pass

    def end(self, seq: SequenceView) -> None:
        seq.extra.pop("suffix", None)
        prompt = seq.tokens[: seq.num_prompt_tokens]
        self.responses.add(seq.tokens[seq.num_prompt_tokens :], lead=prompt[-PROMPT_LEAD:])


def _corpus_documents(path: Path, raw: str) -> list[str]:
    if path.suffix.lower() == ".jsonl":
        docs = []
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise InvalidSpeculativeConfigError(f"{path}:{n}: not JSON ({e.msg})") from e
            text = item.get("text") if isinstance(item, dict) else item
            if not isinstance(text, str):
                raise InvalidSpeculativeConfigError(f"{path}:{n}: want a string or an object with a \"text\" string")
            docs.append(text)
        return docs
    return [d.strip() for d in raw.split("\n\n") if d.strip()]
