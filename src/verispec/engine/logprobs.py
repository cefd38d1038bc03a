"""Log-probabilities of chosen tokens and their top alternatives, from one row of logits at a time.

Each row is reduced alone (a 1-D log-softmax and top-k), so a token's figures are bit-identical
whether its row was verified with drafts, batched with other requests or decoded alone: what plain
decoding reports for the same tokens. Which distribution: `raw_logprobs` (the model's log-softmax,
before any processing, vLLM's default) or `processed_logprobs` (the one the token was drawn from).
Tokens a processed distribution rules out have log-probability -inf.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from verispec.runners.base import ModelRunner


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    rank: int  # 1 + how many tokens are strictly more likely
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), most likely first


def row_logprobs(row: torch.Tensor, token: int, num_top: int, log_probs: bool = False) -> TokenLogprob:
    """row [vocab]: logits (log_probs False) or log-probabilities already."""
    lp = row.float() if log_probs else torch.log_softmax(row.float(), dim=-1)
    value = lp[token]
    top: list[tuple[int, float]] = []
    if num_top:
        values, ids = torch.topk(lp, num_top)
        top = list(zip(ids.tolist(), values.tolist()))
    return TokenLogprob(token, float(value), int((lp > value).sum()) + 1, top)


def prompt_logprobs(target: "ModelRunner", prompt_ids: list[int], num_top: int) -> list[TokenLogprob | None]:
    """Raw logprobs of each prompt token after the first, from a separate scoring pass, so the
    request's own prefill (and so its output) is the one every other request gets."""
    out: list[TokenLogprob | None] = [None]
    if len(prompt_ids) < 2:
        return out
    seq = target.open(len(prompt_ids))
    try:
        logits = target.forward(seq, prompt_ids, num_logits=len(prompt_ids) - 1).logits  # [n - 1, vocab]
    finally:
        target.close(seq)
    out += [row_logprobs(logits[j], prompt_ids[j + 1], num_top) for j in range(len(prompt_ids) - 1)]
    return out
