"""Logit bias, penalties, min-p and structured outputs with speculation on: greedy output identical
to plain decoding, sampled output distributed as plain decoding's, with negative controls that
break each rule the engine relies on and must be caught."""

import json
import re

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from verispec import LLM, SamplingParams
from verispec.config import StructuredOutputsParams
from verispec.engine.logits import LogitsProcessor
from verispec.engine.decoder import SpeculativeDecoder
from verispec.errors import InvalidGrammarError, InvalidSamplingParamsError
from verispec.sampling.penalties import apply_penalties
from verispec.sampling.processors import logits_to_probs

PROMPT = [1, 20, 21, 22, 20, 21]
PENALTIES = dict(presence_penalty=1.5, frequency_penalty=2.0, repetition_penalty=1.5, logit_bias={20: 2.0, 5: -100})
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer"},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "n", "ok"], "additionalProperties": False}


def test_penalties_worked_example():
    row = torch.tensor([2.0, -1.0, 0.5])
    from collections import Counter

    apply_penalties(row, Counter({0: 2, 1: 1}), {0, 1, 2}, presence=0.1, frequency=0.5, repetition=2.0)
    assert torch.allclose(row, torch.tensor([-0.1, -2.6, 0.25]))


def test_min_p_drops_tokens_below_its_share_of_the_top():
    probs = logits_to_probs(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 1.0, min_p=0.2)[0]
    assert probs[3] == 0 and probs[2] > 0  # 0.05 < 0.2 * 0.5 <= 0.15
    assert torch.allclose(probs[:3], torch.tensor([0.5, 0.3, 0.15]) / 0.95)


def test_bad_values_are_typed_errors(tiny_dir):
    for bad in (dict(presence_penalty=3.0), dict(repetition_penalty=0.0), dict(min_p=1.5), dict(n=0),
                dict(logprobs=21), dict(logit_bias={"x": 1.0}), dict(logit_bias={3: 101})):
        with pytest.raises(InvalidSamplingParamsError):
            SamplingParams(**bad)
    with pytest.raises(InvalidSamplingParamsError):
        StructuredOutputsParams(regex="a", choice=["b"])  # two constraints
    llm = LLM(str(tiny_dir("llama", seed=0)))
    with pytest.raises(InvalidSamplingParamsError, match="out of the vocabulary"):
        llm.generate([PROMPT], SamplingParams(logit_bias={96: 1.0}))


def spec_llms(target, draft):
    """Each drafter kind over one target: deterministic drafts (prompt lookup, suffix), a draft
    model's sampled drafts, and the target drafting for itself (long accepted runs, bonus tokens)."""
    common = {"num_speculative_tokens": 4, "adaptive_k": False}
    return {
        "prompt_lookup": LLM(str(target), speculative={"method": "prompt_lookup", **common}),
        "suffix": LLM(str(target), speculative={"method": "suffix", **common}),
        "draft_model": LLM(str(target), speculative={"method": "draft_model", "draft_model": str(draft), **common}),
        "self": LLM(str(target), speculative={"method": "draft_model", "draft_model": str(target), **common}),
    }


def test_greedy_with_penalties_identical_to_plain(tiny_dir):
    target, draft = tiny_dir("llama", seed=0), tiny_dir("llama", seed=7)
    plain = LLM(str(target))
    prompts = [PROMPT, [1, 30, 31, 30, 31, 30], [1, 9, 8, 7, 9, 8, 7, 9]]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, **PENALTIES)
    ref = [o.token_ids for o in plain.generate(prompts, params)]
    unpenalised = [o.token_ids for o in plain.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))]
    assert ref != unpenalised  # the processing changes the output
    assert all(5 not in r for r in ref)  # a -100 bias rules a token out
    for name, llm in spec_llms(target, draft).items():
        outs = llm.generate(prompts, params)
        assert [o.token_ids for o in outs] == ref, name
        if name == "self":
            assert sum(o.metrics.num_accepted_tokens for o in outs) > 0


@pytest.fixture(scope="module")
def byte_models(tiny_dir):
    """Tiny random models with a byte-level BPE tokenizer, which llguidance reads."""
    return tiny_dir("llama", seed=0, vocab=320, tokenizer="bytes"), tiny_dir("llama", seed=7, vocab=320, tokenizer="bytes")


