"""Turn logits into the sampling distribution, and draw tokens from it.

The target and the draft must go through the *same* `logits_to_probs` with the same
parameters: the rejection sampler is only lossless for the distributions it is given, and
a draft q taken from unprocessed logits while the target used top-k/top-p is a bug the
field has shipped (transformers #47932).

Order, as in vLLM and HF: divide by temperature, drop the tokens under min_p times the most
likely one, keep the top_k logits, then keep the nucleus (top_p) of the renormalised top-k
distribution, renormalise.

Ties are resolved deterministically by token id: among equal logits the lower id ranks
first, so it is the one kept when a cut falls inside a tie. Example, top_k=2:

    logits [1.0, 2.0, 2.0, 2.0, 0.0]  ->  keeps ids 1 and 2 (not 3)

Greedy decoding (temperature 0) is not handled here: it takes the argmax of the raw logits.
"""

from collections.abc import Sequence

import torch

from verispec.errors import InvalidSamplingParamsError
from verispec.models.kernels.rowwise import argmax_rows

Generators = torch.Generator | Sequence[torch.Generator | None] | None


def greedy_tokens(logits: torch.Tensor) -> list[int]:  # [n, vocab] -> n ids
    """Each row's argmax (torch.argmax's index: the first largest value), through the row-wise
    kernel where it runs (models/kernels/rowwise.py's argmax_rows)."""
    return argmax_rows(logits).tolist()


def logits_to_probs(
    logits: torch.Tensor,  # [..., vocab], any float dtype
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> torch.Tensor:  # [..., vocab] float32, each row sums to 1
    """Processed sampling distribution: temperature, then min-p (0 = off: tokens with
    probability < min_p * the largest are dropped), then top-k (0 or -1 = off), then top-p
    (1.0 = off; the smallest set of most likely tokens whose mass >= top_p, always at least
    the most likely token), renormalised. Every leading dimension is a separate row."""
    if not temperature > 0:
        raise InvalidSamplingParamsError(
            f"temperature must be > 0 here (greedy is handled elsewhere), got {temperature}"
        )
    if not 0.0 < top_p <= 1.0:
        raise InvalidSamplingParamsError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < -1:
        raise InvalidSamplingParamsError(f"top_k must be -1, 0 (off) or positive, got {top_k}")

    if not 0.0 <= min_p <= 1.0:
        raise InvalidSamplingParamsError(f"min_p must be in [0, 1], got {min_p}")

    # +inf (a logit a tiny temperature or penalty pushed past the float range) as the largest float:
    # softmax then shares the row among the tokens there instead of giving NaN; a no-op otherwise
    scaled = (logits.float() / temperature).clamp(max=torch.finfo(torch.float32).max)
    if min_p > 0.0:
        probs = torch.softmax(scaled, dim=-1)
        floor = probs.amax(dim=-1, keepdim=True) * min_p
        scaled = scaled.masked_fill(probs < floor, float("-inf"))  # the most likely token always stays
    vocab = scaled.shape[-1]
    use_top_k = 0 < top_k < vocab
    use_top_p = top_p < 1.0
    if not (use_top_k or use_top_p):
        return torch.softmax(scaled, dim=-1)

    # One stable descending sort serves both cuts; stable => equal logits keep id order.
    sorted_logits, sorted_ids = torch.sort(scaled, dim=-1, descending=True, stable=True)
    if use_top_k:
        sorted_logits[..., top_k:] = float("-inf")
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    if use_top_p:
        # Keep rank i while the mass strictly before it is < top_p: the smallest prefix
        # reaching top_p. Rank 0 has nothing before it, so it is always kept.
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = torch.where(mass_before < top_p, sorted_probs, 0.0)
        sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(sorted_probs).scatter_(-1, sorted_ids, sorted_probs)


def sample_from_probs(
    probs: torch.Tensor,  # [batch, vocab], non-negative, rows need not be normalised
    generators: Generators = None,
) -> torch.Tensor:  # [batch] int64
    """Draw one token per row with torch.multinomial.

    generators: None (torch's default generator), one torch.Generator shared by all rows, or
    a sequence of `batch` entries (Generator or None), one per row, so that each request in a
    batch keeps its own seed: row b then depends on generators[b] alone.
    """
    if probs.dim() != 2:
        raise ValueError(f"probs must be [batch, vocab], got shape {tuple(probs.shape)}")
    if generators is None or isinstance(generators, torch.Generator):
        return torch.multinomial(probs, 1, generator=generators).squeeze(-1)
    tokens = torch.empty(probs.shape[0], dtype=torch.int64, device=probs.device)
    for b, g in enumerate(per_row_generators(generators, probs.shape[0])):
        tokens[b] = torch.multinomial(probs[b], 1, generator=g)[0]
    return tokens


def per_row_generators(
    generators: Sequence[torch.Generator | None], batch: int
) -> list[torch.Generator | None]:
    """Check that a per-row generator sequence has one entry per row and return it as a list."""
    per_row = list(generators)
    if len(per_row) != batch:
        raise ValueError(f"got {len(per_row)} generators for a batch of {batch} rows")
    return per_row
