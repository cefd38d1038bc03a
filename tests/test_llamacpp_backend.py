"""The llama.cpp backend (llama-cpp-python): the ModelRunner verbs, and the lossless tests on it.

Exactness is relative to the same target on the same backend and weights format: speculative
greedy output equals plain greedy output of llama.cpp on the same GGUF, token for token; sampled
output follows its distribution. The target is the bundled SmolLM2 (Q4_1, as shipped); the draft
model is the same GGUF converted to Q8_0 by llama.cpp (same vocabulary, slightly other weights,
so drafts are mostly but not always accepted).

The runner keeps llama.cpp batch-invariant (Q8_0 KV cache, decodes no larger than the rows its
kernels treat alike: see the README's Backends section); the long-context tests check it past the
512 cells where an F16 cache's attention switches kernels.
"""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from verispec import LLM, SamplingParams
from verispec.config import SpeculativeConfig
from verispec.runners.base import BatchItem
from verispec.engine.decoder import SpeculativeDecoder
from verispec.proposers.base import create_proposer
from verispec.sampling.processors import logits_to_probs

pytest.importorskip("llama_cpp", reason="the llamacpp backend needs llama-cpp-python (make test installs it)")

PROMPTS = [
    "Repeat exactly: the quick brown fox jumps over the lazy dog; the quick brown fox jumps over the lazy dog.",
    "List the numbers from one to twelve in words, separated by commas.",
    "Write a short poem about the sea.",
]


@pytest.fixture(scope="module")
def target():
    return LLM("smollm2-135m", backend="llamacpp")


@pytest.fixture(scope="module")
def q8_path():
    from verispec.runners.llamacpp import convert_weights
    from verispec.models.weights.registry import resolve

    return str(convert_weights(resolve("smollm2-135m"), "Q8_0"))


def test_runner_verbs_and_batches(target):
    r = target.runner
    ids = r.tokenizer.encode("The capital of France is")
    a, b = r.open(64), r.open(64)
    first = r.forward(a, ids, num_logits=len(ids)).logits  # [T, vocab]
    assert first.shape == (len(ids), r.vocab_size) and first.dtype == torch.float32
    r.truncate(a, 2)
    again = r.forward(a, ids[2:], num_logits=len(ids) - 2).logits
    assert torch.equal(again, first[2:])  # rollback forgets, recompute agrees bit for bit
    r.forward(b, ids[:3])
    outs = r.forward_batch([BatchItem(a, [5], 1), BatchItem(b, ids[3:], len(ids) - 3)])
    assert torch.equal(outs[1].logits, first[3:])  # b ran alongside a
    assert r.length(a) == len(ids) + 1 and r.length(b) == len(ids)
    r.close(a)
    r.close(b)
    assert r.open_sequences == 0 and r.cache_bytes == 0
    with pytest.raises(Exception, match="context"):
        r.open(r.max_context + 1)


def test_verifications_split_at_invariant_rows_keep_every_row(target):
    """Several sequences' rows in one batch, split into decodes of 2 rows (chunk boundaries inside
    and across items): each row's logits equal its one-row decode, in order."""
    r = target.runner
    saved = r.invariant_rows
    a, b = r.open(32), r.open(32)
    try:
        r.forward(a, [11, 12, 13])
        r.forward(b, [21, 22])
        alone_a = r.forward(a, [5]).logits
        alone_b = torch.cat([r.forward(b, [t]).logits for t in (6, 7, 8, 9)])
        r.truncate(a, 3)
        r.truncate(b, 2)
        r.invariant_rows = 2
        outs = r.forward_batch([BatchItem(a, [5], 1), BatchItem(b, [6, 7, 8, 9], 4)])  # decodes: [a5 b6] [b7 b8] [b9]
        assert torch.equal(outs[0].logits, alone_a) and torch.equal(outs[1].logits, alone_b)
        assert r.length(a) == 4 and r.length(b) == 6
    finally:
        r.invariant_rows = saved
        r.close(a)
        r.close(b)


