"""`verispec load`: a bounded load test of `verispec serve` on the loopback interface.

For each method (plain decoding, then each speculative method) it starts a server on a free
127.0.0.1 port, sends Spec-Bench questions (first turns, as chat) at each concurrency level as
streaming requests, and reports throughput (generated tokens per second of wall time), time to
first token and request latency percentiles. Bounded: at most `--requests` per level and
`--time-limit` seconds per level (requests not started by then are not sent).

`--overhead` also measures the server against the library at concurrency 1: the same prompts,
alternately through `LLM.chat` in this process and through the (idle otherwise) server, so
machine drift hits both alike; the ratio of their tokens per second is the server's overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from verispec.config import EngineConfig
from verispec.data import pick_spread, questions, spec_bench_available


def add_load_parser(sub) -> None:
    p = sub.add_parser("load", help="load-test `verispec serve` on loopback: throughput, TTFT, latency percentiles")
    p.add_argument("--model", default="smollm2-135m", help="model to serve (default: smollm2-135m)")
    p.add_argument("--methods", default="plain,prompt_lookup", help="comma list; plain = no speculation, else a --method of the server: prompt_lookup, suffix, ... "
                   "(default: plain,prompt_lookup)")
    p.add_argument("--concurrency", default="1,4,16", help="comma list of concurrency levels (default: 1,4,16)")
    p.add_argument("--requests", type=int, default=16, help="requests per level at most (default: 16)")
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per request (default: 64)")
    p.add_argument("--time-limit", type=float, default=300.0, help="seconds per level at most (default: 300)")
    p.add_argument("--questions", default=None,
                   help="question file, 'builtin' or 'repetitive' (the project's own prompts or repetitive workload; "
                   "default: Spec-Bench where found, else the project's own prompts)")
    p.add_argument("--overhead", action="store_true", help="also measure the server against the library at concurrency 1")
    p.add_argument("--k", type=int, default=4, help="draft tokens per step (default: 4)")
    p.add_argument("--backend", default=EngineConfig.backend, help=f"the server's backend (default: {EngineConfig.backend})")
    p.add_argument("--weights-format", default=None, help="llamacpp: Q8_0, F16 or F32 (default: the GGUF as shipped)")
    p.add_argument("--replicas", default="0",
                   help="comma list: 0 = one `verispec serve` process, N = N replicas on a local Ray cluster "
                   "(`--replicas N`, needs .[cluster]); with 0 and N both given, also the cluster's overhead "
                   "against one process at concurrency 1, alternating prompts (default: 0)")
    p.add_argument("--num-threads", type=int, default=None,
                   help="torch threads of every server and replica (default: torch's choice for one process; "
                   "the cores shared out between replicas)")
    p.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=True,
                   help="torch: the server's batch_invariant option (default: on)")


@dataclass
class Sample:
    ttft: float
    latency: float
    tokens: int


@dataclass
class Level:
    method: str
    concurrency: int
    wall: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0

    @property
    def throughput(self) -> float:
        return sum(s.tokens for s in self.samples) / self.wall if self.wall else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    i = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[i]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base: str, timeout: float = 600.0, proc: subprocess.Popen | None = None) -> None:
    """Poll GET /health until 200 (the model is loaded); fail early if the server process died."""
    import httpx2 as httpx

    deadline = time.time() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            raise TimeoutError(f"{base} did not become healthy in {timeout:.0f} s")
        time.sleep(0.2)


@contextmanager
def server_process(*args: str, timeout: float = 600.0):
    """`verispec serve ARGS` on a free 127.0.0.1 port; yields its base URL once it is healthy."""
    port = free_port()
    cmd = [sys.executable, "-m", "verispec.cli", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, timeout, proc)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _server(model: str, method: str, k: int, backend: str = EngineConfig.backend, weights_format: str | None = None,
            batch_invariant: bool = True, replicas: int = 0, num_threads: int | None = None):
    args = ["--model", model, "--served-model-name", "m", "--backend", backend]
    cores = os.cpu_count() or 1
    if replicas:  # the machine's cores shared out between the replicas
        args += ["--replicas", str(replicas), "--replica-cpus", f"{cores / replicas:g}"]
        num_threads = num_threads or max(1, cores // replicas)
    if num_threads:
        args += ["--num-threads", str(num_threads)]
    if weights_format:
        args += ["--weights-format", weights_format]
    if not batch_invariant:
        args += ["--no-batch-invariant"]
    if method != "plain":
        args += ["--method", method, "--k", str(k)]
    return server_process(*args)


async def _one(client, messages, max_tokens: int) -> Sample:
    start = time.perf_counter()
    ttft = None
    tokens = 0
    stream = await client.chat.completions.create(
        model="m", messages=messages, max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    async for chunk in stream:
        if chunk.choices and ttft is None and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - start
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    latency = time.perf_counter() - start
    return Sample(ttft if ttft is not None else latency, latency, tokens)


async def _level(base: str, method: str, concurrency: int, conversations: list, max_tokens: int, time_limit: float) -> Level:
    import openai

    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
    level = Level(method, concurrency)
    todo = list(conversations)
    start = time.perf_counter()

    async def worker() -> None:
        while todo and time.perf_counter() - start < time_limit:
            messages = todo.pop(0)
            try:
                level.samples.append(await _one(client, messages, max_tokens))
            except openai.APIError:
                level.errors += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    level.wall = time.perf_counter() - start
    await client.close()
    return level


def _conversations(path: str | None, n: int) -> list[list[dict]]:
    """n first turns of Spec-Bench's questions where they are found (or of the set given), else of
    the project's own; the set is cycled where it has fewer than n."""
    source = path or ("spec_bench" if spec_bench_available() else None)
    qs = questions(source)
    picked = pick_spread(qs, min(n, len(qs)))
    return [[{"role": "user", "content": picked[i % len(picked)]["turns"][0]}] for i in range(n)]


