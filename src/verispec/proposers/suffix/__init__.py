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

Drafts are searched in C++ (search.cpp: its own small module, built once when the first suffix
drafter is created: native.py) where it builds, else by the Python walk and tree growth
(index.py): the same drafts (a test compares them), the Python ones the reference.

Deterministic: no draft probabilities (verification treats the draft as one-hot), and the same
context and history give the same draft. Every verification is lossless whatever the draft. A
seeded sampled request drafts from its own text only, so its tokens do not depend on what else the
engine served (greedy tokens never do).
"""

from __future__ import annotations

import json
import logging
from collections import Counter, deque
from pathlib import Path

from verispec.config import SpeculativeConfig as _DEFAULTS  # the options' defaults: one source of truth
from verispec.errors import InvalidSpeculativeConfigError
from verispec.proposers.base import Budget, Draft, Proposer, SequenceView, register
from verispec.proposers.suffix import native
from verispec.proposers.suffix.index import Candidate, TokenIndex

log = logging.getLogger("verispec")


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
class SuffixProposer(Proposer):
    """Free to draft (index lookups): it drafts as deep as the budget allows and labels each draft
    by kind (request/global x long/short/one-token match). Its drafts, chains too, carry each
    token's path probability (its share of the occurrences), so the policy sizes them by those,
    calibrated per kind and apart past the match (engine/policy.py's `size`)."""

    shared_sources = frozenset({"global"})  # earlier responses: one estimate per kind for the engine (the decoder's)
    proposes_trees = True  # the occurrences' other continuations are the tree's branches
    variants = {"cold": {"suffix_decoding_max_cached_requests": 0}}  # no earlier responses kept: a server just started

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
        native.module()  # the C++ search, built once (seconds) where it can be: the same drafts, faster
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

    def propose(self, seq: SequenceView, budget: Budget) -> Draft:
        """A chain of up to `budget.depth` tokens, or (`budget.nodes` > 0) a tree of up to that many
        nodes as deep."""
        pick = self.candidate(seq, budget.depth, budget.nodes)
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
