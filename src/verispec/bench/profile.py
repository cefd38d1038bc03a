"""`verispec bench --profile`: the target's forward time for k = 1..32 new tokens at a few context
lengths, per backend and weights format: the curve speculation lives on (a k-token verification
costs cost(k + 1)). Also the physical limit: the machine's memory bandwidth, and each backend's
one-token forward as a fraction of the bound it sets (weights read once per token: weight bytes /
bandwidth; and after 512 tokens, with the keys and values the attention reads added to the weights:
at that context SmolLM2's float32 KV cache is a quarter of its Q4_1 weights' bytes); for the torch
backend, the time its linear layers alone take.

Each result is saved as JSON that the engine reads back (`--cost-profile`, `CostProfile.load`)
to choose k.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tqdm import tqdm

from verispec.runners.costs import CostProfile, kv_bytes_read, time_forwards


def measure_bandwidth(mib: int = 512, repeats: int = 5) -> float:
    """Read bandwidth in GB/s: the best of a few passes over a buffer far larger than the caches,
    by torch's sum and, where it builds, the row-wise kernel's one-row product. The sum alone
    varies widely between runs (how the buffer's pages were mapped), the kernel's product little,
    so the faster of the two answers (docs/results/forward-cost.md)."""
    import torch

    from verispec.models.kernels import rowwise

    x = torch.ones(mib * 2**20 // 4)
    passes = [x.sum]
    kernel = rowwise.kernel()
    if kernel is not None:
        w, row = x.view(-1, 4096), torch.ones(1, 4096)
        passes.append(lambda: kernel.rows_mm(row, w))
    best = float("inf")
    for run in passes:
        run()
        for _ in range(repeats):
            t = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


def linear_floor_ms(runner, repeats: int = 10, project=None) -> float:
    """One token through every linear layer of our torch model (LM head included), best of
    `repeats`, as `project(x, w)` runs them (default: our `project`)."""
    import torch

    from verispec.models.decoder.transformer import project

    project = project or project
    m = runner.model
    ws = [w for layer in m.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [m.lm_head]
    xs = [torch.randn(1, w.shape[1], dtype=w.dtype) for w in ws]
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats + 1):
            t = time.perf_counter()
            for x, w in zip(xs, ws):
                project(x, w)
            best = min(best, time.perf_counter() - t)
    return best * 1000


def floor_pair(runner, context: int = 512, rounds: int = 3) -> tuple[float, float]:
    """(one-token forward after `context` tokens, linear floor): each the best of 10, the two timed
    in turn for `rounds` rounds, so they see the same machine. Like for like: the profile's
    curve holds medians, and a median forward over a best-of floor overstates the ratio
    (docs/results/forward-cost.md)."""
    forward, floor = float("inf"), float("inf")
    for _ in range(rounds):
        forward = min(forward, time_forwards(runner, context, [1], repeats=10, best=True)[0])
        floor = min(floor, linear_floor_ms(runner))
    return forward, floor


def run_profiles(model: str, backends: list[str], out: Path) -> int:
    """Profile each backend[:format]; print the tables and save cost_profile-<backend>.json each."""
    from verispec import LLM
    from verispec.runners.torch_runner import TorchRunner
    from verispec.runners.registry import family_options

    bandwidth = measure_bandwidth()
    print(f"memory read bandwidth: {bandwidth:.1f} GB/s", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    profiles = []
    for spec in backends:
        backend, _, fmt = spec.partition(":")
        llm = LLM(model, **family_options(spec))
        profile = measure(llm, model)
        profile.backend = backend
        options = family_options(spec)
        profile.weights_format = llm.runner.weights_format + (", batch_invariant off" if options.get("batch_invariant") is False else "")
        profile.weight_bytes = llm.runner.weight_bytes
        profile.bandwidth_gbs = bandwidth
        profile.kv_bytes_512 = kv_bytes_read(llm.runner.config, 512, llm.runner.kv_bytes_per_value)
        if isinstance(llm.runner, TorchRunner):  # the floor of its linear layers, through our decoder
            profile.forward_best_ms, profile.linear_floor_ms = floor_pair(llm.runner, min(512, llm.runner.max_context - 1))
        path = out / f"cost_profile-{spec.replace(':', '-')}.json"
        profile.save(path)
        profiles.append(profile)
        print(table(profile))
        print(f"saved {path}\n")
        del llm
    print(summary(profiles))
    return 0


def summary(profiles: list[CostProfile]) -> str:
    lines = [
        "| backend | weights | weight MB | one-token forward ms (ctx 512, median) | bandwidth bound ms | fraction of bound | "
        "KV MB read at ctx 512 | bound with it ms | best forward / that bound | "
        "linear floor ms (best of 10) | forward / floor (best of 10 each, timed in turn) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in profiles:
        one = p.cost(1, 512)
        floor = "- | -"
        best = "-"
        if p.linear_floor_ms:  # run_profiles times forward_best_ms with it
            floor = f"{p.linear_floor_ms:.1f} | {p.forward_best_ms:.1f} / {p.linear_floor_ms:.1f} = {p.forward_best_ms / p.linear_floor_ms:.2f}x"
            best = f"{p.forward_best_ms:.1f} / {p.bound_kv_ms:.1f} = {p.forward_best_ms / p.bound_kv_ms:.2f}x"
        lines.append(
            f"| {p.backend} | {p.weights_format} | {p.weight_bytes / 1e6:.0f} | {one:.1f} | {p.bound_ms:.1f} | "
            f"{p.bound_ms / one:.2f} | {p.kv_bytes_512 / 1e6:.1f} | {p.bound_kv_ms:.1f} | {best} | {floor} |"
        )
    return "\n".join(lines)


def measure(llm, model: str, contexts=(128, 512, 1024), ks=range(1, 33), repeats: int = 3) -> CostProfile:
    runner = llm.runner
    ks = list(ks)
    contexts = [c for c in contexts if c + max(ks) <= runner.max_context]
    ms: dict[str, list[float]] = {}
    bar = tqdm(total=len(contexts) * len(ks), desc="profile", unit="shape", file=sys.stderr)
    for ctx in contexts:
        bar.set_postfix_str(f"context {ctx}")
        ms[str(ctx)] = time_forwards(runner, ctx, ks, repeats, progress=lambda k: bar.update(1))
    bar.close()
    return CostProfile(model, list(contexts), ks, ms)


def table(profile: CostProfile) -> str:
    head = f"{'k':>3} " + " ".join(f"{'ctx ' + str(c):>10}" for c in profile.contexts) + "   (ms, median; ratio to k=1)"
    lines = [f"forward cost of {profile.model} ({profile.backend}, {profile.weights_format}) over k new tokens", head]
    for i, k in enumerate(profile.ks):
        cells = []
        for c in profile.contexts:
            row = profile.ms[str(c)]
            cells.append(f"{row[i]:>6.1f} {row[i] / row[0]:>4.1f}x")
        lines.append(f"{k:>3} " + " ".join(f"{c:>10}" for c in cells))
    return "\n".join(lines)
