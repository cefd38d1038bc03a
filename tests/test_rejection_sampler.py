"""Tests for verispec.sampling.rejection: a greedy table, seeded determinism, and a
statistical check of losslessness with negative controls that prove the check has teeth.

The statistical recipe (shared/NOTES.md, "Testing lossless sampling"): known target and draft
distributions over 8-50 tokens, target floored at ~2e-3, N = 200,000 draws in one batched
call, Pearson chi-square goodness of fit of the emitted token against the exact target
distribution, failing at p-value < 1e-6. With k >= 2 drafts, the token emitted at position j
(among rows that reached j) must follow position j's target distribution too.
"""

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import scipy.stats
import torch

from verispec.sampling.processors import logits_to_probs
from verispec.sampling.rejection import VerifyOutput, greedy_accept, rejection_sample

N = 200_000
ALPHA = 1e-6  # fail below this p-value
P_FLOOR = 2e-3
MIN_EXPECTED = 5.0


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# =========================================================================================
# Greedy table
# =========================================================================================

# (target_argmax [k+1], draft_tokens [k], num_draft_tokens, output_tokens [k+1], num_accepted)
GREEDY_TABLE = {
    "all accepted + bonus": ([1, 2, 3, 4], [1, 2, 3], 3, [1, 2, 3, 4], 3),
    "first rejected": ([1, 2, 3, 4], [9, 2, 3], 3, [1, -1, -1, -1], 0),
    "middle rejected, later match ignored": ([1, 2, 3, 4], [1, 9, 3], 3, [1, 2, -1, -1], 1),
    "last rejected": ([1, 2, 3, 4], [1, 2, 9], 3, [1, 2, 3, -1], 2),
    "ragged 2 of 3, bonus at 2": ([5, 6, 7, 8], [5, 6, 7], 2, [5, 6, 7, -1], 2),
    "ragged 1 of 3, padding -1": ([5, 6, 7, 8], [5, -1, -1], 1, [5, 6, -1, -1], 1),
    "ragged 1 of 3, rejected": ([5, 6, 7, 8], [4, -1, -1], 1, [5, -1, -1, -1], 0),
    "ragged 0 drafts": ([5, 6, 7, 8], [-1, -1, -1], 0, [5, -1, -1, -1], 0),
}


def _greedy_batch():
    rows = list(GREEDY_TABLE.values())
    target_argmax = torch.tensor([r[0] for r in rows])
    draft_tokens = torch.tensor([r[1] for r in rows])
    num_draft = torch.tensor([r[2] for r in rows])
    expected_out = torch.tensor([r[3] for r in rows])
    expected_n = torch.tensor([r[4] for r in rows])
    return target_argmax, draft_tokens, num_draft, expected_out, expected_n


@pytest.mark.parametrize("name", list(GREEDY_TABLE))
def test_greedy_accept_on_lists_follows_the_table(name):
    """The decoding loop's one-request greedy verification on lists: the table's accepted count and,
    as the emitted block, the argmaxes up to and including the first rejected or bonus position."""
    target_argmax, drafts, num_draft, out, n_acc = GREEDY_TABLE[name]
    n = greedy_accept(target_argmax, drafts[:num_draft])
    assert n == n_acc
    assert target_argmax[: n + 1] == [t for t in out if t != -1]


@pytest.mark.parametrize("draft_kind", ["none", "one_hot_probs"])
def test_one_hot_target_makes_rejection_sampling_match_the_greedy_table(draft_kind):
    """A one-hot target at the argmax leaves nothing to chance: accept iff draft == argmax,
    recovered/bonus = argmax. rejection_sample must then reproduce the greedy table exactly."""
    target_argmax, drafts, num_draft, out, n_acc = _greedy_batch()
    vocab = 12
    target_probs = torch.nn.functional.one_hot(target_argmax, vocab).float()
    draft_probs = None
    if draft_kind == "one_hot_probs":
        draft_probs = torch.nn.functional.one_hot(drafts.clamp_min(0), vocab).float()
    for seed in range(3):
        result = rejection_sample(target_probs, draft_probs, drafts, num_draft, _seeded(seed))
        assert torch.equal(result.output_tokens, out) and torch.equal(result.num_accepted, n_acc)