def _overhead(base: str, model: str, method: str, k: int, conversations: list, max_tokens: int,
              backend: str = EngineConfig.backend, weights_format: str | None = None, batch_invariant: bool = True) -> tuple[float, float]:
    """Tokens/s of the library and of the server at concurrency 1, alternating per prompt."""
    from verispec import LLM, SamplingParams

    spec = {"method": method, "num_speculative_tokens": k} if method != "plain" else None
    llm = LLM(model, speculative=spec, backend=backend, weights_format=weights_format, batch_invariant=batch_invariant)
    client = _client(base)
    lib_tokens = lib_time = srv_tokens = srv_time = 0.0
    for messages in conversations:
        t = time.perf_counter()
        out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=max_tokens))[0]
        lib_time += time.perf_counter() - t
        lib_tokens += len(out.token_ids)
        tokens, seconds = _timed_chat(client, messages, max_tokens)
        srv_tokens, srv_time = srv_tokens + tokens, srv_time + seconds
    return lib_tokens / lib_time, srv_tokens / srv_time


def _client(base: str):
    import openai

    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)


def _timed_chat(client, messages: list, max_tokens: int) -> tuple[int, float]:
    """One greedy, non-streamed chat request: (completion tokens, seconds)."""
    t = time.perf_counter()
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens, temperature=0)
    return r.usage.completion_tokens, time.perf_counter() - t


def _pair_overhead(single: str, cluster: str, conversations: list, max_tokens: int) -> tuple[float, float]:
    """Tokens/s of one server process and of the cluster at concurrency 1, alternating per prompt."""
    clients = [_client(single), _client(cluster)]
    tokens, spent = [0, 0], [0.0, 0.0]
    for messages in conversations:
        for i, client in enumerate(clients):
            n, seconds = _timed_chat(client, messages, max_tokens)
            tokens[i] += n
            spent[i] += seconds
    return tokens[0] / spent[0], tokens[1] / spent[1]


def _replicas(n: int) -> str:
    return f"{n} replica{'s' if n > 1 else ''}"