def test_probe_finds_the_size_where_rows_stop_agreeing(target, monkeypatch, tmp_path):
    """A stand-in for a kernel switch at 6 rows (logits of larger decodes nudged): the probe
    answers 5 and caches it; a second probe reads the cache."""
    import json

    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    r = target.runner
    saved = r.invariant_rows
    real = r.forward_batch

    def switched(items):
        outs = real(items)
        if sum(len(it.tokens) for it in items) > 5:
            for o in outs:
                o.logits[:, 0] += 1e-3
        return outs

    monkeypatch.setattr(r, "forward_batch", switched)
    try:
        assert r.probe_invariant_rows() == 5 and r.invariant_rows == 5
        assert json.loads((tmp_path / "llamacpp-probes.json").read_text()) == {r._probe_key(): 5}
        monkeypatch.setattr(r, "forward_batch", real)
        assert r.probe_invariant_rows() == 5  # from the cache, not measured again
    finally:
        r.invariant_rows = saved
    assert r.open_sequences == 0


def _plain(target, prompt, n=32):
    return target.generate(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0].token_ids


@pytest.mark.parametrize("method", ["prompt_lookup", "draft_model_q8", "draft_model_self"])
def test_greedy_identical_on_llamacpp(target, q8_path, method):
    refs = [_plain(target, p) for p in PROMPTS]
    draft = {"draft_model_q8": q8_path, "draft_model_self": "smollm2-135m"}.get(method)
    spec = SpeculativeConfig(method=method.split("_q8")[0].removesuffix("_self"), draft_model=draft)
    proposer = create_proposer(spec, target.runner)
    drafted = accepted = 0
    for k in (1, 2, 4, 8):
        decoder = SpeculativeDecoder(target.runner, proposer, k)
        for prompt, ref in zip(PROMPTS, refs):
            req = decoder.generate(target.tokenizer.encode(prompt), SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
            assert req.output_ids == ref, f"k={k} {prompt[:30]!r}"
            drafted += req.metrics.num_draft_tokens
            accepted += req.metrics.num_accepted_tokens
    assert drafted > 0
    if method == "draft_model_self":
        assert accepted == drafted
    elif method == "draft_model_q8":
        assert 0 < accepted < drafted


LONG = ("The lighthouse keeper wrote the same note every evening: the lamp was lit at dusk, the lens "
        "was cleaned, the log was signed, and the sea was calm or rough as the sea chose to be. ") * 16


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_long_contexts_stay_exact_on_llamacpp(model, target):
    """Past 512 cells (where an F16 cache's attention switches kernels) and with verifications
    larger than the rows the weights' kernels treat alike (Gemma's Q4_K_M: split into several
    decodes): rows decoded together equal rows decoded alone, and greedy speculative = plain."""
    llm = target if model == "smollm2-135m" else LLM(model, backend="llamacpp")
    r = llm.runner
    seq = r.open(720)
    r.forward(seq, [(i * 7919) % 1000 for i in range(700)])
    tokens = [(i * 31) % 1000 + 3 for i in range(9)]
    alone = torch.cat([r.forward(seq, [t]).logits for t in tokens])
    r.truncate(seq, 700)
    assert torch.equal(r.forward(seq, tokens, num_logits=9).logits, alone)
    r.close(seq)
    prompt = llm.tokenizer.encode(LONG)
    assert len(prompt) > 600
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    ref = llm.generate([prompt], params)[0].token_ids
    proposer = create_proposer(SpeculativeConfig(method="prompt_lookup"), r)
    for k in (4, 8):
        req = SpeculativeDecoder(r, proposer, k).generate(prompt, params)
        assert req.output_ids == ref, f"k={k}"
        assert req.metrics.num_accepted_tokens > 0


TEMP, TOP_K = 0.9, 8


def test_sampling_follows_the_llamacpp_target(target, q8_path):
    """Second output token, drafted by the Q8_0 model and verified by rejection sampling on the
    Q4_1 target: its distribution is the target's (chi-square)."""
    runner = target.runner
    prompt = target.tokenizer.encode("My favourite colour is")
    seq = runner.open(len(prompt) + 2)
    p1 = logits_to_probs(runner.forward(seq, prompt).logits, TEMP, TOP_K, 1.0)[0]
    exact = torch.zeros_like(p1, dtype=torch.float64)
    for t1 in torch.nonzero(p1).flatten().tolist():
        runner.truncate(seq, len(prompt))
        exact += p1[t1].double() * logits_to_probs(runner.forward(seq, [t1]).logits, TEMP, TOP_K, 1.0)[0].double()
    runner.close(seq)
    proposer = create_proposer(SpeculativeConfig(method="draft_model", draft_model=q8_path), runner)
    decoder = SpeculativeDecoder(runner, proposer, 1)
    n = 800
    counts = np.zeros(runner.vocab_size)
    accepted = drafted = 0
    for s in range(n):
        req = decoder.generate(prompt, SamplingParams(temperature=TEMP, top_k=TOP_K, seed=s, max_tokens=3, ignore_eos=True))
        counts[req.output_ids[1]] += 1
        accepted += req.metrics.num_accepted_tokens
        drafted += req.metrics.num_draft_tokens
    assert 0 < accepted < drafted
    exact = exact.numpy()
    assert counts[exact == 0].sum() == 0
    big = exact * n >= 10
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(exact[big] * n, exact[~big].sum() * n)
    keep = exp > 0
    pvalue = chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue
    assert pvalue > 1e-6, f"p = {pvalue:.2e}"


def test_server_runs_on_llamacpp():
    """The scheduler's batched steps on llama.cpp: 6 requests in one running batch give what each gets alone."""
    from verispec.engine.scheduler import Scheduler

    llm = LLM("smollm2-135m", backend="llamacpp", speculative={"method": "prompt_lookup", "num_speculative_tokens": 4})
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS * 2]
    alone = [llm.decoder.generate(p, params).output_ids for p in prompts]
    sched = Scheduler(llm.decoder, max_num_seqs=6)
    handles = [sched.submit(p, params, lambda ev: None) for p in prompts]
    while sched.num_running or sched.num_waiting:
        sched.step()
    assert [h.output_ids for h in handles] == alone
    assert llm.runner.open_sequences == 0