# =========================================================================================
# Seeded determinism and per-row generators
# =========================================================================================


def _random_inputs(batch=6, k=3, vocab=20, seed=0, ragged=True):
    g = _seeded(seed)
    target_probs = torch.softmax(torch.randn(batch, k + 1, vocab, generator=g), -1)
    draft_probs = torch.softmax(torch.randn(batch, k, vocab, generator=g), -1)
    draft_tokens = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=g)
    draft_tokens = draft_tokens.reshape(batch, k)
    num_draft = torch.randint(0, k + 1, (batch,), generator=g) if ragged else None
    return target_probs, draft_probs, draft_tokens, num_draft


def _same(a: VerifyOutput, b: VerifyOutput) -> bool:
    return torch.equal(a.output_tokens, b.output_tokens) and torch.equal(
        a.num_accepted, b.num_accepted
    )


@pytest.mark.parametrize("one_hot", [False, True])
def test_same_seed_same_output(one_hot):
    target_probs, draft_probs, drafts, num_draft = _random_inputs(batch=64)
    if one_hot:
        draft_probs = None
    outs = [
        rejection_sample(target_probs, draft_probs, drafts, num_draft, _seeded(5)) for _ in range(2)
    ]
    assert _same(*outs)
    # A different seed gives a different draw somewhere in 64 rows.
    other = rejection_sample(target_probs, draft_probs, drafts, num_draft, _seeded(6))
    assert not _same(outs[0], other)


def test_default_generator_follows_torch_manual_seed():
    inputs = _random_inputs(batch=32)
    torch.manual_seed(123)
    first = rejection_sample(*inputs)
    torch.manual_seed(123)
    assert _same(first, rejection_sample(*inputs))


def _gens(seeds):
    return [None if s is None else _seeded(s) for s in seeds]


def test_per_row_generators_make_rows_independent():
    target_probs, draft_probs, drafts, num_draft = _random_inputs(batch=6, vocab=50)
    seeds = [10, 11, 12, 13, 14, 15]
    base = rejection_sample(target_probs, draft_probs, drafts, num_draft, _gens(seeds))
    # Re-seeding rows 1 and 3 (or giving them no generator) leaves every other row unchanged.
    for changed in ([10, 99, 12, 98, 14, 15], [10, None, 12, None, 14, 15]):
        other = rejection_sample(target_probs, draft_probs, drafts, num_draft, _gens(changed))
        for b in (0, 2, 4, 5):
            assert torch.equal(other.output_tokens[b], base.output_tokens[b])
            assert other.num_accepted[b] == base.num_accepted[b]
    # And each row equals that row run alone with its own seed.
    for b, seed in enumerate(seeds):
        alone = rejection_sample(
            target_probs[b : b + 1], draft_probs[b : b + 1], drafts[b : b + 1],
            num_draft[b : b + 1], _gens([seed]),
        )
        assert torch.equal(alone.output_tokens[0], base.output_tokens[b])


def test_per_row_generators_reproduce_over_many_seeds():
    """Per-row seeds must drive the draws: over many rows, some acceptance decisions differ
    between two seed sets, and the same seed set reproduces exactly."""
    target_probs, draft_probs, drafts, num_draft = _random_inputs(batch=40, ragged=False)
    a = rejection_sample(target_probs, draft_probs, drafts, None, _gens(range(40)))
    b = rejection_sample(target_probs, draft_probs, drafts, None, _gens(range(40)))
    c = rejection_sample(target_probs, draft_probs, drafts, None, _gens(range(100, 140)))
    assert _same(a, b) and not _same(a, c)


def test_per_row_generators_length_must_match():
    inputs = _random_inputs(batch=3)
    with pytest.raises(ValueError):
        rejection_sample(*inputs, generators=_gens([1, 2]))


# =========================================================================================
# Edge cases: no NaN, impossible tokens, output layout
# =========================================================================================


