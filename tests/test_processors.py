"""Tests for verispec.sampling.processors: temperature, top-k, top-p, and seeded sampling."""

import pytest
import torch

from verispec.errors import InvalidSamplingParamsError
from verispec.sampling.processors import logits_to_probs, sample_from_probs


def _kept(probs: torch.Tensor) -> list[int]:
    return torch.nonzero(probs > 0).flatten().tolist()


# --- temperature -------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.25, 0.7, 1.0, 2.5])
def test_temperature_divides_logits(temperature):
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    expected = torch.softmax(logits / temperature, dim=-1)
    torch.testing.assert_close(logits_to_probs(logits, temperature), expected)


def test_lower_temperature_is_sharper():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    cold, hot = logits_to_probs(logits, 0.5), logits_to_probs(logits, 2.0)
    assert cold[0] > hot[0] and cold[-1] < hot[-1]


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_non_positive_temperature_is_rejected(bad):
    with pytest.raises(InvalidSamplingParamsError):
        logits_to_probs(torch.zeros(4), bad)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_top_p_out_of_range_is_rejected(bad):
    with pytest.raises(InvalidSamplingParamsError):
        logits_to_probs(torch.zeros(4), 1.0, top_p=bad)


# --- top-k -------------------------------------------------------------------------------


@pytest.mark.parametrize("top_k", [1, 3, 7])
def test_top_k_keeps_exactly_k_largest(top_k):
    logits = torch.randn(5, 20, generator=torch.Generator().manual_seed(1))
    probs = logits_to_probs(logits, 1.0, top_k=top_k)
    for row_logits, row_probs in zip(logits, probs):
        assert sorted(_kept(row_probs)) == sorted(torch.topk(row_logits, top_k).indices.tolist())
        # Renormalised softmax over the kept logits.
        kept = row_probs > 0
        torch.testing.assert_close(row_probs[kept], torch.softmax(row_logits[kept], dim=-1))


def test_top_k_ties_keep_lowest_ids_deterministically():
    logits = torch.tensor([1.0, 2.0, 2.0, 2.0, 0.0])
    probs = logits_to_probs(logits, 1.0, top_k=2)
    assert _kept(probs) == [1, 2]
    torch.testing.assert_close(probs, torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0]))
    # Same answer every time, and in a batch of other rows.
    batch = torch.stack([torch.randn(5), logits, torch.zeros(5)])
    for _ in range(3):
        assert _kept(logits_to_probs(batch, 1.0, top_k=2)[1]) == [1, 2]
    # All tied: the first k ids.
    assert _kept(logits_to_probs(torch.zeros(6), 1.0, top_k=3)) == [0, 1, 2]


@pytest.mark.parametrize("off", [0, -1, 5, 100])
def test_top_k_off_values(off):
    logits = torch.tensor([0.3, -1.0, 2.0, 0.0, 1.0])
    torch.testing.assert_close(logits_to_probs(logits, 1.0, top_k=off), torch.softmax(logits, -1))


# --- top-p -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "top_p, kept",
    [(0.1, [0]), (0.49, [0]), (0.51, [0, 1]), (0.79, [0, 1]), (0.81, [0, 1, 2]),
     (0.96, [0, 1, 2, 3]), (1.0, [0, 1, 2, 3])],
)
def test_top_p_keeps_smallest_prefix_reaching_p(top_p, kept):
    probs_in = torch.tensor([0.5, 0.3, 0.15, 0.05])
    # Shuffle the ids so the test does not rely on the input being sorted.
    perm = torch.tensor([2, 0, 3, 1])
    logits = probs_in.log()[perm]  # id j holds probs_in[perm[j]]
    probs = logits_to_probs(logits, 1.0, top_p=top_p)
    id_of_rank = {int(perm[j]): j for j in range(4)}
    assert sorted(_kept(probs)) == sorted(id_of_rank[r] for r in kept)
    expected = torch.zeros(4)
    mass = probs_in[kept].sum()
    for r in kept:
        expected[id_of_rank[r]] = probs_in[r] / mass
    torch.testing.assert_close(probs, expected)


def test_top_p_always_keeps_the_top_token():
    probs = logits_to_probs(torch.tensor([0.0, 0.0, 5.0, 0.0]), 1.0, top_p=1e-6)
    torch.testing.assert_close(probs, torch.tensor([0.0, 0.0, 1.0, 0.0]))


