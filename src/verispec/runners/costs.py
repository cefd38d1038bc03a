"""Cost curves of the target's forward: cost(n) = time of a forward over n new tokens, in units of
a one-token forward. A k-token verification costs cost(k + 1); the speculation policy
(engine/policy.py) weighs it against the tokens a step is expected to yield.

Sources, chosen by SpeculativeConfig.cost_profile:
    "measured"  the default: timed on the loaded model once per machine, model, backend, format,
                kernel variant and thread count (`cached_cost`), then read from the verispec cache,
                so no user runs on another machine's numbers or pays for timing at every start
    "auto"      timed now on the loaded model (`measured_cost`, about a second for a 135M model)
    "builtin"   the backend's built-in curve (the runner's `builtin_cost()`, beside its runner:
                runners/torch_runner.py, runners/llamacpp.py), measured on one machine
    a path      a `verispec bench --profile` JSON (`CostProfile`, `profile_cost`)
k choices, and with them a seeded sampled request's exact tokens, depend on the curve; greedy
output never does.
Every curve is made non-decreasing: a measured dip (2 tokens timed below 1) is noise or a
kernel's blocking that a policy must not bet on.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from verispec.models.config import SLIDING
from verispec.models.cache import cache_root, log, memoised
from verispec.models.kernels.rowwise import cpu_name

CostCurve = Callable[[int], float]


def default_cost(n: int) -> float:
    """The torch backend's curve when nothing was measured (batch invariance off): a linear fit of
    SmolLM2's forwards up to 8 tokens (docs/results/forward-cost.md, "The built-in torch curves")."""
    return 1.0 + 0.15 * (n - 1)


def interpolated(points: Sequence[tuple[int, float]]) -> CostCurve:
    """A curve through (n, cost) points, linear between them and beyond the last (its last slope)."""

    def cost(n: int) -> float:
        for (n0, c0), (n1, c1) in zip(points, points[1:]):
            if n <= n1:
                return c0 + (c1 - c0) * (max(n, n0) - n0) / (n1 - n0)
        (n0, c0), (n1, c1) = points[-2:]
        return c1 + (c1 - c0) * (n - n1) / (n1 - n0)

    return cost


def split_cost(curve: CostCurve, rows: int) -> CostCurve:
    """`curve` for a runner that decodes at most `rows` rows at a time (llama.cpp's
    `invariant_rows`): n new tokens cost n // rows full decodes and one of the rest."""

    def cost(n: int) -> float:
        full, rest = divmod(n, rows)
        return full * curve(rows) + (curve(rest) if rest else 0.0)

    return cost


def relative(ms: Sequence[float]) -> list[float]:
    """Times of forwards over increasing numbers of new tokens (the first over one) in units of the
    first, never below 1 and non-decreasing."""
    curve: list[float] = []
    for t in ms:
        curve.append(max([t / ms[0], *curve[-1:], 1.0]))
    return curve


def monotone(ns: Sequence[int], ms: Sequence[float]) -> CostCurve:
    """A curve from times `ms` of forwards over `ns` new tokens (ns[0] == 1): relative to one token,
    non-decreasing, the nearest measured n answering for any other."""
    curve = relative(ms)

    def cost(n: int) -> float:
        return curve[min(range(len(ns)), key=lambda i: abs(ns[i] - n))]

    return cost


@dataclass
class CostProfile:
    """A measured cost profile (`verispec bench --profile` writes one per backend and format; the
    engine reads it back through `SpeculativeConfig.cost_profile`)."""

    model: str
    contexts: list[int]
    ks: list[int]
    ms: dict[str, list[float]]  # str(context) -> median ms per forward, one per k
    backend: str = "torch"
    weights_format: str = "float32"
    weight_bytes: int = 0
    bandwidth_gbs: float = 0.0  # measured read bandwidth of this machine
    linear_floor_ms: float | None = None  # torch: one token through every linear layer, best of 10
    forward_best_ms: float | None = None  # torch: a one-token forward after 512 tokens, best of 10, beside the floor
    kv_bytes_512: int = 0  # keys and values a one-token forward reads after 512 tokens (kv_bytes_read)

    @property
    def bound_ms(self) -> float:
        """Bandwidth bound of a one-token forward: every weight byte read once."""
        return self.weight_bytes / (self.bandwidth_gbs * 1e9) * 1000 if self.bandwidth_gbs else float("nan")

    @property
    def bound_kv_ms(self) -> float:
        """The same bound after 512 tokens, counting the KV cache's bytes the attention reads too."""
        return (self.weight_bytes + self.kv_bytes_512) / (self.bandwidth_gbs * 1e9) * 1000 if self.bandwidth_gbs else float("nan")

    def cost(self, k: int, context: int) -> float:
        """Median ms of a forward over k new tokens, at the profiled context nearest `context`."""
        ctx = min(self.contexts, key=lambda c: abs(c - context))
        return self.ms[str(ctx)][self.ks.index(min(self.ks, key=lambda x: abs(x - k)))]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> "CostProfile":
        return cls(**json.loads(Path(path).read_text()))