def test_target_equal_to_draft_accepts_everything_without_nan():
    target_probs, _, drafts, num_draft = _random_inputs(batch=500, k=4)
    draft_probs = target_probs[:, :4].clone()
    result = rejection_sample(target_probs, draft_probs, drafts, num_draft, _seeded(0))
    assert torch.equal(result.num_accepted, num_draft)
    assert bool((result.output_tokens.gather(1, num_draft[:, None]) >= 0).all())


def test_draft_token_the_target_cut_is_always_rejected():
    vocab = 10
    logits = torch.randn(1, 2, vocab, generator=_seeded(1))
    target_probs = logits_to_probs(logits, 1.0, top_k=3).expand(1000, 2, vocab)
    cut = int(torch.nonzero(target_probs[0, 0] == 0)[0])
    drafts = torch.full((1000, 1), cut)
    for draft_probs in (None, torch.full((1000, 1, vocab), 1.0 / vocab)):
        result = rejection_sample(target_probs, draft_probs, drafts, generators=_seeded(0))
        assert bool((result.num_accepted == 0).all())
        recovered = result.output_tokens[:, 0]
        assert bool((target_probs[0, 0, recovered] > 0).all())  # never a cut token, never NaN


def test_zero_residual_falls_back_instead_of_nan():
    """An unnormalised draft (target <= draft everywhere) can reject with an all-zero
    residual; the sampler must still emit a valid token."""
    target_probs = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]]).expand(2000, 2, 2)
    draft_probs = torch.tensor([[[0.6, 0.6]]]).expand(2000, 1, 2)
    drafts = torch.zeros(2000, 1, dtype=torch.int64)
    result = rejection_sample(target_probs, draft_probs, drafts, generators=_seeded(0))
    assert int((result.num_accepted == 0).sum()) > 0  # the guarded path did run
    assert set(result.output_tokens[:, 0].tolist()) <= {0, 1}


def test_output_layout():
    target_probs, draft_probs, drafts, num_draft = _random_inputs(batch=200, k=4)
    result = rejection_sample(target_probs, draft_probs, drafts, num_draft, _seeded(3))
    out, n_acc = result.output_tokens, result.num_accepted
    assert out.shape == (200, 5) and out.dtype == torch.int64 and n_acc.dtype == torch.int64
    assert bool((n_acc <= num_draft).all())
    for b in range(200):
        n = int(n_acc[b])
        assert out[b, :n].tolist() == drafts[b, :n].tolist()
        assert out[b, n] >= 0 and bool((out[b, n + 1 :] == -1).all())


def test_shape_mismatch_is_rejected():
    target_probs, draft_probs, drafts, _ = _random_inputs(batch=4, k=3)
    with pytest.raises(ValueError):
        rejection_sample(target_probs[:, :3], draft_probs, drafts)  # needs k+1 positions
    with pytest.raises(ValueError):
        rejection_sample(target_probs, draft_probs[:, :2], drafts)


def test_zero_width_drafts_sample_the_bonus():
    probs = torch.tensor([[[0.0, 1.0, 0.0]]]).expand(4, 1, 3)
    result = rejection_sample(probs, None, torch.empty(4, 0, dtype=torch.int64))
    assert result.output_tokens.tolist() == [[1]] * 4 and result.num_accepted.tolist() == [0] * 4


# =========================================================================================
# Statistical check
# =========================================================================================


@dataclass
class Case:
    name: str
    target: torch.Tensor  # [k+1, vocab] float64: the exact target distribution per position
    draft: torch.Tensor | None  # [k, vocab] float64 draft distributions; None = one-hot drafts
    fixed_drafts: Callable[[int], torch.Tensor] | None = None  # n -> [n, k] for one-hot drafts
    ragged: bool = False  # random num_draft_tokens in 0..k per row, padding -1

    @property
    def k(self) -> int:
        return self.target.shape[0] - 1

    @property
    def vocab(self) -> int:
        return self.target.shape[1]


def _floored(probs: torch.Tensor) -> torch.Tensor:
    probs = probs.clamp_min(P_FLOOR)
    return probs / probs.sum(-1, keepdim=True)