def test_greedy_structured_identical_to_plain_and_valid(byte_models):
    target, draft = byte_models
    plain = LLM(str(target))
    kinds = [StructuredOutputsParams(json=SCHEMA), StructuredOutputsParams(json_object=True),
             StructuredOutputsParams(regex=r"[a-c]{2,6}x\d"), StructuredOutputsParams(choice=["yes", "no", "maybe not"]),
             StructuredOutputsParams(grammar='start: "(" item ("," item)* ")"\nitem: /[0-9]+/'),
             StructuredOutputsParams(grammar='root ::= "[" [a-z]+ "]"')]  # GBNF
    prompts = ["hi", "The answer:"]
    llms = spec_llms(target, draft)
    finished = 0
    for so in kinds:
        params = SamplingParams(temperature=0, max_tokens=48, structured_outputs=so, **PENALTIES)
        ref = plain.generate(prompts, params)
        for o in ref:
            if o.finish_reason == "length":  # a random model may write a free-form string for long
                continue
            finished += 1
            if so.json is not None:
                value = json.loads(o.text)
                assert set(value) == {"name", "n", "ok"} and isinstance(value["n"], int) and len(value["name"]) <= 6
            elif so.json_object:
                assert isinstance(json.loads(o.text), dict)
            elif so.choice:
                assert o.text in so.choice
            elif so.regex:
                assert re.fullmatch(so.regex, o.text)
        for name, llm in llms.items():
            assert [o.token_ids for o in llm.generate(prompts, params)] == [o.token_ids for o in ref], (name, so)
    assert finished >= len(kinds)  # most constrained outputs complete their grammar and stop


def test_invalid_constraints_are_typed_errors(byte_models):
    llm = LLM(str(byte_models[0]))
    for so in (StructuredOutputsParams(regex="[a-"), StructuredOutputsParams(grammar="start: missing_rule"),
               StructuredOutputsParams(json='{"type": '), StructuredOutputsParams(json={"type": "no-such-type"})):
        with pytest.raises(InvalidGrammarError):
            llm.generate(["hi"], SamplingParams(max_tokens=4, structured_outputs=so))


# -- sampling: the joint distribution of output tokens 2 and 3, exactly and by the engine ----------
# max_tokens = 3 and k = 3: the first speculative step may draft only one token (one must remain for
# the last position), so it verifies the rows of tokens 2 and 3, the second being the bonus row.
TEMP = 1.0


def exact_outputs(llm, prompt, params, first, last):
    """P(output tokens first..last), summed over every earlier output with non-zero probability,
    each position processed as plain decoding processes it: {token tuple: probability}."""
    runner, decoder = llm.runner, llm.decoder

    def next_probs(done, logits):
        grammar = decoder.grammars.matcher(params.structured_outputs) if params.structured_outputs else None
        proc = LogitsProcessor(params, prompt, grammar)
        proc.commit(done)
        proc.begin_step([])
        return logits_to_probs(proc.process(logits), params.temperature, params.top_k, params.top_p, params.min_p)[0]

    seq = runner.open(len(prompt) + last + 1)
    base = runner.forward(seq, prompt, 1).logits
    result: dict[tuple, float] = {}

    def walk(done, weight):
        if done:
            runner.truncate(seq, len(prompt))
            logits = runner.forward(seq, done, 1).logits
        p = next_probs(done, logits if done else base).double()
        for t in torch.nonzero(p).flatten().tolist():
            if len(done) == last:
                key = tuple(done[first:]) + (t,)
                result[key] = result.get(key, 0.0) + float(weight * p[t])
            else:
                walk(done + [t], weight * p[t])

    walk([], 1.0)
    runner.close(seq)
    return result


def outputs_pvalue(llm, prompt, params, exact, first, last, n=2000, check_drafted=True):
    """Chi-square p-value of n seeded runs' output tokens first..last against `exact`, the cells
    expected under 10 times pooled (0 if an output the processed target rules out appears)."""
    counts: dict[tuple, int] = {}
    drafted = 0
    for seed in range(n):
        out = llm.generate([prompt], SamplingParams(**{**params.__dict__, "seed": seed}))[0]
        key = tuple(out.token_ids[first : last + 1])
        counts[key] = counts.get(key, 0) + 1
        drafted += out.metrics.num_draft_tokens
    assert drafted > n / 2 or not check_drafted  # the tokens went through verification, not plain steps
    if any(key not in exact for key in counts):
        return 0.0
    big = [key for key, p in exact.items() if p * n >= 10]
    obs = np.array([counts.get(key, 0) for key in big] + [n - sum(counts.get(key, 0) for key in big)], dtype=float)
    exp = np.array([exact[key] for key in big] + [max(0.0, 1.0 - sum(exact[key] for key in big))]) * n
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def _ignore_draft_prefix(monkeypatch):
    """Broken: penalties at draft position i count only the committed output, not drafts < i."""
    original = LogitsProcessor.begin_step

    def begin_step(self, draft):
        original(self, draft)
        self._draft = []
    monkeypatch.setattr(LogitsProcessor, "begin_step", begin_step)