def test_top_p_ties_keep_lowest_ids():
    # Four tokens at 0.25 each, top_p = 0.45: two are enough, the two lowest ids are kept.
    assert _kept(logits_to_probs(torch.zeros(4), 1.0, top_p=0.45)) == [0, 1]


def test_top_p_applies_after_top_k_on_renormalised_probs():
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    # top_k=2 renormalises to [0.571, 0.429]; top_p=0.6 needs both (0.571 < 0.6).
    probs = logits_to_probs(logits, 1.0, top_k=2, top_p=0.6)
    torch.testing.assert_close(probs, torch.tensor([0.4, 0.3, 0.0, 0.0]) / 0.7)
    # top_p=0.55: the renormalised top token (0.571) reaches it alone. On the untruncated
    # distribution (0.4 < 0.55) it would have kept two tokens.
    probs = logits_to_probs(logits, 1.0, top_k=2, top_p=0.55)
    torch.testing.assert_close(probs, torch.tensor([1.0, 0.0, 0.0, 0.0]))


def test_temperature_applies_before_top_p():
    logits = torch.tensor([1.0, 0.0, -1.0])
    # T=1: [0.665, 0.245, 0.090] -> top_p=0.7 keeps 2. T=0.25: [0.982, ...] keeps 1.
    assert _kept(logits_to_probs(logits, 1.0, top_p=0.7)) == [0, 1]
    assert _kept(logits_to_probs(logits, 0.25, top_p=0.7)) == [0]


# --- shapes and dtypes -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_batched_rows_are_independent_and_sum_to_one(dtype):
    logits = torch.randn(3, 4, 33, generator=torch.Generator().manual_seed(2)).to(dtype)
    probs = logits_to_probs(logits, 0.8, top_k=10, top_p=0.9)
    assert probs.dtype == torch.float32 and probs.shape == (3, 4, 33)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 4))
    for b in range(3):
        for i in range(4):
            row = logits_to_probs(logits[b, i], 0.8, top_k=10, top_p=0.9)
            torch.testing.assert_close(probs[b, i], row)
            assert 1 <= len(_kept(row)) <= 10


# --- sample_from_probs -------------------------------------------------------------------


def _probs(batch: int = 6, vocab: int = 40) -> torch.Tensor:
    return torch.softmax(torch.randn(batch, vocab, generator=torch.Generator().manual_seed(3)), -1)


def test_sample_shape_dtype_and_support():
    probs = _probs()
    probs[:, ::2] = 0.0  # only odd ids possible
    tokens = sample_from_probs(probs, torch.Generator().manual_seed(0))
    assert tokens.shape == (6,) and tokens.dtype == torch.int64
    assert bool((tokens % 2 == 1).all())


def test_sample_single_generator_is_reproducible():
    probs = _probs()
    first = sample_from_probs(probs, torch.Generator().manual_seed(7))
    again = sample_from_probs(probs, torch.Generator().manual_seed(7))
    assert torch.equal(first, again)


def test_sample_default_generator_follows_manual_seed():
    probs = _probs()
    torch.manual_seed(11)
    first = sample_from_probs(probs)
    torch.manual_seed(11)
    assert torch.equal(first, sample_from_probs(probs))


def test_sample_per_row_generators_are_independent():
    probs = _probs(batch=4, vocab=1000)
    gens = lambda seeds: [torch.Generator().manual_seed(s) for s in seeds]  # noqa: E731
    base = sample_from_probs(probs, gens([1, 2, 3, 4]))
    # Row b depends on generators[b] alone.
    other = sample_from_probs(probs, gens([1, 99, 3, 98]))
    assert base[0] == other[0] and base[2] == other[2]
    for b, seed in enumerate([1, 2, 3, 4]):
        alone = sample_from_probs(probs[b : b + 1], gens([seed]))
        assert alone[0] == base[b]
    # None entries use the default generator; the seeded rows are unaffected.
    mixed = sample_from_probs(probs, [gens([1])[0], None, gens([3])[0], None])
    assert mixed[0] == base[0] and mixed[2] == base[2]


def test_sample_per_row_generators_length_must_match():
    with pytest.raises(ValueError):
        sample_from_probs(_probs(batch=3), [torch.Generator(), torch.Generator()])
