"""The OpenAI-compatible server, as a real `verispec serve` process, through the official client."""

from __future__ import annotations

import asyncio
import json
import time

import httpx2 as httpx
import openai
import pytest
import torch

from server_utils import metric, server_process, server_thread, wait_healthy
from verispec import LLM, SamplingParams
from verispec.config import EngineConfig, ServerConfig, SpeculativeConfig
from verispec.server import create_app

MODEL = "tiny"


@pytest.fixture(scope="module")
def target(tiny_dir):
    return str(tiny_dir("llama", seed=0))


@pytest.fixture(scope="module")
def server(target):
    with server_process("--model", target, "--served-model-name", MODEL, "--method", "prompt_lookup", "--k", "4") as base:
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def offline(target):
    return LLM(target, speculative={"method": "prompt_lookup", "num_speculative_tokens": 4})


def word_prompts(n: int, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        words = [f"w{int(t)}" for t in torch.randint(3, 96, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g)]
        out.append(" ".join(words * (2 if i % 2 else 1)))
    return out


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server + "/health").json() == {"status": "ok"}


def test_completion_matches_offline(client, offline):
    prompt = "w5 w6 w7 w5 w6 w7 w5"
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    ref = offline.generate(prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0]
    assert out.choices[0].text == ref.text
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 24 and out.usage.prompt_tokens == len(ref.prompt_token_ids)
    spec = out.usage.model_extra["speculative"]
    assert spec["num_draft_tokens"] >= spec["num_accepted_tokens"] >= 0
    assert spec["target_forwards"] == 1 + (24 - 1) - spec["num_accepted_tokens"]


def test_completion_stream_matches_offline(client, offline):
    prompt = "w9 w10 w11 w9 w10"
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    ref = offline.generate(prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    assert text == ref.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    # one chunk per committed block: accepted drafts arrive together, so chunks <= tokens
    assert 1 <= len([c for c in chunks if c.choices]) <= 20


def test_chat_matches_offline(client, offline):
    messages = [{"role": "system", "content": "w40"}, {"role": "user", "content": "w5 w6 w5 w6"}]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    ref = offline.chat(messages, params)[0]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == ref.text
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=16, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_string_cut_in_stream_and_not(client, offline):
    prompt = "w5 w6 w7 w5 w6 w7 w5"
    full = offline.generate(prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0].text
    stop = " ".join(full.split()[3:5])  # two words from inside the output
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "stop" and out.choices[0].text == full[: full.index(stop)]
    streamed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=stop, stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed) == out.choices[0].text


def test_16_concurrent_streams_equal_one_at_a_time(server, offline):
    """16 streaming requests at once (greedy, and 4 seeded sampled ones) give what each gets alone,
    nothing lost, nothing duplicated, each stream's chunks belonging to it."""
    prompts = word_prompts(16, seed=1)
    sampled = {3, 7, 11, 15}

    def kwargs(i):
        return dict(
            model=MODEL, prompt=prompts[i], max_tokens=40 + i, extra_body={"ignore_eos": True},
            temperature=0.8 if i in sampled else 0.0, seed=1000 + i,
        )

    async def one(client, i):
        stream = await client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs(i))
        ids, text, finishes, n_tokens = set(), "", [], None
        async for chunk in stream:
            ids.add(chunk.id)
            if chunk.choices:
                text += chunk.choices[0].text
                finishes.append(chunk.choices[0].finish_reason)
            else:
                n_tokens = chunk.usage.completion_tokens
        return ids, text, finishes, n_tokens

    async def run():
        client = openai.AsyncOpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
        together = await asyncio.gather(*(one(client, i) for i in range(16)))
        alone = [await one(client, i) for i in range(16)]
        return together, alone

    before = metric(server, "vllm:request_success_total")
    together, alone = asyncio.run(run())
    assert metric(server, "vllm:request_success_total") - before == 32
    for i, ((ids_t, text_t, fin_t, n_t), (_, text_a, _, n_a)) in enumerate(zip(together, alone)):
        assert len(ids_t) == 1
        assert fin_t.count("length") == 1 and fin_t[-1] == "length"
        assert text_t == text_a, f"request {i}"
        assert n_t == n_a == 40 + i
        if i not in sampled:  # greedy: also the offline API's output
            ref = offline.generate(prompts[i], SamplingParams(temperature=0, max_tokens=40 + i, ignore_eos=True))[0]
            assert text_t == ref.text
    assert len({chunks[0].pop() for chunks in together}) == 16  # 16 distinct response ids
    assert metric(server, "vllm:num_requests_running") == 0


