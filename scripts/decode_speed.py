"""Decode speed after the first token, per method, from a `verispec bench` results.json: tokens
after the first over the time after the first token, mean over questions, and each method's ratio
to a baseline method and to llama.cpp's native plain decoding where the run has it.

    .venv/bin/python scripts/decode_speed.py docs/results/pair-47/humaneval/results.json [--baseline plain]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys


def decode_speeds(records: list[dict]) -> dict[str, list[float]]:
    """method -> decode tok/s of each question (new tokens after the first over the time after it)."""
    out: dict[str, list[float]] = collections.defaultdict(list)
    for r in records:
        after = r["wall_time"] - r["ttft"]
        if r["new_tokens"] > 1 and after > 0:
            out[r["method"]].append((r["new_tokens"] - 1) / after)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results")
    ap.add_argument("--baseline", default="plain")
    args = ap.parse_args()
    data = json.load(open(args.results))
    speeds = decode_speeds(data["records"])
    mean = {m: statistics.mean(v) for m, v in speeds.items()}
    forwards = collections.defaultdict(lambda: [0, 0])
    for r in data["records"]:
        forwards[r["method"]][0] += r["new_tokens"]
        forwards[r["method"]][1] += r["target_forwards"]
    base, native = mean.get(args.baseline), mean.get("llamacpp_native")
    print(f"| method | decode tok/s | x {args.baseline} | x llamacpp_native | tokens per target forward |")
    print("|---|---|---|---|---|")
    for m, v in mean.items():
        ratio = f"{v / base:.2f}x" if base else "-"
        vs_native = f"{v / native:.2f}x" if native else "-"
        tokens, fw = forwards[m]
        print(f"| {m} | {v:.1f} | {ratio} | {vs_native} | {tokens / max(fw, 1):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
