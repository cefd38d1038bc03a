"""Logit bias and repetition penalties on one row of logits: pure functions, no state.

The engine applies them at every verified position with that position's own history (the prompt,
the output so far and the draft tokens before it), so a row gets exactly the values plain
decoding gives it at the same point. Order, as vLLM's: logit_bias, then the structured-output
mask (engine/logits.py), then repetition, frequency and presence penalties; temperature and the
cuts come after (`processors.logits_to_probs`), greedy takes the argmax of the result.

Semantics (OpenAI's and vLLM's):
- presence_penalty p, frequency_penalty f: over the *output* tokens, logit -= f * count + p * (count > 0);
- repetition_penalty r: over prompt and output tokens, logit / r where it is positive, logit * r else.

Example: logits [2.0, -1.0, 0.5], output counts {0: 2, 1: 1}, prompt {2}, f = 0.5, p = 0.1, r = 2:
repetition -> [1.0, -2.0, 0.25]; frequency and presence -> [-0.1, -2.6, 0.25].
"""

from __future__ import annotations

from collections import Counter

import torch


def apply_logit_bias(row: torch.Tensor, ids: torch.Tensor, values: torch.Tensor) -> None:
    """row [vocab] += values at ids ([n] int64, [n] float32), in place."""
    row.index_add_(0, ids, values)


def apply_penalties(
    row: torch.Tensor,  # [vocab] float32, changed in place
    output_counts: Counter,  # token id -> times it occurs in the output so far
    seen: set[int],  # token ids in the prompt or the output so far
    presence: float,
    frequency: float,
    repetition: float,
) -> None:
    if repetition != 1.0 and seen:
        ids = torch.tensor(sorted(seen), dtype=torch.int64)
        values = row[ids]
        # a penalty far below 1 can overflow a positive logit: the largest float instead of inf (whose
        # softmax would be NaN), so the token stays the likeliest, as the penalty means
        row[ids] = torch.where(values > 0, values / repetition, values * repetition).clamp(max=torch.finfo(row.dtype).max)
    if (presence or frequency) and output_counts:
        ids = torch.tensor(sorted(output_counts), dtype=torch.int64)
        counts = torch.tensor([output_counts[i] for i in sorted(output_counts)], dtype=torch.float32)
        row[ids] -= counts * frequency + presence
