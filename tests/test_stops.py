"""Stops (EOS, stop token ids, stop strings, max_tokens) end generation at exactly the right
token, also inside an accepted draft block, and nothing after the stop leaks out."""

import json
import shutil

import pytest

from verispec import LLM, SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)
PROMPT = [1, 10, 11, 12, 13, 14, 15]


@pytest.fixture(scope="module")
def models(tiny_dir):
    target = tiny_dir("llama", seed=0)
    plain = LLM(str(target))
    # the target drafting for itself: every draft is accepted, so the whole block is one
    # accepted run and any stop falls inside it
    spec = LLM(str(target), speculative={"method": "draft_model", "draft_model": str(target), "num_speculative_tokens": 8, "adaptive_k": False})
    ref = plain.generate([PROMPT], SamplingParams(max_tokens=40, **GREEDY))[0]
    return target, plain, spec, ref


def first_new_index(tokens, start):
    """An index >= start whose token does not occur earlier in the output."""
    return next(i for i in range(start, len(tokens)) if tokens[i] not in tokens[:i])


def check_no_leak(out, n_tokens):
    m = out.metrics
    assert len(out.token_ids) == n_tokens
    assert m.num_accepted_tokens <= n_tokens - 1  # only emitted drafts are counted
    assert sum(m.accepted_per_position) == m.num_accepted_tokens


@pytest.mark.parametrize("llm_name", ["plain", "spec"])
def test_stop_token_id_inside_block(models, llm_name):
    target, plain, spec, ref = models
    llm = plain if llm_name == "plain" else spec
    j = first_new_index(ref.token_ids, 4)
    out = llm.generate([PROMPT], SamplingParams(max_tokens=40, stop_token_ids=[ref.token_ids[j]], **GREEDY))[0]
    assert out.token_ids == ref.token_ids[: j + 1]  # the stop token is kept in ids...
    assert out.finish_reason == "stop"
    assert out.text == plain.tokenizer.decode(ref.token_ids[:j])  # ...but not shown in text
    check_no_leak(out, j + 1)
    if llm is spec:
        assert out.metrics.num_accepted_tokens == j  # all drafts accepted up to the stop


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 7, 9])
def test_max_tokens_inside_block(models, max_tokens):
    target, plain, spec, ref = models
    out = spec.generate([PROMPT], SamplingParams(max_tokens=max_tokens, **GREEDY))[0]
    assert out.token_ids == ref.token_ids[:max_tokens]
    assert out.finish_reason == "length"
    check_no_leak(out, max_tokens)


def test_stop_checked_before_length(models):
    target, plain, spec, ref = models
    j = first_new_index(ref.token_ids, 3)
    out = spec.generate([PROMPT], SamplingParams(max_tokens=j + 1, stop_token_ids=[ref.token_ids[j]], **GREEDY))[0]
    assert out.finish_reason == "stop" and len(out.token_ids) == j + 1


@pytest.mark.parametrize("llm_name", ["plain", "spec"])
def test_stop_string_inside_block(models, llm_name):
    target, plain, spec, ref = models
    llm = plain if llm_name == "plain" else spec
    j = first_new_index(ref.token_ids, 5)
    word = plain.tokenizer.decode([ref.token_ids[j]])  # e.g. "w38": the word tokenizer's text
    full_text = plain.tokenizer.decode(ref.token_ids)
    cut = full_text.index(word)
    out = llm.generate([PROMPT], SamplingParams(max_tokens=40, stop=[word, "never-there"], **GREEDY))[0]
    assert out.finish_reason == "stop"
    assert out.text == full_text[:cut]
    assert word not in out.text
    assert out.token_ids == ref.token_ids[: j + 1]
    check_no_leak(out, j + 1)


def test_eos_inside_block(models, tmp_path):
    target, plain, spec, ref = models
    j = first_new_index(ref.token_ids, 6)
    eos = ref.token_ids[j]
    folder = tmp_path / "eos"
    shutil.copytree(target, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["eos_token_id"] = eos
    (folder / "config.json").write_text(json.dumps(cfg))
    llm = LLM(str(folder), speculative={"method": "draft_model", "draft_model": str(folder), "num_speculative_tokens": 8, "adaptive_k": False})
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=40))[0]
    assert out.token_ids == ref.token_ids[: j + 1] and out.finish_reason == "stop"
    check_no_leak(out, j + 1)
    ignored = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))[0]
    assert ignored.token_ids == ref.token_ids and ignored.finish_reason == "length"