def _build_cases() -> dict[str, Case]:
    g = _seeded(2024)
    randn = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    soft = lambda z: torch.softmax(z, -1)  # noqa: E731
    cases = []

    z = 2.0 * randn(16)  # target logits; q = softmax(-z): low acceptance
    cases.append(Case("reversed_q", torch.stack([_floored(soft(z)), _floored(soft(randn(16)))]),
                      soft(-z)[None]))

    p = _floored(soft(2.0 * randn(32)))  # q concentrated on the 4 tokens p finds least likely
    q = torch.full((32,), 0.03 / 28, dtype=torch.float64)
    q[torch.argsort(p)[:4]] = 0.97 / 4
    cases.append(Case("q_on_unlikely", torch.stack([p, _floored(soft(randn(32)))]), q[None]))

    cases.append(Case("random_q", _floored(soft(1.5 * randn(2, 50))), soft(1.5 * randn(1, 50))))

    p = _floored(soft(1.5 * randn(2, 8)))
    cases.append(Case("q_equals_p", p, p[:1].clone()))

    # A greedy drafter whose argmax is always the target's second choice.
    p = _floored(soft(1.5 * randn(2, 16)))
    second = int(torch.argsort(p[0], descending=True)[1])
    cases.append(Case("one_hot_fixed", p, None, lambda n: torch.full((n, 1), second)))

    # A deterministic drafter whose proposal varies by row: token b % vocab.
    cases.append(Case("one_hot_per_row", _floored(soft(1.5 * randn(2, 16))), None,
                      lambda n: (torch.arange(n) % 16)[:, None]))

    # top-k/top-p applied identically to target and draft logits: both have cut tokens, and
    # draft tokens the target cut (p(x) = 0) occur.
    target_logits = randn(2, 32)
    draft_logits = target_logits[:1] + randn(1, 32)

    def process(logits: torch.Tensor) -> torch.Tensor:
        probs = logits_to_probs(logits, 0.8, top_k=12, top_p=0.9).double()
        return probs / probs.sum(-1, keepdim=True)  # exact in float64

    cases.append(Case("top_k_top_p", process(target_logits), process(draft_logits)))

    # k = 3, independent distributions per position: checks every position's emitted token.
    cases.append(Case("k3_random_q", _floored(soft(1.2 * randn(4, 16))), soft(1.2 * randn(3, 16))))

    # k = 3, one-hot drafts and ragged rows (0..3 drafts, bonus at num_draft_tokens). The
    # drafter proposes the target's argmax at each position in 3 rows of 4 (so that enough
    # rows reach position 3) and token (b + j) % 8 in the others.
    p = _floored(soft(1.5 * randn(4, 8)))
    greedy = p[:3].argmax(-1)

    def k3_drafts(n: int) -> torch.Tensor:
        rows = torch.arange(n)[:, None]
        cycling = (rows + torch.arange(3)) % 8
        return torch.where(rows % 4 == 0, cycling, greedy.expand(n, 3))

    cases.append(Case("k3_ragged_one_hot", p, None, k3_drafts, ragged=True))
    return {c.name: c for c in cases}


CASES = _build_cases()
K1_CASES = [name for name, c in CASES.items() if c.k == 1]


def _batched_inputs(case: Case, gen: torch.Generator):
    """N rows of one case: target/draft expanded (no copies), draft tokens drawn from q."""
    n, k, vocab = N, case.k, case.vocab
    target_probs = case.target.float().expand(n, k + 1, vocab)
    if case.draft is None:
        draft_probs, draft_tokens = None, case.fixed_drafts(n)
    else:
        draft_probs = case.draft.float().expand(n, k, vocab)
        draft_tokens = torch.multinomial(case.draft.float(), n, replacement=True, generator=gen).T
    num_draft = None
    if case.ragged:
        num_draft = torch.randint(0, k + 1, (n,), generator=gen)
        draft_tokens = draft_tokens.masked_fill(torch.arange(k) >= num_draft[:, None], -1)
    return target_probs, draft_probs, draft_tokens, num_draft


