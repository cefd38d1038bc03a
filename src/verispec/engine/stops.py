"""Stop conditions, checked token by token, so a stop inside an accepted block ends generation at
exactly that token.

For each emitted token, in order: (1) an end-of-sequence or stop token id ends with "stop"
(the id is kept in token_ids, its text is not shown); (2) a stop string completed by this token
ends with "stop" (the text is cut before the stop string); (3) reaching max_tokens ends with
"length". Stop is checked before length, so a stop token that is also the max_tokens-th token
reports "stop".
"""

from __future__ import annotations

from dataclasses import dataclass

from verispec.config import SamplingParams
from verispec.runners.base import Tokenizer


@dataclass
class StopResult:
    num_kept: int  # how many of the offered tokens are emitted
    finish_reason: str | None  # "stop" | "length" | None (keep going)
    text_end: int | None = None  # cut the decoded text here (a stop string was found)


class StopChecker:
    def __init__(self, params: SamplingParams, tokenizer: Tokenizer, eos_token_ids: tuple[int, ...]) -> None:
        self.params = params
        self.tokenizer = tokenizer
        self.stop_ids = set(params.stop_token_ids or [])
        if not params.ignore_eos:
            self.stop_ids |= set(eos_token_ids)
        self.stop_strings = list(params.stop or [])
        self.max_stop_len = max((len(s) for s in self.stop_strings), default=0)
        self._checked_text = 0  # text before this offset is known to hold no stop string

    def check(self, output_ids: list[int], new_tokens: list[int]) -> StopResult:
        """`output_ids` already emitted; which of `new_tokens` (in order) are kept, and why we stop."""
        for i, token in enumerate(new_tokens):
            n_out = len(output_ids) + i + 1
            if token in self.stop_ids:
                return StopResult(i + 1, "stop")
            if self.stop_strings:
                cut = self._find_stop_string(output_ids + new_tokens[: i + 1])
                if cut is not None:
                    return StopResult(i + 1, "stop", text_end=cut)
            if n_out >= self.params.max_tokens:
                return StopResult(i + 1, "length")
        return StopResult(len(new_tokens), None)

    def _find_stop_string(self, ids: list[int]) -> int | None:
        text = self.tokenizer.decode(ids)
        begin = max(0, self._checked_text - self.max_stop_len + 1)
        hits = [pos for s in self.stop_strings if (pos := text.find(s, begin)) >= 0]
        # text ending in an incomplete character may still change; re-check its tail next time
        self._checked_text = len(text.rstrip("\ufffd"))
        return min(hits) if hits else None

    def final_text(self, output_ids: list[int], result_text_end: int | None) -> str:
        ids = output_ids
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]  # the stop token's own text is not shown
        text = self.tokenizer.decode(ids)
        return text[:result_text_end] if result_text_end is not None else text
