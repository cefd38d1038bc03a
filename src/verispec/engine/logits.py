"""One request's logits processing at every verified position: logit bias, the structured-output
mask, repetition penalties.

Speculation verifies positions 0..n of a step at once (the pending token and n drafts). Position i
must get exactly what plain decoding would give it once drafts 0..i-1 are its output: the grammar
advanced through them, the penalties counting them. `begin_step` prepares those per-position states
from the draft; `process` applies them to the target's rows; `commit` moves the request's own state
past the tokens it kept. Each row is processed alone (a 1-D row in, elementwise work), so its
values do not depend on how many rows were verified with it: greedy output is identical to plain
decoding's, sampled output has its distribution.

    proc.begin_step(draft)              # after the draft is cut to what the grammar allows
    rows = proc.process(logits, start)  # [m, vocab] -> [m, vocab], rows start..start+m of the step
    proc.commit(kept_tokens)
"""

from __future__ import annotations

from collections import Counter

import torch

from verispec.config import SamplingParams
from verispec.sampling.penalties import apply_logit_bias, apply_penalties
from verispec.structured.grammar import GrammarMatcher


class LogitsProcessor:
    def __init__(self, params: SamplingParams, prompt_ids: list[int], grammar: GrammarMatcher | None = None) -> None:
        """`params` checked already (the decoder's check_prompt: logit_bias ids inside the vocabulary)."""
        self.params = params
        self.grammar = grammar
        bias = params.logit_bias or {}
        self._bias_ids = torch.tensor(sorted(bias), dtype=torch.int64)
        self._bias_values = torch.tensor([bias[t] for t in sorted(bias)], dtype=torch.float32)
        self._penalised = bool(params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0)
        self.counts: Counter = Counter()  # output tokens committed
        self.seen: set[int] = set(prompt_ids)  # prompt and output tokens committed
        self._draft: list[int] = []
        self._masks: list[torch.Tensor] = []  # [vocab] bool per position of the step

    def valid_prefix(self, draft: list[int]) -> int:
        """How many leading draft tokens may be verified (all, without a grammar)."""
        return len(draft) if self.grammar is None else self.grammar.valid_prefix(draft)

    def begin_step(self, draft: list[int]) -> None:
        """Prepare positions 0..len(draft): the grammar's mask after each draft prefix. A draft may
        end in one token the grammar rejects (a sampled draft's sure rejection); the position after
        it is never reached and gets the mask before it."""
        self._draft = list(draft)
        self._masks = []
        if self.grammar is not None:
            valid = self.grammar.valid_prefix(self._draft)
            for i in range(len(draft) + 1):
                if i <= valid:
                    self._masks.append(self.grammar.mask())
                    if i < valid:
                        self.grammar.consume([draft[i]])
                else:
                    self._masks.append(self._masks[-1])
            self.grammar.rollback(valid)

    def process(self, logits: torch.Tensor, start: int = 0) -> torch.Tensor:
        """[m, vocab] target logits at positions start..start+m-1 of this step -> processed."""
        out = torch.empty(logits.shape, dtype=torch.float32)
        for j in range(logits.shape[0]):
            i = start + j
            row = logits[j].float().clone()  # [vocab]
            if len(self._bias_ids):
                apply_logit_bias(row, self._bias_ids, self._bias_values)
            if self._masks:
                row.masked_fill_(~self._masks[i], float("-inf"))
            if self._penalised:
                prefix = self._draft[:i]
                counts = self.counts + Counter(prefix) if prefix else self.counts
                seen = self.seen.union(prefix) if prefix else self.seen
                p = self.params
                apply_penalties(row, counts, seen, p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
            out[j] = row
        return out

    def commit(self, tokens: list[int]) -> None:
        self.counts.update(tokens)
        self.seen.update(tokens)
        if self.grammar is not None:
            self.grammar.consume(tokens)