def _chisquare_pvalue(tokens: torch.Tensor, target: torch.Tensor) -> float | None:
    """Pearson chi-square of observed tokens against the exact target distribution; None
    when too few tokens for every expected count to reach MIN_EXPECTED."""
    counts = torch.bincount(tokens, minlength=target.numel()).double()
    support = target > 0
    if counts[~support].sum() > 0:
        return 0.0  # a token the target cannot produce: as wrong as it gets
    expected = counts.sum() * target[support] / target[support].sum()
    if expected.min() < MIN_EXPECTED:
        return None
    return float(scipy.stats.chisquare(counts[support].numpy(), expected.numpy()).pvalue)


def position_pvalues(sampler, case: Case, seed: int = 0) -> tuple[dict[int, float], VerifyOutput]:
    """The harness, identical for the real sampler and the broken ones: draw N rows in one
    batched call and test the token emitted at each position j among the rows that reached
    j (all rows for j = 0) against target[j]. Positions with too few rows are left out."""
    gen = _seeded(seed)
    target_probs, draft_probs, draft_tokens, num_draft = _batched_inputs(case, gen)
    out = sampler(target_probs, draft_probs, draft_tokens, num_draft, generators=gen)
    assert out.output_tokens.shape == (N, case.k + 1)
    pvalues = {}
    for j in range(case.k + 1):
        tokens = out.output_tokens[:, j]
        pvalue = _chisquare_pvalue(tokens[tokens >= 0], case.target[j])
        if pvalue is not None:
            pvalues[j] = pvalue
    return pvalues, out


def _passes(pvalues: dict[int, float]) -> bool:
    return min(pvalues.values()) >= ALPHA


@pytest.mark.parametrize("name", list(CASES))
def test_rejection_sample_is_lossless(name):
    case = CASES[name]
    pvalues, out = position_pvalues(rejection_sample, case)
    print(f"{name}: p-values by position {pvalues}")
    assert set(pvalues) == set(range(case.k + 1)), "every position must get enough rows"
    assert _passes(pvalues), pvalues
    if name == "q_equals_p":
        assert bool((out.num_accepted == case.k).all())


# =========================================================================================
# Negative controls: broken samplers that the same harness must reject
# =========================================================================================
# `_textbook` is a second, plain implementation of the exact rule (one generator, no ragged
# rows, inverse-CDF draws). Each broken sampler below is a copy of it with one bug, marked
# BUG. The textbook itself passes the harness, so each failure is due to its one bug.


def _q_or_one_hot(target_probs, draft_probs, draft_tokens):  # -> [B, k, V]
    if draft_probs is not None:
        return draft_probs
    return torch.nn.functional.one_hot(draft_tokens, target_probs.shape[-1]).float()


def _num_accepted(target_probs, q, draft_tokens, uniforms):  # -> [B]
    k = draft_tokens.shape[1]
    p_x = target_probs[:, :k].gather(-1, draft_tokens[..., None])[..., 0]
    q_x = q.gather(-1, draft_tokens[..., None])[..., 0]
    return torch.cumprod((uniforms * q_x < p_x).long(), 1).sum(1)


def _at_stop(target_probs, q, num_accepted):  # -> p [B, V], q [B, V], rejected [B]
    k = q.shape[1]
    rows = torch.arange(q.shape[0])
    q_stop = q[rows, num_accepted.clamp(max=k - 1)]  # bonus rows: any in-range index
    return target_probs[rows, num_accepted], q_stop, num_accepted < k


def _inverse_cdf(weights, uniforms):  # weights [B, V], uniforms [B] -> [B]
    """The token whose CDF interval holds u. Does not normalise: weights must sum to 1."""
    cdf = weights.double().cumsum(-1)
    index = torch.searchsorted(cdf, uniforms.double()[:, None], right=True)[:, 0]
    return index.clamp(max=weights.shape[-1] - 1)


def _emit(draft_tokens, num_accepted, token) -> VerifyOutput:
    batch, k = draft_tokens.shape
    positions = torch.arange(k + 1)[None]
    padded = torch.cat([draft_tokens, torch.full((batch, 1), -1)], 1)
    out = torch.where(positions < num_accepted[:, None], padded, -1)
    return VerifyOutput(out.scatter(1, num_accepted[:, None], token[:, None]), num_accepted)