def test_bench_table_per_backend_on_two_models(tmp_path):
    """`verispec bench --model a,b`: each model's report, and one summary with plain decoding per
    backend and format (tok/s, fraction of the bandwidth bound) and the best speculative method,
    ratios to llama.cpp's plain decoding of the shipped GGUF."""
    import json

    from verispec.cli import main

    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["Name three colours."]}))
    out = tmp_path / "bench"
    code = main(["bench", "--model", "smollm2-135m,gemma3-270m", "--questions", str(questions), "--limit", "1",
                 "--max-tokens", "8", "--categories", "qa", "--adaptive-k", "--cost-profile", "auto",
                 "--methods", "plain,prompt_lookup,plain@llamacpp:Q8_0,prompt_lookup@llamacpp:Q8_0,llamacpp",
                 "--out", str(out)])
    assert code == 0
    summary = (out / "summary.md").read_text()
    for model in ("smollm2-135m", "gemma3-270m"):
        data = json.loads((out / model / "results.json").read_text())
        assert data["failed"] == {}  # the llama.cpp peer (in its own process) ran every question
        assert data["bandwidth_gbs"] > 0
        assert set(data["weight_bytes"]) == {"plain", "prompt_lookup", "plain@llamacpp:Q8_0", "prompt_lookup@llamacpp:Q8_0", "llamacpp"}
        wb = data["weight_bytes"]
        # torch keeps the shipped file's blocks (Q4_1, Q4_K_M), as the llama.cpp peer does; Q8_0 is larger
        assert wb["plain@llamacpp:Q8_0"] > wb["plain"] and wb["plain@llamacpp:Q8_0"] > wb["llamacpp"]
        assert abs(wb["plain"] - wb["llamacpp"]) < 0.1 * wb["llamacpp"], wb
        assert f"## {model}" in summary
        rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in summary.split(f"## {model}")[1].split("##")[0].splitlines()
                if line.startswith("| ") and not line.startswith("| backend")}
        assert set(rows) == {"torch", "llamacpp:Q8_0", "llama.cpp (peer)"}
        assert rows["torch"][1] == "plain" and rows["torch"][6] == "prompt_lookup"
        fraction = float(rows["llamacpp:Q8_0"][5])
        assert 0 < fraction < 1.5  # a fraction of the bound (a little over 1 would be timing noise)
        assert rows["llamacpp:Q8_0"][-1].endswith("x |")  # ratio to llama.cpp's plain decoding
        assert "## Per backend" in (out / model / "report.md").read_text()