def test_disconnect_aborts_and_frees(target):
    """A client that drops a stream: its request is aborted, the running gauge returns to zero and
    the KV-cache memory it held is released. The engine is slowed (each step waits 20 ms) so that the
    request is still running when the hang-up arrives: unslowed, the tiny model writes its 500 tokens
    in under 0.1 s and the request can finish ("length") before the server sees the client go."""
    app = create_app(EngineConfig(model=target, speculative=SpeculativeConfig(method="prompt_lookup", num_speculative_tokens=4)), ServerConfig(served_model_name=MODEL))
    with server_thread(app) as base:
        wait_healthy(base)
        scheduler = app.state.engine.scheduler
        real_step = scheduler.step
        scheduler.step = lambda: (time.sleep(0.02), real_step())
        aborted_before = metric(base, "vllm:request_success_total", finished_reason="abort")
        body = {"model": MODEL, "prompt": "w5 w6", "max_tokens": 500, "temperature": 0, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(3)]  # a chunk or two, then hang up
            assert got[0].startswith("data: ")
            assert metric(base, "vllm:num_requests_running") == 1
            assert metric(base, "verispec:kv_cache_bytes") > 0

        def settled() -> bool:
            return (metric(base, "vllm:num_requests_running") == 0 and metric(base, "verispec:kv_cache_bytes") == 0
                    and metric(base, "vllm:request_success_total", finished_reason="abort") == aborted_before + 1)

        for _ in range(200):
            if settled():
                break
            time.sleep(0.05)
        assert metric(base, "vllm:num_requests_running") == 0
        assert metric(base, "verispec:kv_cache_bytes") == 0
        assert metric(base, "verispec:open_sequences") == 0
        assert metric(base, "vllm:request_success_total", finished_reason="abort") == aborted_before + 1
        assert metric(base, "vllm:request_success_total", finished_reason="length") == 0


