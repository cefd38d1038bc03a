"""Prompt lookup (n-gram) drafting: copy what followed the last occurrence of the current tail.

Example, max n = 3: tokens  a b c d x b c  -> tail "b c" (n = 2; "x b c" never occurred before)
matches at position 1, so the draft is what followed it: d x b ... (up to k tokens).
Larger n first; among matches, the most recent one with k tokens after it, else the earliest
(in a repeating loop the most recent match has almost nothing after it). Deterministic: no draft probabilities.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from verispec.proposers.base import Draft, SequenceView, register


@register("prompt_lookup")
class PromptLookupProposer:
    relative_cost = 0.0  # a numpy search: free next to a forward

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n

    @classmethod
    def create(cls, config, target) -> "PromptLookupProposer":
        return cls(config.prompt_lookup_min, config.prompt_lookup_max)

    def begin(self, seq: SequenceView) -> None:
        pass

    def propose(self, seq: SequenceView, k: int) -> Draft:
        return Draft(tokens=find_continuation(seq.tokens, k, self.min_n, self.max_n))

    def accept(self, seq: SequenceView, num_accepted: int) -> None:
        pass

    def end(self, seq: SequenceView) -> None:
        pass


def find_continuation(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest tail n-gram."""
    n_tokens = len(tokens)
    if n_tokens < min_n + 1 or k < 1:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_n, n_tokens - 1), min_n - 1, -1):
        tail = arr[n_tokens - n :]
        windows = sliding_window_view(arr[: n_tokens - 1], n)  # windows starting at 0..n_tokens-1-n
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if hits.size:
            starts = hits + n  # where each match's continuation begins
            full = starts[starts + k <= n_tokens]
            start = int(full[-1]) if full.size else int(starts[0])
            return arr[start : start + k].tolist()
    return []