def run(args: argparse.Namespace) -> int:
    levels = [int(c) for c in args.concurrency.split(",")]
    replicas = [int(n) for n in args.replicas.split(",")]
    conversations = _conversations(args.questions, args.requests)
    results: list[Level] = []
    overheads: dict[str, tuple[float, float]] = {}
    cluster_overheads: dict[str, tuple[float, float]] = {}
    drafter: dict[str, tuple[float, float]] = {}  # per method: the drafter's cached tokens and bytes at the end
    serve = lambda method, n=0: _server(args.model, method, args.k, args.backend, args.weights_format,  # noqa: E731
                                        args.batch_invariant, replicas=n, num_threads=args.num_threads)
    for method in args.methods.split(","):
        for n in replicas:
            label = method if n == 0 else f"{method}, {_replicas(n)} on Ray"
            with serve(method, n) as base:
                asyncio.run(_level(base, method, 1, conversations[:2], 8, 60))  # warm-up, not reported
                for c in levels:
                    level = asyncio.run(_level(base, label, c, conversations, args.max_tokens, args.time_limit))
                    results.append(level)
                    print(_row(level), file=sys.stderr, flush=True)
                drafter[label] = (metric(base, "verispec:drafter_cached_tokens"), metric(base, "verispec:drafter_memory_bytes"))
                if args.overhead and n == 0:
                    overheads[method] = _overhead(base, args.model, method, args.k, conversations[: min(8, len(conversations))],
                                                  args.max_tokens, args.backend, args.weights_format, args.batch_invariant)
        if 0 in replicas:
            for n in (n for n in replicas if n):
                with serve(method, 0) as single, serve(method, n) as cluster:
                    asyncio.run(_level(cluster, method, 1, conversations[:2], 8, 60))  # warm-up
                    cluster_overheads[f"{method}, {_replicas(n)}"] = _pair_overhead(
                        single, cluster, conversations[: min(8, len(conversations))], args.max_tokens)
    print(report(args, results, overheads, drafter, cluster_overheads))
    return 0


def metric(base: str, name: str, **labels: str) -> float:
    """One series of the server's /metrics, summed over the labels not given (0 when absent)."""
    import httpx2 as httpx

    text = httpx.get(base + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([^{\s]+)(?:\{(.*)\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def _row(level: Level) -> str:
    ttft = [s.ttft for s in level.samples]
    lat = [s.latency for s in level.samples]
    return (
        f"| {level.method} | {level.concurrency} | {len(level.samples)} | {level.errors} | {level.throughput:.1f} | "
        f"{percentile(ttft, 50):.2f} / {percentile(ttft, 90):.2f} / {percentile(ttft, 99):.2f} | "
        f"{percentile(lat, 50):.2f} / {percentile(lat, 90):.2f} / {percentile(lat, 99):.2f} |"
    )


def report(args: argparse.Namespace, results: list[Level], overheads: dict[str, tuple[float, float]],
           drafter: dict[str, tuple[float, float]] | None = None,
           cluster_overheads: dict[str, tuple[float, float]] | None = None) -> str:
    lines = [
        f"Load test of `verispec serve --model {args.model} --backend {args.backend}"
        + (f" --weights-format {args.weights_format}" if args.weights_format else "")
        + ("" if args.batch_invariant else " --no-batch-invariant")
        + (f" --num-threads {args.num_threads}" if getattr(args, "num_threads", None) else "")
        + f"` on loopback: up to {args.requests} chat requests per level ({args.questions or 'Spec-Bench'} "
        f"first turns, cycled where fewer), {args.max_tokens} new tokens each, greedy, streamed.",
        "",
        "| method | concurrency | requests | errors | tokens/s | TTFT s p50 / p90 / p99 | latency s p50 / p90 / p99 |",
        "|---|---|---|---|---|---|---|",
        *(_row(r) for r in results),
    ]
    held = {m: v for m, v in (drafter or {}).items() if v[0]}
    if held:
        lines += ["", "What the drafter keeps across requests at the end of the method's run (suffix decoding's store):", ""]
        lines += [f"- {m}: {tokens:.0f} tokens, {nbytes / 2**20:.1f} MiB" for m, (tokens, nbytes) in held.items()]
    if overheads:
        lines += ["", "Server against the library at concurrency 1 (same prompts, alternating):", ""]
        for method, (lib, srv) in overheads.items():
            lines.append(f"- {method}: library {lib:.1f} tok/s, server {srv:.1f} tok/s, overhead {100 * (1 - srv / lib):+.1f}%")
    if cluster_overheads:
        lines += ["", "Ray Serve cluster against one `verispec serve` process at concurrency 1 (same prompts, alternating, "
                  "both up at once):", ""]
        for label, (one, many) in cluster_overheads.items():
            lines.append(f"- {label}: one process {one:.1f} tok/s, cluster {many:.1f} tok/s, overhead {100 * (1 - many / one):+.1f}%")
    return "\n".join(lines)