def test_sampled_penalties_follow_the_target(tiny_dir, monkeypatch):
    target = tiny_dir("llama", seed=0)
    llm = LLM(str(target), speculative={"method": "draft_model", "draft_model": str(target),
                                        "num_speculative_tokens": 3, "adaptive_k": False})
    params = SamplingParams(temperature=TEMP, top_k=12, max_tokens=3, ignore_eos=True,
                            presence_penalty=2.0, frequency_penalty=2.0, logit_bias={20: 3.0})
    exact = exact_outputs(llm, PROMPT, params, 1, 2)
    assert outputs_pvalue(llm, PROMPT, params, exact, 1, 2) > 1e-6
    _ignore_draft_prefix(monkeypatch)  # negative control
    assert outputs_pvalue(llm, PROMPT, params, exact, 1, 2) < 1e-6


# The draft is the target without the grammar and bias: a third of its mass on tokens the grammar
# forbids (sure rejections), the rest shaped unlike the biased target (a residual unlike p).
GRAMMAR = StructuredOutputsParams(regex=r"[a-z0-9]{6,12}")
BIAS = {68: 4.0}


def _unmasked_bonus(monkeypatch):
    """Broken: the last verified row (the bonus position) is left unmasked."""
    original = LogitsProcessor.process

    def process(self, logits, start=0):
        out = original(self, logits, start)
        if logits.shape[0] > 1:
            out[-1] = logits[-1].float()
        return out
    monkeypatch.setattr(LogitsProcessor, "process", process)


def _cut_before_invalid(monkeypatch):
    """Broken: a sampled draft is cut before its first invalid token instead of keeping it as a
    sure rejection, so the next token comes from p instead of the residual."""
    def allowed(self, req, draft):
        from verispec.proposers.base import Draft

        if req.processor is None or not len(draft):
            return draft
        n = req.processor.valid_prefix(draft.tokens)
        if n == 0:
            self.proposer.accept(req.view, 0)
            return Draft(tokens=[])
        return Draft(draft.tokens[:n], None if draft.probs is None else draft.probs[:n])
    monkeypatch.setattr(SpeculativeDecoder, "_allowed", allowed)


@pytest.mark.parametrize("control", [_unmasked_bonus, _cut_before_invalid])
def test_sampled_structured_follows_the_target(byte_models, monkeypatch, control):
    target = byte_models[0]
    llm = LLM(str(target), speculative={"method": "draft_model", "draft_model": str(target),
                                        "num_speculative_tokens": 3, "adaptive_k": False})
    params = SamplingParams(temperature=TEMP, max_tokens=3, structured_outputs=GRAMMAR, logit_bias=BIAS)
    prompt = llm.tokenizer.encode("ab")
    exact = exact_outputs(llm, prompt, params, 1, 2)
    assert outputs_pvalue(llm, prompt, params, exact, 1, 2) > 1e-6
    control(monkeypatch)
    try:
        pvalue = outputs_pvalue(llm, prompt, params, exact, 1, 2, check_drafted=False)
    except RuntimeError as e:  # the engine itself refuses a token its grammar forbids
        assert "was not allowed" in str(e)
        pvalue = 0.0
    assert pvalue < 1e-6


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.01])
def test_a_penalty_that_overflows_a_logit_samples_and_scores_instead_of_failing(tiny_dir, temperature):
    """repetition_penalty 5.5e-112 (in range, found by the server's schema fuzzing) divides positive
    logits of seen tokens past float32: the row keeps the largest float there, so sampling and
    logprobs work, and such a token stays the likeliest, as the penalty means. Control: without the clamps the
    softmax of inf is NaN (torch.multinomial refused it: a 500 from the server)."""
    params = SamplingParams(temperature=temperature, seed=0, repetition_penalty=5.494587992782474e-112, max_tokens=8,
                            logprobs=2, ignore_eos=True)
    out = LLM(str(tiny_dir("llama", seed=0))).generate([PROMPT], params)[0]
    assert len(out.token_ids) == 8
    assert all(np.isfinite(e.logprob) for e in out.outputs[0].logprobs)
    row = torch.tensor([[3.0, 1.0, float("inf"), float("inf")]])
    assert torch.equal(logits_to_probs(row, 1.0)[0], torch.tensor([0.0, 0.0, 0.5, 0.5]))
    assert torch.isnan(torch.softmax(row, -1)).all()  # what the clamp prevents
