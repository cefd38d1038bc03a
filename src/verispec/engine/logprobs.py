"""Log-probabilities of chosen tokens and their top alternatives, from one row of logits at a time.

Each row is reduced alone (a 1-D log-softmax and top-k), so a token's figures are bit-identical
whether its row was verified with drafts, batched with other requests or decoded alone: what plain
decoding reports for the same tokens. Which distribution: `raw_logprobs` (the model's log-softmax,
before any processing, vLLM's default) or `processed_logprobs` (the one the token was drawn from).
Tokens a processed distribution rules out have log-probability -inf.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
