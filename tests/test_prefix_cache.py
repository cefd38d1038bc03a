"""Prefix caching and chunked prefill: a request's tokens (and logprobs, bit for bit) are the same
whether its prefix was cached or not, and whatever else the scheduler was doing."""

import pytest
import torch

from verispec import LLM, SamplingParams
from verispec.engine.prefix_cache import BLOCK
from verispec.engine.scheduler import Scheduler
from verispec.errors import ConfigError

SPEC = {"method": "prompt_lookup", "num_speculative_tokens": 4}


def conversation(seed: int, n: int = 3) -> list[list[int]]:
    """Prompts sharing a 40-token system prefix, each a different question."""
    g = torch.Generator().manual_seed(seed)
    system = [1] + torch.randint(3, 96, (39,), generator=g).tolist()
    return [system + torch.randint(3, 96, (int(torch.randint(5, 30, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]


def run(llm, prompts, params):
    return [(o.token_ids, [e.logprob for e in o.outputs[0].logprobs]) for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cached_prefixes_give_the_same_tokens_and_logprobs(tiny_dir, temperature):
    target = str(tiny_dir("llama", seed=0))
    params = SamplingParams(temperature=temperature, seed=4, max_tokens=20, ignore_eos=True, logprobs=0)
    prompts = conversation(0)
    cached = LLM(target, speculative=SPEC, enable_prefix_caching=True)
    # one at a time, each sees the previous ones' blocks: the system prompt, and for a later turn the whole earlier turn
    first = run(cached, prompts[:1], params)[0]
    turn2 = prompts[0] + first[0] + [40, 41, 42, 43, 44, 45]
    outs = [first] + [run(cached, [p], params)[0] for p in prompts[1:] + [turn2]]
    hits = cached.decoder.prefix_cache.hit_tokens
    assert hits >= 2 * 32 + (len(prompts[0]) + 20) // BLOCK * BLOCK - BLOCK  # the system blocks twice, turn 1 once
    for prompt, out in zip(prompts + [turn2], outs):
        fresh = LLM(target, speculative=SPEC, enable_prefix_caching=True)  # nothing cached
        assert run(fresh, [prompt], params)[0] == out
        assert fresh.decoder.prefix_cache.hit_tokens == 0


def test_reused_keys_and_values_are_the_ones_a_prefill_computes(tiny_dir):
    llm = LLM(str(tiny_dir("gemma3", seed=0)), enable_prefix_caching=True)  # sliding-window layers too
    prompt = conversation(1, 1)[0] + list(range(3, 40))
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    runner, cache = llm.runner, llm.decoder.prefix_cache
    a = runner.open(128)
    n = cache.reuse(a, prompt)
    assert n == (len(prompt) - 1) // BLOCK * BLOCK
    b = runner.open(128)
    for start in range(0, n, runner.capabilities.prefill_rows):  # computed afresh, in other chunks
        runner.forward(b, prompt[start : min(n, start + runner.capabilities.prefill_rows)], 1)
    ka, va = runner.read_kv(a, 0, n)
    kb, vb = runner.read_kv(b, 0, n)
    assert torch.equal(ka, kb) and torch.equal(va, vb)


def test_memory_bound_evicts_the_least_recently_used(tiny_dir):
    llm = LLM(str(tiny_dir("llama", seed=0)), enable_prefix_caching=True, prefix_cache_max_bytes=200_000)
    for seed in range(6):
        llm.generate(conversation(seed, 1), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        assert llm.decoder.prefix_cache.bytes <= 200_000
    assert llm.decoder.prefix_cache.num_blocks > 0


def test_chunked_prefill_keeps_streams_going_and_changes_no_token(tiny_dir):
    target = str(tiny_dir("llama", seed=0))
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    long_prompt = [1] + torch.randint(3, 96, (300,), generator=torch.Generator().manual_seed(3)).tolist()
    short_prompt = conversation(2, 1)[0]
    llm = LLM(target, speculative=SPEC, enable_chunked_prefill=True)
    sched = Scheduler(llm.decoder, max_num_seqs=4, chunked_prefill=True)
    events = []
    short = sched.submit(short_prompt, params, lambda e: events.append(("short", len(e.new_token_ids))))
    sched.step()  # the short one is admitted and prefilled (one chunk), then decodes
    sched.step()
    first_token = []
    long = sched.submit(long_prompt, params, lambda e: first_token.append(len(events)) if not first_token else None)
    while sched.num_running or sched.num_waiting:
        sched.step()
    chunks = -(-len(long_prompt) // llm.runner.capabilities.prefill_rows)
    decoded_meanwhile = sum(1 for name, n in events[: first_token[0]] if n) - 2
    assert decoded_meanwhile >= min(chunks - 1, 38 // 5)  # the short stream kept decoding during the long prefill
    reference = LLM(target, speculative=SPEC, enable_prefix_caching=True)  # the same prefill arithmetic, unchunked
    assert [h.output_ids for h in (short, long)] == [o.token_ids for o in reference.generate([short_prompt, long_prompt], params)]


def test_needs_the_invariant_torch_path(tiny_dir):
    with pytest.raises(ConfigError, match="batch_invariant"):
        LLM(str(tiny_dir("llama", seed=0)), enable_prefix_caching=True, batch_invariant=False)
    with pytest.raises(ConfigError, match="torch backend"):
        LLM(str(tiny_dir("llama", seed=0)), enable_chunked_prefill=True, backend="llamacpp")


def test_server_reports_prefix_cache_hits(tiny_dir):
    import httpx2 as httpx

    from server_utils import metric, server_process

    with server_process("--model", str(tiny_dir("llama", seed=0)), "--served-model-name", "tiny", "--enable-prefix-caching",
                        "--enable-chunked-prefill") as base:
        system = " ".join(f"w{i}" for i in range(10, 60))
        bodies = [{"model": "tiny", "prompt": f"{system} w{q}", "max_tokens": 4, "temperature": 0} for q in (70, 71, 70)]
        texts = [httpx.post(base + "/v1/completions", json=b, timeout=60).json()["choices"][0]["text"] for b in bodies]
        assert texts[0] == texts[2]
        queries = metric(base, "vllm:prefix_cache_queries_total")  # 3 prompts of 51 tokens (no BOS here)
        assert queries == 3 * 51
        assert metric(base, "vllm:prefix_cache_hits_total") == 2 * 48  # whole blocks of the shared 50
        assert metric(base, "verispec:prefix_cache_bytes") > 0
