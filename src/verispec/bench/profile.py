"""`verispec bench --profile`: the target's forward time for k = 1..32 new tokens at a few context
lengths, the curve speculation lives on (a k-token verification costs cost(k + 1)).

The result is saved as JSON that the engine can read back (`CostProfile.load`) to choose k.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm


@dataclass
class CostProfile:
    model: str
    contexts: list[int]
    ks: list[int]
    ms: dict[str, list[float]]  # str(context) -> median ms per forward, one per k

    def cost(self, k: int, context: int) -> float:
        """Median ms of a forward over k new tokens, at the profiled context nearest `context`."""
        ctx = min(self.contexts, key=lambda c: abs(c - context))
        return self.ms[str(ctx)][self.ks.index(min(self.ks, key=lambda x: abs(x - k)))]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> "CostProfile":
        return cls(**json.loads(Path(path).read_text()))


def measure(llm, model: str, contexts=(128, 512, 1024), ks=range(1, 33), repeats: int = 3) -> CostProfile:
    runner = llm.runner
    contexts = [c for c in contexts if c + max(ks) <= runner.max_context]
    ms: dict[str, list[float]] = {}
    bar = tqdm(total=len(contexts) * len(ks), desc="profile", unit="shape", file=sys.stderr)
    for ctx in contexts:
        seq = runner.open(ctx + max(ks))
        vocab = min(runner.vocab_size, 1000)
        runner.forward(seq, [(i * 7919) % vocab for i in range(ctx)], num_logits=1)
        row = []
        for k in ks:
            bar.set_postfix_str(f"context {ctx}, k {k}")
            tokens = [(i * 31) % vocab for i in range(k)]
            times = []
            for _ in range(repeats + 1):  # the first is a warm-up
                t = time.perf_counter()
                runner.forward(seq, tokens, num_logits=k)
                times.append((time.perf_counter() - t) * 1000)
                runner.truncate(seq, ctx)
            row.append(statistics.median(times[1:]))
            bar.update(1)
        runner.close(seq)
        ms[str(ctx)] = row
    bar.close()
    return CostProfile(model, list(contexts), list(ks), ms)


def table(profile: CostProfile) -> str:
    head = f"{'k':>3} " + " ".join(f"{'ctx ' + str(c):>10}" for c in profile.contexts) + "   (ms, median; ratio to k=1)"
    lines = [f"forward cost of {profile.model} over k new tokens", head]
    for i, k in enumerate(profile.ks):
        cells = []
        for c in profile.contexts:
            row = profile.ms[str(c)]
            cells.append(f"{row[i]:>6.1f} {row[i] / row[0]:>4.1f}x")
        lines.append(f"{k:>3} " + " ".join(f"{c:>10}" for c in cells))
    return "\n".join(lines)
