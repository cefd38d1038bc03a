"""Speed before and after a change, from bench runs made in alternation (before, after, before, ...).

    python scripts/compare_speed.py --before RUN [RUN ...] --after RUN [RUN ...]

Each RUN is a `verispec bench` output folder (its results.json). For every method, its speedup on a
question is its tokens/s over the same run's plain decoding of the same backend and format on that
question; a run's figure is the mean of those per-question ratios. Prints, per method, each run's
figure, the mean of the before runs and of the after runs, and after / before. Exits 1 where a
method's after / before falls outside 1 +- --tolerance (default 0.03).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from statistics import mean


def plain_of(method: str) -> str:
    """'suffix@torch:gguf-int8' -> 'plain@torch:gguf-int8'; 'suffix' -> 'plain'."""
    _, at, family = method.partition("@")
    return "plain" + (at + family if at else "")


def ratios(run: Path) -> dict[str, float]:
    """Method -> mean per-question tokens/s ratio over its plain decoding, in one run."""
    records = json.loads((run / "results.json").read_text())["records"]
    speed = {(r["method"], r["question_id"]): r["tokens_per_s"] for r in records}
    per_method: dict[str, list[float]] = defaultdict(list)
    for (method, question), tps in speed.items():
        base = speed.get((plain_of(method), question))
        if method != plain_of(method) and base:
            per_method[method].append(tps / base)
    return {m: mean(v) for m, v in sorted(per_method.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, nargs="+", required=True)
    parser.add_argument("--after", type=Path, nargs="+", required=True)
    parser.add_argument("--tolerance", type=float, default=0.03)
    args = parser.parse_args(argv)
    before = [ratios(r) for r in args.before]
    after = [ratios(r) for r in args.after]
    methods = sorted(set.intersection(*(set(r) for r in before + after)))
    print(f"{'method':32} {'before runs':>22} {'after runs':>22} {'before':>7} {'after':>7} {'after/before':>12}")
    out_of_range = []
    for m in methods:
        b, a = mean(r[m] for r in before), mean(r[m] for r in after)
        runs_b = " ".join(f"{r[m]:.3f}" for r in before)
        runs_a = " ".join(f"{r[m]:.3f}" for r in after)
        flag = "" if abs(a / b - 1) <= args.tolerance else "  <- outside tolerance"
        print(f"{m:32} {runs_b:>22} {runs_a:>22} {b:7.3f} {a:7.3f} {a / b:12.3f}{flag}")
        if flag:
            out_of_range.append(m)
    return 1 if out_of_range else 0


if __name__ == "__main__":
    raise SystemExit(main())