def test_models_load_without_extra_buffer_types(target, monkeypatch):
    """Our runner and the bench's llama.cpp peer load with llama_model_params.use_extra_bufts off:
    with it on (llama.cpp's default), an Intel Xeon with AMX repacks the Q4_1/Q8_0 weights for its
    AMX kernels and segfaults in llama_decode. Checked on the parameters llama.cpp's loader really
    receives (this machine may have no AMX: the crash itself cannot be shown everywhere)."""
    import llama_cpp
    import llama_cpp.llama_cpp as low

    from verispec.bench.methods import LlamaCppMethod
    from verispec.runners.llamacpp import LlamaCppRunner
    from verispec.models.weights.registry import resolve

    assert llama_cpp.llama_model_default_params().use_extra_bufts  # llama.cpp's default, what we turn off
    seen = []
    load = low.llama_model_load_from_file

    def spy(path, params):
        seen.append(params.use_extra_bufts)
        return load(path, params)

    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", spy)  # the name our runner calls
    monkeypatch.setattr(low, "llama_model_load_from_file", spy)  # the one llama_cpp.Llama's loader calls
    path = resolve("smollm2-135m")
    runner = LlamaCppRunner(path, max_context=256, max_sequences=2)
    ids = runner.tokenizer.encode("The capital of France is")
    seq = runner.open(64)
    assert runner.forward(seq, ids).logits.shape == (1, runner.vocab_size)
    runner.close(seq)
    assert seen == [False]
    peer = LlamaCppMethod("llamacpp", str(path), list(runner.eos_token_ids))
    assert seen == [False, False] and peer.llm.model_params.use_extra_bufts is False
    assert len(peer.run(ids, 4, 0.0, 0).token_ids) == 4
    import llama_cpp._internals as internals

    assert internals.LlamaModel.__module__ == "llama_cpp._internals"  # the patch ends with the construction


def test_llamacpp_peer_runs_in_a_child_and_its_crash_is_contained(target, monkeypatch):
    """The bench's llama.cpp peer runs in a spawned child: the same tokens as in this process, and
    a segfault there (as llama.cpp's AMX kernels gave) is a PeerFailed naming the signal, not ours."""
    import os

    from verispec.bench.methods import LlamaCppMethod
    from verispec.bench.peers import CRASH_ENV, IsolatedPeer, PeerFailed
    from verispec.models.weights.registry import resolve

    eos = list(target.runner.eos_token_ids)
    ids = target.tokenizer.encode_chat([{"role": "user", "content": PROMPTS[1]}])
    here = LlamaCppMethod("llamacpp", str(resolve("smollm2-135m")), eos).run(ids, 16, 0.0, 0)
    peer = IsolatedPeer("llamacpp", "smollm2-135m", eos)
    try:
        peer.wait_ready()
        assert peer.weight_bytes > 0 and peer.pid != os.getpid()
        there = peer.run(ids, 16, 0.0, 0)
        assert there.token_ids == here.token_ids and there.wall_time > 0 and peer.peak_rss_mb > 0
    finally:
        peer.close()
    monkeypatch.setenv(CRASH_ENV, "llamacpp")  # its child segfaults at its first run
    peer = IsolatedPeer("llamacpp", "smollm2-135m", eos)
    try:
        peer.wait_ready()
        with pytest.raises(PeerFailed, match=r"^crashed: signal 11 \(SIGSEGV\)$"):
            peer.run(ids, 16, 0.0, 0)
    finally:
        peer.close()