def profile_cost(profile: CostProfile, context: int = 512) -> CostCurve:
    """The curve of a measured `CostProfile` (verispec bench --profile) at its context nearest `context`."""
    return monotone(profile.ks, [profile.cost(k, context) for k in profile.ks])


def time_forwards(runner, context: int, ks: Sequence[int], repeats: int = 3, progress=None, best: bool = False) -> list[float]:
    """Median (or with `best`, least) ms of a forward over k new tokens after `context` tokens,
    for each k in `ks`.

    Opens a sequence of its own, fills it with `context` tokens, times each k (one warm-up
    forward first) rolling back after each, and closes it."""
    seq = runner.open(context + max(ks))
    try:
        vocab = min(runner.vocab_size, 1000)
        if context:
            runner.forward(seq, [(i * 7919) % vocab for i in range(context)], num_logits=1)
        row = []
        for k in ks:
            tokens = [(i * 31) % vocab for i in range(k)]
            times = []
            for _ in range(repeats + 1):  # the first is a warm-up
                t = time.perf_counter()
                runner.forward(seq, tokens, num_logits=k)
                times.append((time.perf_counter() - t) * 1000)
                runner.truncate(seq, context)
            row.append(min(times[1:]) if best else statistics.median(times[1:]))
            if progress is not None:
                progress(k)
        return row
    finally:
        runner.close(seq)


def measured_points(runner, max_n: int, context: int = 256, repeats: int = 3) -> list[tuple[int, float]]:
    """(n, relative cost) of the loaded model for n = 1, 2, 3, 4, 6, 8, 12, 16, ... up to max_n new
    tokens, best of `repeats` each (the least disturbed timing on a shared machine)."""
    context = max(0, min(context, runner.max_context - max_n))
    ns = sorted({n for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if n < max_n} | {max_n})
    return list(zip(ns, relative(time_forwards(runner, context, ns, repeats, best=True))))


def measured_cost(runner, max_n: int, context: int = 256, repeats: int = 3) -> CostCurve:
    """The loaded model's own curve for 1..max_n new tokens, timed now (cost_profile="auto"),
    linear between the timed points."""
    return interpolated(measured_points(runner, max_n, context, repeats))


CACHED_MAX_N = 17  # the cached curve covers k up to 16 (a longer one is timed and cached apart)


def cached_cost(runner, max_n: int) -> CostCurve:
    """The loaded model's curve timed once for this machine (cost_profile="measured") and kept in
    the verispec cache (cost-curves.json), keyed by the CPU, the runner's `cost_identity()` (model
    file, backend, format, kernel variant, batch invariance) and the thread count."""
    n = max(CACHED_MAX_N, max_n)
    key = f"{cpu_name()}|{runner.cost_identity()}|{torch.get_num_threads()} threads|n<={n}"

    def measure() -> list[tuple[int, float]]:
        log(f"timing this model's forward cost curve once for this machine (cached in {cache_root() / 'cost-curves.json'})")
        return measured_points(runner, n)

    return interpolated([(int(a), float(b)) for a, b in memoised("cost-curves.json", key, measure)])


def kv_bytes_read(config, context: int, bytes_per_value: float) -> int:
    """Bytes of keys and values a one-token forward reads after `context` tokens: every layer's kv
    heads over the positions it sees (a sliding layer at most its window)."""
    positions = 0
    for kind in config.layer_types:
        window = config.sliding_window if kind == SLIDING and config.sliding_window else context
        positions += min(context, window)
    return int(positions * config.num_kv_heads * config.head_dim * 2 * bytes_per_value)


def cached_relative_cost(draft, target, context: int = 256, repeats: int = 5) -> float:
    """A draft model's one-token forward over the target's (best of `repeats` each, after
    `context` tokens): a draft token's price in the k policy. Timed once per machine and pair
    (both runners' `cost_identity()`, the thread count) and kept in the verispec cache, as the
    curves are, so every request of every run prices drafts alike."""
    key = f"{cpu_name()}|{draft.cost_identity()}|over|{target.cost_identity()}|{torch.get_num_threads()} threads"

    def measure() -> float:
        log(f"timing the draft model's forward against the target's once for this machine (cached in {cache_root() / 'draft-costs.json'})")
        ctx = max(0, min(context, draft.max_context - 1, target.max_context - 1))
        (d,), (t,) = time_forwards(draft, ctx, [1], repeats, best=True), time_forwards(target, ctx, [1], repeats, best=True)
        return d / max(t, 1e-9)

    return float(memoised("draft-costs.json", key, measure))
