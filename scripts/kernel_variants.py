"""Each row-wise kernel variant this CPU runs, and MKL's products (VERISPEC_KERNELS=0's path),
side by side: one forward over 1 and 8 new tokens after 512 tokens of context, per bundled model
(ms, best of --repeats, the variants taken in turn each round so that drift on a shared machine
falls on all alike). Also checks that every variant's logits are bit-identical.

    python scripts/kernel_variants.py [--models smollm2-135m,gemma3-270m] [--rounds 3] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys

import torch

from verispec import LLM
from verispec.runners.costs import time_forwards
from verispec.models.kernels import rowwise


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2-135m,gemma3-270m")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--out", default=None, help="also write the table (markdown) here")
    args = p.parse_args()
    ways = [*rowwise.supported_variants(), "mkl"]
    lines = [f"# Kernel variants, {datetime.date.today()}: {rowwise.cpu_name()}, {torch.get_num_threads()} threads, "
             f"torch {torch.__version__}, Python {platform.python_version()}", "",
             f"`python scripts/kernel_variants.py --models {args.models} --rounds {args.rounds} --repeats {args.repeats}`: "
             f"one forward after {args.context} tokens, ms (best of {args.rounds} rounds x {args.repeats}); "
             "identical = logits of 1 and 8 rows bit-identical to the first variant's (MKL's products are another arithmetic)", "",
             "| model | products | 1 row | 8 rows | 8 rows / 1 row | identical |", "|---|---|---|---|---|---|"]
    for model in args.models.split(","):
        runners = {}
        for way in ways:
            rowwise._state["module"] = None if way == "mkl" else rowwise.load_variant(way)
            runners[way] = LLM(model).runner
        best = {w: [float("inf"), float("inf")] for w in ways}
        for r in range(args.rounds):
            for way in ways:
                ms = time_forwards(runners[way], args.context, [1, 8], repeats=args.repeats, best=True)
                best[way] = [min(a, b) for a, b in zip(best[way], ms)]
                print(f"{model} round {r + 1} {way}: {ms[0]:.1f} / {ms[1]:.1f} ms", file=sys.stderr, flush=True)
        logits = {}
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(3, 30000, (40,), generator=g).tolist()
        new = torch.randint(3, 30000, (8,), generator=g).tolist()
        for way, runner in runners.items():
            seq = runner.open(48)
            runner.forward(seq, prompt)
            one = runner.forward(seq, new[:1]).logits
            runner.truncate(seq, 40)
            logits[way] = torch.cat([one, runner.forward(seq, new, num_logits=8).logits])
            runner.close(seq)
        ref = logits[ways[0]]
        for way in ways:
            one, eight = best[way]
            diff = (logits[way] - ref).abs().max().item()
            same = "yes" if torch.equal(logits[way], ref) else f"no (max diff {diff:.2g})"
            if way == "mkl":  # its own arithmetic: invariant within itself (batch-invariant shapes), not equal to the kernels'
                same = f"n/a, own arithmetic (max diff {diff:.2g})"
            lines.append(f"| {model} | {way} | {one:.1f} | {eight:.1f} | {eight / one:.2f} | {same} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