def _textbook(target_probs, draft_probs, draft_tokens, num_draft_tokens=None, generators=None):
    """The exact rule, plainly: accept while u * q(x) < p(x), then draw from the normalised
    residual (rejected) or the target (bonus) at the stop position with a fresh uniform."""
    assert num_draft_tokens is None
    q = _q_or_one_hot(target_probs, draft_probs, draft_tokens)
    uniforms = torch.rand(draft_tokens.shape, generator=generators)
    n = _num_accepted(target_probs, q, draft_tokens, uniforms)
    p_stop, q_stop, rejected = _at_stop(target_probs, q, n)
    residual = (p_stop - q_stop).clamp_min(0)
    final = torch.where(rejected[:, None], residual / residual.sum(-1, keepdim=True), p_stop)
    return _emit(draft_tokens, n, _inverse_cdf(final, torch.rand(n.shape, generator=generators)))


def broken_resample_from_target(
    target_probs, draft_probs, draft_tokens, num_draft_tokens=None, generators=None
):
    q = _q_or_one_hot(target_probs, draft_probs, draft_tokens)
    uniforms = torch.rand(draft_tokens.shape, generator=generators)
    n = _num_accepted(target_probs, q, draft_tokens, uniforms)
    p_stop, q_stop, rejected = _at_stop(target_probs, q, n)
    final = p_stop  # BUG: a rejection resamples from the target, not the residual
    return _emit(draft_tokens, n, _inverse_cdf(final, torch.rand(n.shape, generator=generators)))


def broken_resample_from_draft(
    target_probs, draft_probs, draft_tokens, num_draft_tokens=None, generators=None
):
    q = _q_or_one_hot(target_probs, draft_probs, draft_tokens)
    uniforms = torch.rand(draft_tokens.shape, generator=generators)
    n = _num_accepted(target_probs, q, draft_tokens, uniforms)
    p_stop, q_stop, rejected = _at_stop(target_probs, q, n)
    final = torch.where(rejected[:, None], q_stop, p_stop)  # BUG: resamples from the draft
    return _emit(draft_tokens, n, _inverse_cdf(final, torch.rand(n.shape, generator=generators)))


def broken_softmax_of_residual(
    target_probs, draft_probs, draft_tokens, num_draft_tokens=None, generators=None
):
    q = _q_or_one_hot(target_probs, draft_probs, draft_tokens)
    uniforms = torch.rand(draft_tokens.shape, generator=generators)
    n = _num_accepted(target_probs, q, draft_tokens, uniforms)
    p_stop, q_stop, rejected = _at_stop(target_probs, q, n)
    residual = (p_stop - q_stop).clamp_min(0)
    # BUG: softmax treats the residual as logits instead of normalising it
    final = torch.where(rejected[:, None], torch.softmax(residual, -1), p_stop)
    return _emit(draft_tokens, n, _inverse_cdf(final, torch.rand(n.shape, generator=generators)))


def broken_always_accept(
    target_probs, draft_probs, draft_tokens, num_draft_tokens=None, generators=None
):
    q = _q_or_one_hot(target_probs, draft_probs, draft_tokens)
    k = draft_tokens.shape[1]
    n = torch.full((draft_tokens.shape[0],), k)  # BUG: no acceptance test
    p_stop, q_stop, rejected = _at_stop(target_probs, q, n)
    residual = (p_stop - q_stop).clamp_min(0)
    final = torch.where(rejected[:, None], residual / residual.sum(-1, keepdim=True), p_stop)
    return _emit(draft_tokens, n, _inverse_cdf(final, torch.rand(n.shape, generator=generators)))