def test_metrics_speak_vllm(server, client):
    client.completions.create(model=MODEL, prompt="w5 w6 w7 w5 w6 w7 w5 w6", max_tokens=30, temperature=0, extra_body={"ignore_eos": True})
    text = httpx.get(server + "/metrics").text
    for name in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket", "vllm:time_per_output_token_seconds_bucket",
        "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    ):
        assert name in text, name
    drafted = metric(server, "vllm:spec_decode_num_draft_tokens_total")
    accepted = metric(server, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafted >= accepted > 0
    assert metric(server, "vllm:spec_decode_num_accepted_tokens_per_pos_total") == accepted


# (request body, expected status) -- what a client can get wrong; never a 5xx
BAD_INPUTS = [
    ("/v1/completions", "{not json", 400),
    ("/v1/completions", "[1, 2]", 400),
    ("/v1/completions", {"prompt": "w5"}, 400),  # no model
    ("/v1/completions", {"model": "gpt-4", "prompt": "w5"}, 404),
    ("/v1/completions", {"model": MODEL}, 400),  # no prompt
    ("/v1/completions", {"model": MODEL, "prompt": 5}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": []}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": [[]]}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": [5, 100000]}, 400),  # token id outside the vocabulary
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "max_tokens": 0}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "max_tokens": -3}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "max_tokens": 10**6}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "max_tokens": "ten"}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "max_tokens": 1.5}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": " ".join(["w5"] * 600)}, 400),  # longer than the context
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "temperature": -0.1}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "temperature": 2.5}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "temperature": "hot"}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "top_p": 0}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "top_p": 1.5}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "top_k": -2}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "seed": -1}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "stop": [""]}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "stop": 7}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "stream": "yes"}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": ["w5"] * 17}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "n": 0}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "n": 17}, 400),  # over max_prompts_per_request
    ("/v1/completions", {"model": MODEL, "prompt": ["w5"] * 3, "n": 6}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "logprobs": 21}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "logprobs": -1}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "presence_penalty": 2.5}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "frequency_penalty": -3}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "repetition_penalty": 0}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "min_p": 1.5}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "logit_bias": {"x": 1}}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "logit_bias": {"5": 500}}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "logit_bias": {"100000": 1}}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "best_of": 3}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "response_format": {"type": "xml"}}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "guided_regex": "a", "guided_choice": ["b"]}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "structured_outputs": {"regex": "a", "choice": ["b"]}}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "structured_outputs": {"xml": "a"}}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "guided_choice": []}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "guided_regex": "[a-"}, 400),  # this tokenizer: unsupported
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400),
    ("/v1/chat/completions", {"model": MODEL}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "w5"}]}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "tool", "content": "w5"}]}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"content": "w5"}]}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": 5}]}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "w5"}], "max_completion_tokens": 0}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "w5"}], "tools": [{"type": "function"}]}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "w5"}], "logprobs": True, "top_logprobs": 30}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "w5"}], "top_logprobs": 2}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "w5"}], "response_format": {"type": "json_schema"}}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "w5"}],
                              "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "nope"}}}, 400),
    ("/v1/chat/completions", {"model": "other", "messages": [{"role": "user", "content": "w5"}]}, 404),
    ("/v1/embeddings", {"model": MODEL, "input": "w5"}, 404),
]


def post(base: str, path: str, body) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(base + path, content=content, headers={"content-type": "application/json"}, timeout=30)


@pytest.mark.parametrize("path,body,status", BAD_INPUTS, ids=[f"{i}" for i in range(len(BAD_INPUTS))])
def test_bad_input_answers_openai_error(server, path, body, status):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == {400: "invalid_request_error", 404: "not_found_error"}[status]


def test_bad_stream_request_answers_before_streaming(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="w5", max_tokens=10**6, stream=True)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "w5"}])


def _with_served_model(case):
    """Name the served model, and keep answers short (the suite's time; limits are tested above)."""
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = MODEL
        for field in ("max_tokens", "max_completion_tokens"):
            value = case.body.get(field)
            if not isinstance(value, int) or isinstance(value, bool) or value > 8:
                case.body[field] = 8
    return case


# -- a schema fuzz run over the server's own OpenAPI document: no input may produce a 5xx --------
FUZZ_EXAMPLES = 40  # per operation and mode


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_schema_fuzz_no_server_errors(server, mode):
    """Schemathesis generates bodies that follow (positive) and break (negative) every operation's
    schema; each is sent to the server, and none may get a 5xx."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable

    schema = schemathesis.openapi.from_url(server + "/openapi.json")
    statuses: dict[str, dict[int, int]] = {}
    for result in schema.get_all_operations():
        op = result.ok()
        seen = statuses.setdefault(op.label, {})

        strategy = op.as_strategy(generation_mode=schemathesis.GenerationMode(mode))
        if mode == "positive":  # name the served model, or every valid body is a plain 404
            strategy = strategy.map(_with_served_model)

        @given(case=strategy)
        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
        def fuzz(case):
            response = case.call(base_url=server, timeout=60)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, (case.body, response.text[:300])

        try:
            fuzz()
        except Unsatisfiable:  # nothing to break in an operation without parameters (negative mode)
            assert mode == "negative" and op.method.upper() == "GET"
    print(f"schema fuzz ({mode}) statuses per operation: {statuses}")
    assert statuses["POST /v1/completions"] and statuses["POST /v1/chat/completions"]
