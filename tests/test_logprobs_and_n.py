"""Logprobs with speculation equal plain decoding's bit for bit; n completions and per-prompt
SamplingParams through LLM.generate's batch."""

import math

import pytest
import torch

from verispec import LLM, SamplingParams
from verispec.errors import InvalidSamplingParamsError

PROMPTS = [[1, 20, 21, 22, 20, 21, 22, 20], [1, 9, 8, 7, 9, 8, 7], [1, 40, 41, 42, 43]]


@pytest.fixture(scope="module")
def llms(tiny_dir):
    target, draft = tiny_dir("llama", seed=0), tiny_dir("llama", seed=7)
    common = {"num_speculative_tokens": 4, "adaptive_k": False}
    out = {}
    for mode in ("raw_logprobs", "processed_logprobs"):
        out[mode] = {
            "plain": LLM(str(target), logprobs_mode=mode),
            "prompt_lookup": LLM(str(target), logprobs_mode=mode, speculative={"method": "prompt_lookup", **common}),
            "draft_model": LLM(str(target), logprobs_mode=mode,
                               speculative={"method": "draft_model", "draft_model": str(draft), **common}),
            "self": LLM(str(target), logprobs_mode=mode,
                        speculative={"method": "draft_model", "draft_model": str(target), **common}),
        }
    return out


def flat(outs):
    return [[(lp.token_id, lp.logprob, lp.rank, lp.top) for lp in o.outputs[0].logprobs] for o in outs]


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
@pytest.mark.parametrize("extra", [{}, {"frequency_penalty": 1.0, "logit_bias": {20: 2.0}}])
def test_greedy_logprobs_identical_to_plain(llms, mode, extra):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=3, prompt_logprobs=2, **extra)
    ref = llms[mode]["plain"].generate(PROMPTS, params)
    for o in ref:
        assert len(o.outputs[0].logprobs) == len(o.token_ids)
        assert o.prompt_logprobs[0] is None and len(o.prompt_logprobs) == len(o.prompt_token_ids)
        for lp in o.outputs[0].logprobs:
            assert lp.top[0][0] == lp.token_id or extra  # greedy picks the raw argmax without processing
            assert len(lp.top) == 3 and lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]
            assert lp.logprob <= 0 and lp.rank >= 1
    for name, llm in llms[mode].items():
        outs = llm.generate(PROMPTS, params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
        assert flat(outs) == flat(ref), name  # exact floats
        assert [[None if p is None else (p.token_id, p.logprob) for p in o.prompt_logprobs] for o in outs] == \
               [[None if p is None else (p.token_id, p.logprob) for p in o.prompt_logprobs] for o in ref]


def test_raw_logprob_is_the_log_softmax_of_the_target(llms):
    llm = llms["raw_logprobs"]["plain"]
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=0))[0]
    seq = llm.runner.open(32)
    logits = llm.runner.forward(seq, PROMPTS[0], 1).logits[0]
    llm.runner.close(seq)
    first = out.outputs[0].logprobs[0]
    assert first.logprob == pytest.approx(float(torch.log_softmax(logits, -1)[out.token_ids[0]]), abs=1e-6)
    assert first.top == [] and first.rank == 1


def test_sampled_processed_logprobs_are_of_the_sampling_distribution(llms):
    params = SamplingParams(temperature=0.8, top_k=5, seed=3, max_tokens=16, ignore_eos=True, logprobs=6)
    for llm in llms["processed_logprobs"].values():
        out = llm.generate([PROMPTS[0]], params)[0]
        for lp in out.outputs[0].logprobs:
            assert math.isfinite(lp.logprob) and lp.rank <= 5  # drawn inside the top-k
            assert lp.top[5][1] == float("-inf")  # the sixth is cut by top-k
            assert sum(math.exp(v) for _, v in lp.top[:5]) == pytest.approx(1.0, abs=1e-5)


def test_n_completions_are_seeded_children(llms):
    llm = llms["raw_logprobs"]["prompt_lookup"]
    params = SamplingParams(temperature=1.0, seed=5, n=3, max_tokens=12, ignore_eos=True)
    out = llm.generate([PROMPTS[0]], params)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    singles = [llm.generate([PROMPTS[0]], SamplingParams(temperature=1.0, seed=5 + i, max_tokens=12, ignore_eos=True))[0]
               for i in range(3)]
    assert [c.token_ids for c in out.outputs] == [s.token_ids for s in singles]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1


def test_per_prompt_params_and_batch_equal_one_by_one(llms):
    llm = llms["raw_logprobs"]["self"]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (5, 9, 13)]
    together = llm.generate(PROMPTS, params)
    assert [len(o.token_ids) for o in together] == [5, 9, 13]
    alone = [llm.generate([p], q)[0] for p, q in zip(PROMPTS, params)]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    with pytest.raises(InvalidSamplingParamsError, match="one per prompt"):
        llm.generate(PROMPTS, params[:2])
