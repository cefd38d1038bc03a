"""Verify draft tokens against the target model: exact (lossless) speculative sampling.

A pure function over tensors: no model, no global state. Each row of the batch is one
request that drafted `num_draft_tokens[b]` tokens; the target scored all of them in one
forward, giving its processed distribution at every draft position plus one more.

Terms (as vLLM uses them):

- *accepted* tokens: the leading draft tokens the verifier keeps. Draft token x at position i
  is accepted with probability min(1, target_probs[i, x] / draft_probs[i, x]); the first
  rejection stops the row.
- *recovered* token: at the first rejected position j, a token drawn from the residual
  normalise(max(0, target_probs[j] - draft_probs[j])). It replaces the rejected draft.
- *bonus* token: when every draft token of a row is accepted, a token drawn from the target
  at position num_draft_tokens[b] (the position after the last draft), for free.

Every row therefore emits num_accepted[b] + 1 tokens, and each emitted token is distributed
exactly as if it had been sampled from the target alone (Leviathan et al. 2023; Chen et al.
2023). For a deterministic drafter (greedy, n-gram lookup), draft_probs is None: q is one-hot
at the draft token, so a draft x is accepted with probability target_probs[i, x] and the
residual is the target with x removed.

Worked example, one row, k = 2 drafts [5, 9]: draft 5 accepted, draft 9 rejected, recovered
token 7 drawn from the residual at position 1:

    output_tokens = [5, 7, -1]    num_accepted = 1

If both drafts were accepted and the bonus drawn at position 2 were 3: [5, 9, 3], 2.

Greedy verification (`greedy_accept`) is the temperature-0 case, for one request on plain lists:
accept while the draft equals the target's argmax, then emit the target's argmax.
"""

from dataclasses import dataclass

import torch

from verispec.sampling.processors import Generators, per_row_generators, sample_from_probs


@dataclass
class VerifyOutput:
    # [batch, k+1] int64: the accepted drafts, then one recovered or bonus token, then -1.
    output_tokens: torch.Tensor
    # [batch] int64: draft tokens accepted per row, 0..num_draft_tokens[b]. The row emits
    # num_accepted[b] + 1 tokens (mean acceptance length counts the bonus, as vLLM does).
    num_accepted: torch.Tensor


def rejection_sample(
    target_probs: torch.Tensor,  # [batch, k+1, vocab] float32, processed target distributions
    draft_probs: torch.Tensor | None,  # [batch, k, vocab] float32, or None: one-hot drafts
    draft_tokens: torch.Tensor,  # [batch, k] int64
    num_draft_tokens: torch.Tensor | None = None,  # [batch] int64, 0..k; None = all k
    generators: Generators = None,
) -> VerifyOutput:
    """Accept a prefix of each row's drafts, then emit one recovered or bonus token.

    Positions >= num_draft_tokens[b] are ignored (their draft tokens may hold any value,
    e.g. -1 padding); that row's bonus comes from target_probs[b, num_draft_tokens[b]].
    generators: None, one torch.Generator for the whole batch, or one (Generator | None) per
    row so that each request keeps its own seed. The same generator state gives the same
    output. Per row, the k acceptance uniforms are drawn first, then the final token.
    """
    batch, k = draft_tokens.shape
    _check_shapes(target_probs, draft_probs, draft_tokens)
    target_probs = target_probs.float()
    valid = _valid_positions(draft_tokens, num_draft_tokens)  # [batch, k]
    drafts = torch.where(valid, draft_tokens, 0)  # padding may be -1: keep gathers in range

    # 1. Accept draft x at position i iff u < target(x) / draft(x), written without division.
    #    target(x) = 0 (x cut by top-k) always rejects; target == draft always accepts.
    target_at_draft = target_probs[:, :k].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    if draft_probs is None:
        draft_at_draft = torch.ones_like(target_at_draft)
    else:
        draft_probs = draft_probs.float()
        draft_at_draft = draft_probs.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    uniforms = _uniforms(batch, k, generators, target_probs.device)  # [batch, k]
    accepted = (uniforms * draft_at_draft < target_at_draft) & valid
    num_accepted = _leading_true(accepted)  # [batch]

    # 2. The distribution of the one extra token, at each row's stop position only: the
    #    residual where the row rejected, the target itself (bonus) where it accepted all.
    stop = num_accepted  # [batch]: first rejected position, or num_draft_tokens (bonus)
    rows = torch.arange(batch, device=target_probs.device)
    final_probs = target_probs[rows, stop]  # [batch, vocab]
    rejected = stop < valid.sum(-1)  # [batch]
    if bool(rejected.any()):
        final_probs = _recovery_probs(final_probs, draft_probs, drafts, rows, stop, rejected)

    # 3. Draw it and assemble [accepted drafts, extra token, -1 ...].
    extra_token = sample_from_probs(final_probs, generators)
    return VerifyOutput(_assemble(drafts, num_accepted, extra_token), num_accepted)


