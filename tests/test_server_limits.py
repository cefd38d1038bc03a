"""Server limits that need its internals: API key, loading, a full queue; and a bundled model."""

from __future__ import annotations

import threading
import time

import httpx2 as httpx
import openai
import pytest

from server_utils import metric, server_process, server_thread, wait_healthy
from verispec import LLM, SamplingParams
from verispec.config import EngineConfig, ServerConfig
from verispec.server import create_app
from verispec.server.engine import AsyncEngine


def test_api_key(tiny_dir):
    app = create_app(EngineConfig(model=str(tiny_dir("llama"))), ServerConfig(api_key="s3cret", served_model_name="tiny"))
    with server_thread(app) as base:
        wait_healthy(base)
        body = {"model": "tiny", "prompt": "w5", "max_tokens": 2}
        r = httpx.post(base + "/v1/completions", json=body)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.post(base + "/v1/completions", json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        assert httpx.get(base + "/v1/models").status_code == 401
        ok = openai.OpenAI(base_url=base + "/v1", api_key="s3cret", max_retries=0)
        assert ok.completions.create(**body).usage.completion_tokens == 2
        assert httpx.get(base + "/health").status_code == 200  # probes need no key
        assert httpx.get(base + "/metrics").status_code == 200


def test_health_503_while_loading_and_after_a_failed_load(tiny_dir, monkeypatch, tmp_path):
    gate = threading.Event()
    real_load = AsyncEngine._load

    def slow_load(self):
        gate.wait(30)
        real_load(self)

    monkeypatch.setattr(AsyncEngine, "_load", slow_load)
    app = create_app(EngineConfig(model=str(tiny_dir("llama"))), ServerConfig(served_model_name="tiny"))
    with server_thread(app) as base:
        r = httpx.get(base + "/health")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
        r = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": "w5"})
        assert r.status_code == 503
        gate.set()
        wait_healthy(base, timeout=30)
    monkeypatch.setattr(AsyncEngine, "_load", real_load)
    broken = create_app(EngineConfig(model=str(tmp_path / "missing")), ServerConfig())
    with server_thread(broken) as base:
        for _ in range(100):
            r = httpx.get(base + "/health")
            if "failed" in r.json()["error"]["message"]:
                break
        assert r.status_code == 503 and "failed to load" in r.json()["error"]["message"]


def test_full_queue_answers_503(tiny_dir):
    app = create_app(EngineConfig(model=str(tiny_dir("llama")), max_num_seqs=1), ServerConfig(served_model_name="tiny", max_waiting=1))
    with server_thread(app) as base:
        wait_healthy(base)
        engine = app.state.engine
        gate = threading.Event()
        real_step = engine.scheduler.step
        engine.scheduler.step = lambda: (gate.wait(30), real_step())  # hold the engine still
        body = {"model": "tiny", "prompt": "w5 w6", "max_tokens": 4, "ignore_eos": True}
        first = []
        t = threading.Thread(target=lambda: first.append(httpx.post(base + "/v1/completions", json=body, timeout=60)))
        t.start()
        for _ in range(200):
            if engine.scheduler.num_waiting == 1:
                break
            threading.Event().wait(0.01)
        r = httpx.post(base + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
        gate.set()
        t.join(60)
        assert first[0].status_code == 200 and first[0].json()["usage"]["completion_tokens"] == 4
        assert metric(base, "vllm:num_requests_waiting") == 0


def test_bundled_model_through_the_server():
    """SmolLM2 behind `verispec serve`: the chat answer equals the offline API's, token for token."""
    messages = [{"role": "user", "content": "Name three primary colors."}]
    ref = LLM("smollm2-135m").chat(messages, SamplingParams(temperature=0, max_tokens=24))[0]
    with server_process("--model", "smollm2-135m", "--method", "prompt_lookup") as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        out = client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=24, temperature=0)
        assert out.choices[0].message.content == ref.text
        assert out.usage.completion_tokens == len(ref.token_ids)
        chunks = list(client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=24, temperature=0, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text


@pytest.mark.parametrize("flag", ["--max-num-seqs=0", "--port=-1"])
def test_bad_server_flags_exit_cleanly(flag, capsys):
    from verispec.cli import main

    assert main(["serve", "--model", "x", flag]) == 2
    assert "must be a positive integer" in capsys.readouterr().err


def test_load_script_smoke(tiny_dir, capsys, tmp_path):
    """`verispec load` on a tiny model: every level's requests served, no errors, a full table."""
    import json

    from verispec.cli import main

    questions = tmp_path / "q.jsonl"
    cats = ["translation", "qa", "rag", "summarization"]
    questions.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [f"w{5 + i} w6 w7 w{5 + i} w6"]}) + "\n" for i, c in enumerate(cats)))
    model = str(tiny_dir("llama"))
    argv = ["load", "--model", model, "--requests", "4", "--concurrency", "1,3", "--max-tokens", "8", "--overhead", "--questions", str(questions)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| plain |") or line.startswith("| prompt_lookup |")]
    assert len(rows) == 4
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == "4" and cells[3] == "0" and float(cells[4]) > 0  # requests, errors, tokens/s
    assert out.count("overhead") == 2
    assert f"verispec serve --model {model} --backend torch`" in out


def test_oversized_bodies_get_413_before_parsing_and_health_stays_quick(tiny_dir):
    # a process of its own: /health's wait is the server's, not this process's threads'
    with server_process("--model", str(tiny_dir("llama")), "--served-model-name", "tiny", "--max-request-bytes", "2000000") as base:
        big = b'{"model": "tiny", "prompt": "' + b"w5 " * 3_000_000 + b'"}'  # 9 MB
        t0 = time.perf_counter()
        r = httpx.post(base + "/v1/completions", content=big, headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert time.perf_counter() - t0 < 5

        def chunks():  # no Content-Length: refused once the limit is passed
            yield big[:1_000_000]
            yield big[1_000_000:3_000_000]
            yield big[3_000_000:]
        r = httpx.post(base + "/v1/completions", content=chunks(), headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 413

        # a prompt just under the limit is tokenised on a worker thread: /health answers meanwhile
        under = {"model": "tiny", "prompt": "w5 " * 600_000, "max_tokens": 2}
        answer = []
        t = threading.Thread(target=lambda: answer.append(httpx.post(base + "/v1/completions", json=under, timeout=60)))
        t.start()
        waits = []
        while t.is_alive():
            t1 = time.perf_counter()
            assert httpx.get(base + "/health", timeout=30).status_code == 200
            waits.append(time.perf_counter() - t1)
        t.join()
        assert answer[0].status_code == 400 and answer[0].json()["error"]["code"] == "context_length_exceeded"
        assert max(waits) < 0.5, waits


def test_kv_budget_admits_what_fits_and_loses_nothing(tiny_dir):
    """Requests whose worst-case KV caches (prompt + max_tokens positions, target's and draft
    model's) would overrun kv_cache_max_bytes wait, oldest first, and all finish with the tokens
    they get alone; one larger than the whole budget is refused with a clear error."""
    from verispec.engine.scheduler import Scheduler
    from verispec.errors import ContextLengthError

    model = str(tiny_dir("llama"))
    llm = LLM(model, speculative={"method": "draft_model", "draft_model": str(tiny_dir("llama", seed=7)),
                                  "num_speculative_tokens": 3, "adaptive_k": False})
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    prompts = [[1, 5 + i, 6, 7, 8] for i in range(5)]
    alone = [llm.generate([p], params)[0].token_ids for p in prompts]
    need = llm.decoder.kv_bytes(25)
    assert need == 25 * 2 * sum(r.config.num_layers * r.config.num_kv_heads * r.config.head_dim * 4
                                for r in (llm.runner, llm.decoder.proposer.runner))
    scheduler = Scheduler(llm.decoder, max_num_seqs=8, max_waiting=8, kv_budget=2 * need + need // 2)
    outs, most = {}, 0
    handles = [scheduler.submit(p, params, lambda e: outs.setdefault(e.handle.id, e) if e.finished else None) for p in prompts]
    while len(outs) < len(prompts):
        scheduler.step()
        most = max(most, scheduler.num_running)
        assert scheduler.kv_reserved <= scheduler.kv_budget
    assert most == 2  # two fit at a time, not three
    assert [h.output_ids for h in handles] == alone and scheduler.kv_reserved == 0
    with pytest.raises(ContextLengthError, match="KV cache.*kv_cache_max_bytes"):
        scheduler.submit([1, 5, 6], SamplingParams(max_tokens=80), lambda e: None)


def test_a_request_larger_than_the_kv_budget_gets_400(tiny_dir):
    app = create_app(EngineConfig(model=str(tiny_dir("llama")), kv_cache_max_bytes=200_000), ServerConfig(served_model_name="tiny"))
    with server_thread(app) as base:
        wait_healthy(base)
        body = {"model": "tiny", "prompt": "w5 w6", "max_tokens": 4, "ignore_eos": True}
        assert httpx.post(base + "/v1/completions", json=body, timeout=60).status_code == 200
        r = httpx.post(base + "/v1/completions", json={**body, "max_tokens": 400}, timeout=60)
        assert r.status_code == 400 and "kv_cache_max_bytes" in r.json()["error"]["message"]
