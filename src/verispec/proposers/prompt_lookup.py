"""Prompt lookup (n-gram) drafting: copy what followed the last occurrence of the current tail.

Example, max n = 3: tokens  a b c d x b c  -> tail "b c" (n = 2; "x b c" never occurred before)
matches at position 1, so the draft is what followed it: d x b ... (up to k tokens).
Larger n first; among matches, the most recent one with k tokens after it, else the earliest
(in a repeating loop the most recent match has almost nothing after it). Deterministic: no draft probabilities.

Each request keeps an index of where every n-gram of its tokens starts (`NgramIndex`), caught up
with the tokens kept since its last draft, so a draft costs a few dictionary lookups however long
the request; `find_continuation` asks a fresh index once, for a whole list.
"""

from __future__ import annotations

from bisect import bisect_right

from verispec.proposers.base import Budget, Draft, Proposer, SequenceView, register


@register("prompt_lookup")
class PromptLookupProposer(Proposer):
    """Free to draft (a few dictionary lookups), but which occurrence it copies depends on k (the
    most recent one with k tokens after it), so it drafts the k its drafts pay for."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n

    @classmethod
    def create(cls, config, target) -> "PromptLookupProposer":
        return cls(config.prompt_lookup_min, config.prompt_lookup_max)

    def begin(self, seq: SequenceView) -> None:
        seq.extra["prompt_lookup"] = NgramIndex(self.min_n, self.max_n)

    def propose(self, seq: SequenceView, budget: Budget) -> Draft:
        index = seq.extra.get("prompt_lookup")
        if index is None:  # a view that was never begun
            index = seq.extra["prompt_lookup"] = NgramIndex(self.min_n, self.max_n)
        return Draft(tokens=index.continuation(seq.tokens, budget.pays("")))

    def end(self, seq: SequenceView) -> None:
        seq.extra.pop("prompt_lookup", None)


class NgramIndex:
    """Where each n-gram (min_n <= n <= max_n) of a growing token list starts, in order.

    Example, n = 2, tokens a b a b: starts[2] = {(a, b): [0, 2], (b, a): [1]}. `continuation`
    indexes the tokens added since its last call (a request's tokens only grow), then answers
    for the whole list."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.starts: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in range(min_n, max_n + 1)}
        self.size = 0  # tokens indexed

    def catch_up(self, tokens: list[int]) -> None:
        if len(tokens) < self.size:
            raise ValueError(f"an n-gram index of {self.size} tokens was handed {len(tokens)}: a request's tokens only grow")
        for end in range(self.size + 1, len(tokens) + 1):  # the n-grams ending at tokens[end - 1]
            for n, starts in self.starts.items():
                if end >= n:
                    starts.setdefault(tuple(tokens[end - n : end]), []).append(end - n)
        self.size = len(tokens)

    def continuation(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the chosen earlier occurrence of the longest tail n-gram (the module's rule)."""
        self.catch_up(tokens)
        n_tokens = len(tokens)
        if n_tokens < self.min_n + 1 or k < 1:
            return []
        for n in range(min(self.max_n, n_tokens - 1), self.min_n - 1, -1):
            starts = self.starts[n].get(tuple(tokens[n_tokens - n :]), [])
            hits = bisect_right(starts, n_tokens - 1 - n)  # earlier occurrences: not the tail itself
            if hits:
                full = bisect_right(starts, n_tokens - n - k, 0, hits)  # those with k tokens after them
                start = (starts[full - 1] if full else starts[0]) + n
                return tokens[start : start + k]
        return []


def find_continuation(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest tail n-gram
    (the module's rule), from a fresh index over `tokens`."""
    return NgramIndex(min_n, max_n).continuation(tokens, k)