def broken_unnormalised_residual(
    target_probs, draft_probs, draft_tokens, num_draft_tokens=None, generators=None
):
    q = _q_or_one_hot(target_probs, draft_probs, draft_tokens)
    uniforms = torch.rand(draft_tokens.shape, generator=generators)
    n = _num_accepted(target_probs, q, draft_tokens, uniforms)
    p_stop, q_stop, rejected = _at_stop(target_probs, q, n)
    residual = (p_stop - q_stop).clamp_min(0)
    # BUG: the residual's mass is 1 - acceptance < 1, but the inverse-CDF draw uses it as a
    # probability vector: a uniform above the mass runs off the end and is clamped to the
    # last token.
    final = torch.where(rejected[:, None], residual, p_stop)
    return _emit(draft_tokens, n, _inverse_cdf(final, torch.rand(n.shape, generator=generators)))


def broken_reused_uniform(
    target_probs, draft_probs, draft_tokens, num_draft_tokens=None, generators=None
):
    q = _q_or_one_hot(target_probs, draft_probs, draft_tokens)
    uniforms = torch.rand(draft_tokens.shape, generator=generators)
    n = _num_accepted(target_probs, q, draft_tokens, uniforms)
    p_stop, q_stop, rejected = _at_stop(target_probs, q, n)
    residual = (p_stop - q_stop).clamp_min(0)
    final = torch.where(rejected[:, None], residual / residual.sum(-1, keepdim=True), p_stop)
    fresh = torch.rand(n.shape, generator=generators)
    k = draft_tokens.shape[1]
    # BUG: a rejected row reuses the uniform that rejected it (known to be >= p/q).
    rejecting = uniforms.gather(1, n.clamp(max=k - 1)[:, None])[:, 0]
    return _emit(draft_tokens, n, _inverse_cdf(final, torch.where(rejected, rejecting, fresh)))


def broken_bonus_position(
    target_probs, draft_probs, draft_tokens, num_draft_tokens=None, generators=None
):
    q = _q_or_one_hot(target_probs, draft_probs, draft_tokens)
    uniforms = torch.rand(draft_tokens.shape, generator=generators)
    n = _num_accepted(target_probs, q, draft_tokens, uniforms)
    p_stop, q_stop, rejected = _at_stop(target_probs, q, n)
    residual = (p_stop - q_stop).clamp_min(0)
    bonus = target_probs[torch.arange(n.shape[0]), n - 1]  # BUG: bonus read at the last draft
    final = torch.where(rejected[:, None], residual / residual.sum(-1, keepdim=True), bonus)
    return _emit(draft_tokens, n, _inverse_cdf(final, torch.rand(n.shape, generator=generators)))


# --- exact output distributions, to show each (control, case) pair has a real error -----
# For k = 1, the first emitted token: a draft x (drawn with weight w(x)) is accepted with
# probability a(x), otherwise the token comes from the recovery distribution. Each rule
# returns (a, recovery) in float64 for one draft x.


def _ratio(p, q, x):
    return min(1.0, float(p[x] / q[x])) if q[x] > 0 else 1.0


def _normalised_residual(p, q):
    r = (p - q).clamp_min(0)
    return r / r.sum() if r.sum() > 0 else r  # zero only when p == q: never used then


def _after_reused_uniform(dist, a):
    """Inverse-CDF draw from dist with a uniform known to lie in [a, 1)."""
    upper = dist.cumsum(0)
    lower = upper - dist
    return (torch.minimum(upper, torch.tensor(1.0)) - lower.clamp_min(a)).clamp_min(0) / (1 - a)


def _unnormalised(p, q):
    r = (p - q).clamp_min(0)
    r[-1] += 1 - r.sum()
    return r


EXACT_RULES = {
    _textbook: lambda p, q, x: (_ratio(p, q, x), _normalised_residual(p, q)),
    broken_resample_from_target: lambda p, q, x: (_ratio(p, q, x), p),
    broken_resample_from_draft: lambda p, q, x: (_ratio(p, q, x), q),
    broken_softmax_of_residual: lambda p, q, x: (
        _ratio(p, q, x), torch.softmax((p - q).clamp_min(0), 0)
    ),
    broken_always_accept: lambda p, q, x: (1.0, torch.zeros_like(p)),
    broken_unnormalised_residual: lambda p, q, x: (_ratio(p, q, x), _unnormalised(p, q)),
    broken_reused_uniform: lambda p, q, x: (
        _ratio(p, q, x),
        _after_reused_uniform(_normalised_residual(p, q), _ratio(p, q, x))
        if _ratio(p, q, x) < 1 else torch.zeros_like(p),
    ),
}


