"""Sampling through the whole engine: the second output token of speculative decoding follows the
target's exact distribution (draft model with top-k/top-p, so q must be processed like p; suffix
decoding's one-hot drafts), and seeds reproduce runs exactly."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from verispec import LLM, SamplingParams
from verispec.sampling.processors import logits_to_probs

PROMPT = [1, 20, 21, 22, 20, 21]
TEMP, TOP_K, TOP_P = 0.9, 12, 0.9


def exact_second_token_distribution(llm):
    """P(t2) = sum over t1 of P(t1 | prompt) P(t2 | prompt, t1), both processed like the engine."""
    runner = llm.runner
    seq = runner.open(len(PROMPT) + 2)
    logits = runner.forward(seq, PROMPT, 1).logits
    p1 = logits_to_probs(logits, TEMP, TOP_K, TOP_P)[0]  # [vocab]
    p2 = torch.zeros_like(p1)
    for t1 in torch.nonzero(p1).flatten().tolist():
        runner.truncate(seq, len(PROMPT))
        nxt = runner.forward(seq, [t1], 1).logits
        p2 += p1[t1] * logits_to_probs(nxt, TEMP, TOP_K, TOP_P)[0]
    runner.close(seq)
    return p2.double().numpy()


@pytest.fixture(scope="module", params=["draft_model", "suffix"])
def spec_llm(tiny_dir, request):
    """A draft model (soft draft probabilities), or suffix decoding: one-hot drafts from the
    request's own text (PROMPT repeats "20 21") and, unseeded, from the earlier samples."""
    spec = {"method": request.param, "num_speculative_tokens": 3, "adaptive_k": False}
    if request.param == "draft_model":
        spec["draft_model"] = str(tiny_dir("llama", seed=7))
    return LLM(str(tiny_dir("llama", seed=0)), speculative=spec)


def test_second_token_matches_target_distribution(spec_llm):
    exact = exact_second_token_distribution(spec_llm)
    n = 2500
    params = [SamplingParams(temperature=TEMP, top_k=TOP_K, top_p=TOP_P, seed=s, max_tokens=5, ignore_eos=True) for s in range(n)]
    counts = np.zeros_like(exact)
    accepted = drafted = 0
    for p in params:
        out = spec_llm.generate([PROMPT], p)[0]
        counts[out.token_ids[1]] += 1
        accepted += out.metrics.num_accepted_tokens
        drafted += out.metrics.num_draft_tokens
    assert 0 < accepted < drafted  # both the accept and the residual paths ran
    # bins with expected count >= 10, the rest pooled into "other"
    big = exact * n >= 10
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(exact[big] * n, exact[~big].sum() * n)
    assert counts[exact == 0].sum() == 0  # never a token the processed target rules out
    pvalue = chisquare(obs, exp * obs.sum() / exp.sum()).pvalue  # exp sums to n up to float error
    assert pvalue > 1e-6, f"speculative sampling deviates from the target: p = {pvalue:.2e}"


def test_seeds_reproduce(spec_llm, tiny_dir):
    plain = LLM(str(tiny_dir("llama", seed=0)))
    for llm in (spec_llm, plain):
        a = llm.generate([PROMPT], SamplingParams(temperature=1.0, seed=123, max_tokens=24, ignore_eos=True))[0]
        b = llm.generate([PROMPT], SamplingParams(temperature=1.0, seed=123, max_tokens=24, ignore_eos=True))[0]
        c = llm.generate([PROMPT], SamplingParams(temperature=1.0, seed=124, max_tokens=24, ignore_eos=True))[0]
        assert a.token_ids == b.token_ids
        assert a.token_ids != c.token_ids