def greedy_accept(target_argmax: list[int], draft_tokens: list[int]) -> int:
    """Temperature 0, one request: how many of its drafts lead with the target's argmax at their
    position ([k + 1] argmaxes, [k] drafts); the step emits target_argmax[: that + 1].
    Example: argmax [5, 9, 4], drafts [5, 7]: 1, and the step emits [5, 9]."""
    n = 0
    for draft, target in zip(draft_tokens, target_argmax):
        if draft != target:
            break
        n += 1
    return n


def _check_shapes(target_probs, draft_probs, draft_tokens) -> None:
    batch, k = draft_tokens.shape
    if target_probs.dim() != 3 or tuple(target_probs.shape[:2]) != (batch, k + 1):
        raise ValueError(
            f"target_probs must be [batch, k+1, vocab] = [{batch}, {k + 1}, vocab], "
            f"got {tuple(target_probs.shape)}"
        )
    if draft_probs is not None and draft_probs.shape != (batch, k, target_probs.shape[2]):
        raise ValueError(
            f"draft_probs must be [batch, k, vocab] = [{batch}, {k}, {target_probs.shape[2]}], "
            f"got {tuple(draft_probs.shape)}"
        )


def _valid_positions(
    draft_tokens: torch.Tensor, num_draft_tokens: torch.Tensor | None
) -> torch.Tensor:  # [batch, k] bool
    batch, k = draft_tokens.shape
    if num_draft_tokens is None:
        return torch.ones(batch, k, dtype=torch.bool, device=draft_tokens.device)
    positions = torch.arange(k, device=draft_tokens.device)
    return positions.unsqueeze(0) < num_draft_tokens.unsqueeze(1)


def _leading_true(mask: torch.Tensor) -> torch.Tensor:  # [batch, k] bool -> [batch] int64
    """Length of each row's leading run of True: [T, T, F, T] -> 2."""
    return torch.cumprod(mask.long(), dim=1).sum(dim=1)


def _uniforms(
    batch: int, k: int, generators: Generators, device: torch.device
) -> torch.Tensor:  # [batch, k] float32 in [0, 1)
    if generators is None or isinstance(generators, torch.Generator):
        return torch.rand(batch, k, generator=generators, device=device)
    per_row = per_row_generators(generators, batch)
    uniforms = torch.empty(batch, k, device=device)
    for b, g in enumerate(per_row):
        uniforms[b] = torch.rand(k, generator=g, device=device)
    return uniforms


def _recovery_probs(
    final_probs: torch.Tensor,  # [batch, vocab]: target at each row's stop position
    draft_probs: torch.Tensor | None,  # [batch, k, vocab] or None (one-hot)
    drafts: torch.Tensor,  # [batch, k]
    rows: torch.Tensor,  # [batch] = arange(batch)
    stop: torch.Tensor,  # [batch]
    rejected: torch.Tensor,  # [batch] bool
) -> torch.Tensor:  # [batch, vocab]
    """Replace rejected rows by normalise(max(0, target - draft)) at their stop position."""
    stop_in_draft = stop.clamp(max=drafts.shape[1] - 1)  # bonus rows: any in-range index
    if draft_probs is None:
        draft_at_stop = torch.zeros_like(final_probs)
        draft_at_stop.scatter_(1, drafts[rows, stop_in_draft].unsqueeze(1), 1.0)
    else:
        draft_at_stop = draft_probs[rows, stop_in_draft]
    residual = (final_probs - draft_at_stop).clamp_min(0.0)
    mass = residual.sum(dim=1, keepdim=True)
    # mass == 0 means target <= draft everywhere, i.e. target == draft, where rejection
    # cannot happen; float round-off or an unnormalised draft could still get here, so fall
    # back to the target rather than divide by zero.
    recovered = torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(mass.dtype).tiny),
                            final_probs)
    return torch.where(rejected.unsqueeze(1), recovered, final_probs)


def _assemble(
    drafts: torch.Tensor,  # [batch, k]
    num_accepted: torch.Tensor,  # [batch]
    extra_token: torch.Tensor,  # [batch]
) -> torch.Tensor:  # [batch, k+1]: accepted drafts, the extra token, then -1
    batch, k = drafts.shape
    positions = torch.arange(k + 1, device=drafts.device).unsqueeze(0)
    padded = torch.cat([drafts, drafts.new_full((batch, 1), -1)], dim=1)
    out = torch.where(positions < num_accepted.unsqueeze(1), padded, -1)
    return out.scatter_(1, num_accepted.unsqueeze(1), extra_token.unsqueeze(1))