def exact_first_token(sampler, case: Case) -> torch.Tensor:  # [vocab] float64
    p, vocab = case.target[0], case.vocab
    eye = torch.eye(vocab, dtype=torch.float64)
    if case.draft is None:
        weights = torch.bincount(case.fixed_drafts(N)[:, 0], minlength=vocab).double() / N
    else:
        weights = case.draft[0]
    out = torch.zeros(vocab, dtype=torch.float64)
    for x in range(vocab):
        if weights[x] > 0:
            q = eye[x] if case.draft is None else case.draft[0]
            accept, recovery = EXACT_RULES[sampler](p, q, x)
            out += weights[x] * (accept * eye[x] + (1 - accept) * recovery)
    return out


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


# (broken sampler, case, position expected to fail). Every pair has an exact TV error
# >= 0.01 (checked by test_each_control_case_has_a_real_error).
CONTROLS = [
    (broken_resample_from_target, "reversed_q", 0),
    (broken_resample_from_target, "random_q", 0),
    (broken_resample_from_target, "one_hot_fixed", 0),
    (broken_resample_from_target, "top_k_top_p", 0),
    (broken_resample_from_draft, "reversed_q", 0),
    (broken_resample_from_draft, "one_hot_per_row", 0),
    (broken_resample_from_draft, "top_k_top_p", 0),
    (broken_softmax_of_residual, "reversed_q", 0),
    (broken_softmax_of_residual, "q_on_unlikely", 0),
    (broken_softmax_of_residual, "one_hot_fixed", 0),
    (broken_always_accept, "q_on_unlikely", 0),
    (broken_always_accept, "random_q", 0),
    (broken_unnormalised_residual, "reversed_q", 0),
    (broken_unnormalised_residual, "one_hot_per_row", 0),
    (broken_unnormalised_residual, "top_k_top_p", 0),
    (broken_reused_uniform, "reversed_q", 0),
    (broken_reused_uniform, "random_q", 0),
    (broken_reused_uniform, "one_hot_fixed", 0),
    (broken_bonus_position, "k3_random_q", 3),
]
MIN_TV = 0.01


def _control_id(control):
    sampler, case, _ = control
    return f"{sampler.__name__.removeprefix('broken_')}-{case}"


@pytest.mark.parametrize("name", K1_CASES)
def test_exact_model_of_the_textbook_rule_is_lossless(name):
    """The exact-distribution model used below reproduces the target for the correct rule."""
    assert total_variation(exact_first_token(_textbook, CASES[name]), CASES[name].target[0]) < 1e-9


@pytest.mark.parametrize("name", K1_CASES + ["k3_random_q"])
def test_textbook_sampler_passes_the_harness(name):
    pvalues, _ = position_pvalues(_textbook, CASES[name])
    print(f"textbook {name}: {pvalues}")
    assert _passes(pvalues), pvalues


@pytest.mark.parametrize("control", CONTROLS, ids=_control_id)
def test_each_control_case_has_a_real_error(control):
    sampler, name, position = control
    case = CASES[name]
    if sampler is broken_bonus_position:  # the bonus at position k comes from target[k-1]
        tv = total_variation(case.target[case.k - 1], case.target[case.k])
    else:
        tv = total_variation(exact_first_token(sampler, case), case.target[0])
    print(f"{_control_id(control)}: exact TV error {tv:.4f}")
    assert tv >= MIN_TV


@pytest.mark.parametrize("control", CONTROLS, ids=_control_id)
def test_negative_control_fails_the_harness(control):
    sampler, name, position = control
    pvalues, _ = position_pvalues(sampler, CASES[name])
    print(f"{_control_id(control)}: p-values by position {pvalues}")
    assert pvalues[position] < ALPHA, pvalues
    assert not _passes(pvalues)
