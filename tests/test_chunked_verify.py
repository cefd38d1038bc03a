"""Verification chunk by chunk (the batch-invariant torch backend): a greedy request stops at the
chunk that holds its first rejected draft; outputs stay plain decoding's."""

import pytest
import torch

from verispec import LLM, SamplingParams
from verispec.engine.policy import SpeculationPolicy
from verispec.engine.decoder import SpeculativeDecoder
from verispec.models.decoder.transformer import invariant_chunks
from verispec.proposers.base import Draft, Proposer


class FixedDrafter(Proposer):
    """Drafts that the target rejects at once (a token it never predicts) or, with `oracle` (the
    target's plain greedy output), its own continuation (every draft accepted)."""

    def __init__(self, oracle_tokens: list[int] | None = None, bad: int = 5) -> None:
        self.oracle = oracle_tokens
        self.bad = bad

    def propose(self, seq, budget):
        k = budget.pays("")
        if self.oracle is None:
            return Draft(tokens=[self.bad] * k)
        done = len(seq.tokens) - seq.num_prompt_tokens
        return Draft(tokens=self.oracle[done : done + k])


def rows_per_call(runner):
    """Wrap runner.forward_batch: the list of row counts it is called with, per call."""
    calls = []
    real = runner.forward_batch

    def spy(items):
        calls.append(sum(len(it.tokens) for it in items))
        return real(items)

    runner.forward_batch = spy
    return calls


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return str(tiny_dir("llama", seed=0))


PROMPT = [1, 7, 9, 11, 13, 7, 9, 11]


def plain_tokens(path, params):
    return LLM(path).generate([PROMPT], params)[0].token_ids


def chunks_of_nine(runner, products) -> list[int]:
    """9 rows in the runner's passes: the kernel's 8 and 1 by construction; MKL's products of the
    width its load-time probe found on this CPU (3 where measured so far)."""
    if products != "mkl":
        return [8, 1]
    return invariant_chunks(9, runner.model.invariant_width)


def test_a_rejected_first_chunk_ends_the_verification(tiny, products):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ref = plain_tokens(tiny, params)
    runner = LLM(tiny).runner
    bad = next(t for t in range(3, 96) if t not in ref)  # never the target's choice
    chunks = chunks_of_nine(runner, products)
    assert runner.verify_chunks(9) == chunks
    calls = rows_per_call(runner)
    out = SpeculativeDecoder(runner, FixedDrafter(bad=bad), num_speculative_tokens=8).generate(PROMPT, params)
    assert out.output_ids == ref
    steps = calls  # the prefill goes through runner.forward
    # one forward a step, over only the first chunk of [pending] + drafts (k shrinks near max_tokens)
    assert len(steps) == out.metrics.num_target_forwards - 1 and steps[0] == chunks[0] and max(steps) == chunks[0]
    # batch invariance off: one forward over all 9 rows each step
    fast = LLM(tiny, batch_invariant=False).runner
    assert fast.verify_chunks(9) == [9]
    calls = rows_per_call(fast)
    SpeculativeDecoder(fast, FixedDrafter(bad=bad), num_speculative_tokens=8).generate(PROMPT, params)
    assert max(calls) == 9


def test_accepted_chunks_go_on_to_the_next(tiny, products):
    params = SamplingParams(temperature=0.0, max_tokens=19, ignore_eos=True)
    ref = plain_tokens(tiny, params)
    runner = LLM(tiny).runner
    calls = rows_per_call(runner)
    out = SpeculativeDecoder(runner, FixedDrafter(oracle_tokens=ref), num_speculative_tokens=8).generate(PROMPT, params)
    assert out.output_ids == ref
    chunks = chunks_of_nine(runner, products)
    assert calls[:len(chunks)] == chunks  # a whole first verification, chunk after chunk
    assert out.metrics.num_accepted_tokens == 18 - out.metrics.num_target_forwards + 1
    assert out.metrics.num_target_forwards <= 4  # 18 tokens after the first, up to 9 a forward


def test_sampled_requests_verify_every_chunk(tiny, products):
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=16, ignore_eos=True)
    runner = LLM(tiny).runner
    calls = rows_per_call(runner)
    SpeculativeDecoder(runner, FixedDrafter(bad=5), num_speculative_tokens=8).generate(PROMPT, params)
    chunks = chunks_of_nine(runner, products)
    assert calls[:len(chunks)] == chunks  # all of [pending] + 8 drafts although the first draft fails


def test_policy_weighs_the_chunks_it_may_skip():
    policy = SpeculationPolicy(8, cost=lambda n: float(n), chunks=lambda n: [3] * (n // 3) + ([n % 3] if n % 3 else []))
    assert policy.step_cost(9, 0.8, early_exit=False) == 9.0
    assert policy.step_cost(9, 0.8, early_exit=True) == pytest.approx(3.0 * (1 + 0.8**3 + 0.8**6))
    assert policy.step_cost(4, 0.5, early_exit=True) == pytest.approx(3.0 + 1.0 * 0.5**3)
    for a in (0.5, 0.7, 0.9):
        assert policy.best_k(a, early_exit=True) >= policy.best_k(a)
    assert SpeculationPolicy(8, cost=lambda n: float(n)).step_cost(9, 0.8, early_exit=True) == 9.0  # no chunks
