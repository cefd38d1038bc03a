"""Replicas on Ray Serve (verispec.cluster): a local Ray cluster started by the test, two replicas of
a tiny model deployed onto it by `verispec serve --ray-address`, against one plain `verispec serve`
of the same model, through the official client."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections import defaultdict

import httpx2 as httpx
import openai
import pytest

from server_utils import metric, server_process
from verispec.cluster.metrics import MetricsBoard, merge
from verispec.cluster.routing import AffinityTable, affinity_keys, choose
from verispec.config import ClusterConfig
from verispec.errors import ConfigError

MODEL = "tiny"
SERVE_ARGS = ("--served-model-name", MODEL, "--method", "prompt_lookup", "--k", "4", "--num-threads", "1")


# -- without Ray --------------------------------------------------------------------------------
def test_affinity_keys_follow_conversations():
    sys_msg = {"role": "system", "content": "You are terse."}
    turn1 = [sys_msg, {"role": "user", "content": "hi"}]
    turn2 = turn1 + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    k1, k2 = affinity_keys("/v1/chat/completions", {"model": "m", "messages": turn1}), affinity_keys(
        "/v1/chat/completions", {"model": "m", "messages": turn2})
    assert len(k1) == 2 and len(k2) == 4 and k2[:2] == k1  # the next turn extends the earlier one's keys
    other = affinity_keys("/v1/chat/completions", {"model": "m", "messages": [sys_msg, {"role": "user", "content": "yo"}]})
    assert other[0] == k1[0] and other[1] != k1[1]  # a shared system prompt shares only its key
    assert affinity_keys("/v1/chat/completions", {"model": "n", "messages": turn1})[0] != k1[0]  # per model
    long = "x" * 600
    assert len(affinity_keys("/v1/completions", {"model": "m", "prompt": long})) == 3  # cut at 256, 512, end
    assert affinity_keys("/v1/completions", {"model": "m", "prompt": long + "y"})[:2] == affinity_keys(
        "/v1/completions", {"model": "m", "prompt": long})[:2]
    assert affinity_keys("/v1/completions", {"prompt": [1, 2, 3]}) and affinity_keys("/v1/models", {}) == []
    assert affinity_keys("/v1/completions", ["not", "a", "dict"]) == []


def test_choose_prefers_the_last_replica_within_the_imbalance():
    table = AffinityTable(capacity=4)
    table.record(["a", "ab"], "r1")
    assert choose(["a", "ab", "abc"], {"r1": 3, "r2": 0}, table, imbalance=4)[0] == ["r1"]
    assert choose(["a", "ab", "abc"], {"r1": 5, "r2": 0}, table, imbalance=4) == [["r2", "r1"]]  # too busy: least loaded
    assert choose(["zz"], {"r1": 1, "r2": 0}, table, imbalance=4) == [["r2", "r1"]]  # unknown prefix
    assert choose(["a"], {"r2": 0}, table, imbalance=4) == [["r2"]]  # r1 gone (or full)
    table.record(["ab"], "r2")  # the longest key wins, and the latest replica
    assert table.lookup(["a", "ab"], {"r1", "r2"}) == "r2"
    table.record(["c", "d", "e"], "r3")  # capacity 4: the least recently used leave
    assert len(table) == 4
    table.forget("r3")
    assert table.lookup(["c", "d", "e"], {"r3"}) is None
    spread = {choose([], {"r1": 0, "r2": 0}, table, 4)[0][0] for _ in range(64)}
    assert spread == {"r1", "r2"}  # ties broken at random: new conversations spread


def test_merge_labels_every_replica_series():
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    texts = {}
    for tag, n in (("a", 2), ("b", 5)):
        r = CollectorRegistry()
        Counter("vllm:request_success", "h", ["model_name"], registry=r).labels("m").inc(n)
        Histogram("vllm:e2e_request_latency_seconds", "h", buckets=(1.0,), registry=r).observe(0.5)
        texts[tag] = generate_latest(r).decode()
    families = {f.name: f for f in merge(texts)}
    success = [(s.labels["replica"], s.value) for s in families["vllm:request_success"].samples if s.name.endswith("_total")]
    assert sorted(success) == [("a", 2.0), ("b", 5.0)]
    assert {s.labels["replica"] for s in families["vllm:e2e_request_latency_seconds"].samples} == {"a", "b"}
    board = MetricsBoard()
    board.put("a", texts["a"], time.time())
    board.put("old", texts["b"], time.time() - 100)
    assert set(board.fresh(max_age=15)) == {"a"}


def test_cluster_config_is_checked():
    assert not ClusterConfig().enabled and ClusterConfig(replicas=2).enabled
    for bad in (dict(replicas=0), dict(min_replicas=1), dict(min_replicas=3, max_replicas=2),
                dict(replicas=2, min_replicas=1, max_replicas=2), dict(target_ongoing_requests=0), dict(affinity_imbalance=-1)):
        with pytest.raises(ConfigError):
            ClusterConfig(**bad)


# -- on a local Ray cluster ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def target(tiny_dir):
    return str(tiny_dir("llama", seed=0))


@pytest.fixture(scope="module")
def ray_address():
    ray = pytest.importorskip("ray")  # the README's set-up installs .[cluster]; CI runs these
    os.environ.setdefault("RAY_worker_niceness", "0")  # as `verispec serve --replicas` starts its clusters
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def cluster(target, ray_address):
    with server_process("--model", target, *SERVE_ARGS, "--ray-address", ray_address, "--replicas", "2",
                        "--replica-cpus", "1", timeout=300) as base:
        yield base


@pytest.fixture(scope="module")
def single(target):
    with server_process("--model", target, *SERVE_ARGS) as base:
        yield base


def _client(base: str, asynchronous: bool = False):
    cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return cls(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)


def _strip(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("id", "created")}


def test_same_answers_as_one_server(cluster, single):
    """Completions (greedy, seeded sampling, n=2, logprobs, echo), chat, a stream, and bad input:
    the cluster answers what one `verispec serve` answers (ids and timestamps aside)."""
    requests = [
        ("/v1/completions", dict(prompt="w5 w6 w7 w5 w6", max_tokens=20, temperature=0)),
        ("/v1/completions", dict(prompt=["w9 w8", "w1"], max_tokens=12, temperature=0.9, seed=7, n=2, logprobs=2)),
        ("/v1/completions", dict(prompt="w3 w4", max_tokens=6, temperature=0, echo=True, stop=["w4"])),
        ("/v1/chat/completions", dict(messages=[{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w5 w6"}],
                                      max_tokens=16, temperature=0, logprobs=True, top_logprobs=2)),
        ("/v1/completions", dict(prompt="w5", max_tokens=10**6)),  # over the context: 400
        ("/v1/chat/completions", dict(messages="not a list")),  # 400
    ]
    for path, body in requests:
        a = httpx.post(cluster + path, json={"model": MODEL, **body}, timeout=60)
        b = httpx.post(single + path, json={"model": MODEL, **body}, timeout=60)
        assert a.status_code == b.status_code, (path, body, a.text)
        assert _strip(a.json()) == _strip(b.json()), (path, body)
    assert httpx.post(cluster + "/v1/completions", content=b"{not json", timeout=10).status_code == 400
    assert httpx.post(cluster + "/v1/completions", json={"model": "other", "prompt": "x"}, timeout=10).status_code == 404
    too_big = {"model": MODEL, "prompt": "w1 " * (3 * 2**20)}
    assert httpx.post(cluster + "/v1/completions", json=too_big, timeout=30).status_code == 413
    assert httpx.get(cluster + "/health", timeout=10).status_code == 200
    assert _client(cluster).models.list().data[0].id == MODEL

    def streamed(base):
        chunks = _client(base).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "w7 w8 w9"}], max_tokens=24, temperature=0, stream=True,
            stream_options={"include_usage": True})
        out = [(c.choices[0].delta.content, c.choices[0].finish_reason) if c.choices else c.usage.completion_tokens
               for c in chunks]
        return out

    assert streamed(cluster) == streamed(single)

    def official(base):  # the official client's objects, ids and timestamps aside
        c = _client(base)
        done = c.completions.create(model=MODEL, prompt="w11 w12 w11", max_tokens=16, temperature=0.7, seed=3, logprobs=1)
        chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w2 w4"}], max_tokens=10, temperature=0)
        return [_strip(done.model_dump()), _strip(chat.model_dump())]

    assert official(cluster) == official(single)


def test_16_concurrent_streams(cluster, single):
    """16 streams at once through the cluster: all complete, each with what one server gives it."""
    prompts = [" ".join(f"w{(i * 7 + j) % 90 + 3}" for j in range(3 + i % 4)) for i in range(16)]

    async def one(client, i):
        stream = await client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=30 + i, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
        text, finish = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def run(base):
        client = _client(base, asynchronous=True)
        return await asyncio.gather(*(one(client, i) for i in range(16)))

    together = asyncio.run(run(cluster))
    reference = asyncio.run(run(single))
    assert together == reference
    assert all(finish == "length" for _, finish in together)


def _replica_of(response: httpx.Response) -> str:
    return response.headers["x-verispec-replica"]


def test_conversation_turns_stay_on_one_replica(cluster):
    """12 conversations of 3 turns, interleaved: each conversation's turns land on one replica,
    while the conversations spread over both (new prefixes go to either of two idle replicas at
    random: all 12 on one happens with probability 2**-11). A system prompt they all shared would
    send them all to one replica while it is within `affinity_imbalance` of the other. First both
    replicas must be serving: the endpoint answers once the first has loaded, and until the second
    has, every new prefix rightly goes to the first (the suite flaked on that once)."""
    serving, deadline, i = set(), time.monotonic() + 120, 0
    while len(serving) < 2 and time.monotonic() < deadline:  # distinct one-token prompts: ties at random
        r = httpx.post(cluster + "/v1/completions", timeout=60,
                       json={"model": MODEL, "prompt": f"w{3 + i % 90} w{5 + i % 7}", "max_tokens": 1})
        serving.add(_replica_of(r))
        i += 1
    assert len(serving) == 2, "the second replica never answered"
    where: dict[int, set[str]] = defaultdict(set)
    history = {c: [{"role": "system", "content": f"w1 w{c + 50}"}] for c in range(12)}
    for turn in range(3):
        for c in range(12):
            history[c].append({"role": "user", "content": f"w{c + 10} w{turn + 40}"})
            r = httpx.post(cluster + "/v1/chat/completions", timeout=60,
                           json={"model": MODEL, "messages": history[c], "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200
            history[c].append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
            where[c].add(_replica_of(r))
    assert all(len(replicas) == 1 for replicas in where.values()), dict(where)
    assert len(set().union(*where.values())) == 2


def test_metrics_carry_the_replica_label(cluster):
    deadline = time.time() + 20
    while time.time() < deadline and metric(cluster, "verispec:cluster_replicas_reporting") < 2:
        time.sleep(0.5)
    text = httpx.get(cluster + "/metrics", timeout=10).text
    replicas = set(re.findall(r'vllm:num_requests_running\{[^}]*replica="([^"]+)"', text))
    assert len(replicas) == 2
    time.sleep(2.5)  # replicas push every second: earlier tests' requests are all counted now
    before = metric(cluster, "vllm:request_success_total")
    r = httpx.post(cluster + "/v1/completions", json={"model": MODEL, "prompt": "w4 w5", "max_tokens": 3}, timeout=60)
    served = _replica_of(r)
    assert served in replicas
    deadline = time.time() + 20  # replicas push every second
    while time.time() < deadline and metric(cluster, "vllm:request_success_total") < before + 1:
        time.sleep(0.3)
    time.sleep(1.5)  # and nothing else arrives
    assert metric(cluster, "vllm:request_success_total") == before + 1
    assert metric(cluster, "vllm:request_success_total", replica=served) >= 1
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text


def test_a_client_that_leaves_aborts_its_request(cluster):
    """A stream dropped by its client: the cancellation reaches the replica, which aborts the
    request and frees its cache (seen in that replica's metrics)."""
    body = {"model": MODEL, "prompt": "w5 w6", "max_tokens": 500, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", cluster + "/v1/completions", json=body, timeout=30) as r:
        replica = r.headers["x-verispec-replica"]
        aborted = metric(cluster, "vllm:request_success_total", finished_reason="abort", replica=replica)
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    deadline = time.time() + 20  # metrics arrive within a second or two
    while time.time() < deadline:
        if (metric(cluster, "vllm:request_success_total", finished_reason="abort", replica=replica) == aborted + 1
                and metric(cluster, "vllm:num_requests_running", replica=replica) == 0):
            break
        time.sleep(0.3)
    assert metric(cluster, "vllm:request_success_total", finished_reason="abort", replica=replica) == aborted + 1
    assert metric(cluster, "vllm:num_requests_running", replica=replica) == 0
    assert metric(cluster, "verispec:kv_cache_bytes", replica=replica) == 0


def test_a_replica_dies_during_load(cluster, ray_address):
    """Kill one replica while 12 requests run on both: requests it had not answered (non-streamed)
    are re-run elsewhere and succeed; its streams end with an error event; requests sent after the
    kill succeed; the replica is replaced and serves again."""
    import ray

    body = {"model": MODEL, "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    results: dict[int, tuple] = {}
    streaming_on: list[str] = []  # replicas of the streams that have sent their first event

    async def streamed(client, i):
        replica, events = None, []
        async with client.stream("POST", cluster + "/v1/completions", json={**body, "prompt": f"w{i + 3} w9", "stream": True}) as r:
            replica = r.headers.get("x-verispec-replica")
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    if not events:
                        streaming_on.append(replica)
                    events.append(line[6:])
        results[i] = ("stream", r.status_code, replica, events)

    async def whole(client, i):
        r = await client.post(cluster + "/v1/completions", json={**body, "prompt": f"w{i + 3} w8"})
        results[i] = ("whole", r.status_code, r.headers.get("x-verispec-replica"), r.json())

    # every replica's actor looked up before the load: under a busy machine the lookup took long
    # enough for the victim's streams to finish before the kill landed (no error left to report)
    actors = _replica_actors(ray)

    async def run():
        async with httpx.AsyncClient(timeout=120) as client:
            tasks = [asyncio.ensure_future((streamed if i % 2 else whole)(client, i)) for i in range(12)]
            # the kill as soon as a stream is under way: that stream has ~400 tokens to go (a fixed
            # wait after it let every request finish first once the forward got faster)
            while not streaming_on:
                await asyncio.sleep(0.005)
            assert len(results) == 0
            victim = streaming_on[0]
            await asyncio.to_thread(_kill, ray, actors, victim)
            after = [asyncio.ensure_future(whole(client, 100 + i)) for i in range(4)]
            await asyncio.gather(*tasks, *after)
            return victim

    victim = asyncio.run(run())
    assert len(results) == 16  # nothing lost
    errors = 0
    for i, (kind, status, replica, out) in results.items():
        assert status == 200, (i, out)
        if kind == "whole":
            assert out["choices"][0]["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 400
            # (one may have finished on the victim before the kill; the others were re-run elsewhere)
        else:
            assert out[-1] == "[DONE]"
            last = json.loads(out[-2])
            if "error" in last:
                assert replica == victim and last["error"]["code"] == "replica_failed"
                errors += 1
            else:
                assert last["choices"][0]["finish_reason"] == "length"
    assert errors >= 1  # the victim held streams: they were reported, not lost
    assert metric(cluster, "verispec:cluster_stream_errors_total") == errors
    deadline = time.time() + 120  # Ray Serve replaces the replica
    for attempt in range(1000):  # new prefixes each time (a known one would follow its affinity)
        replicas = {_replica_of(httpx.post(cluster + "/v1/chat/completions", timeout=60, json={
            "model": MODEL, "messages": [{"role": "user", "content": f"w{n} w{attempt}"}], "max_tokens": 2}))
            for n in range(3, 23)}
        if (len(replicas) == 2 and victim not in replicas) or time.time() > deadline:
            break
        time.sleep(1)
    assert len(replicas) == 2 and victim not in replicas


def _replica_actors(ray) -> dict[str, object]:
    """Every named actor's handle by name (Ray Serve's replica actors end with '#<replica tag>')."""
    return {a["name"]: ray.get_actor(a["name"], namespace=a["namespace"]) for a in ray.util.list_named_actors(all_namespaces=True)}


def _kill(ray, actors: dict[str, object], tag: str) -> None:
    """Kill (no restart) the replica actor of Ray Serve replica `tag` (handles from _replica_actors)."""
    for name, handle in actors.items():
        if name.endswith(f"#{tag}"):
            ray.kill(handle, no_restart=True)
            return
    raise AssertionError(f"no actor for replica {tag}")


def test_app_builder_reads_string_args(target):
    """`serve run verispec.cluster:build key=value ...` passes strings; KubeRay's YAML passes typed
    values; unknown or invalid options are refused before anything is deployed."""
    pytest.importorskip("ray")
    from verispec.cluster import build

    assert build({"model": target, "replicas": "2", "method": "prompt_lookup", "num_speculative_tokens": "4",
                  "enable_prefix_caching": "true", "replica_cpus": "0.5"}) is not None
    assert build({"model": target, "min_replicas": 1, "max_replicas": 3}) is not None
    with pytest.raises(ConfigError, match="unknown verispec options: replics"):
        build({"model": target, "replics": "2"})
    with pytest.raises(ConfigError):
        build({"model": target, "replicas": "0"})
