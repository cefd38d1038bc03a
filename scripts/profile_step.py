"""Where a decoding step's time goes: the torch backend's forward split into its parts, beside each
part's floor.

For each weights format (the exact `gguf` and `gguf-int8` by default) and each row count (1: a
decoding step; k + 1: a verification of k drafts, logits at every row), the kernels' Stack times its
own parts (models/kernels/layer.cpp, Stack.set_profile: barrier to barrier, summed over the layers):
the q/k/v, o, gate/up and down products, the attention, the LM head, and the glue between them
(norms, RoPE, residuals, the activation, int8 quantisation of inputs); "outside" is the rest of the
forward (Python, the embedding lookup, allocations). Floors: a part's bytes read (its weights; the
attention's keys and values at that context) over the memory bandwidth measured in the same run
(bench/profile.py's measure_bandwidth: the faster of a 2-thread sum and a one-row product over
512 MiB), and for the exact arithmetic's products the compute bound (2 flops a weight a row over the
float32 peak measured here by MKL on a 2048^3 product).

    python scripts/profile_step.py [--model qwen2.5-coder-1.5b] [--rows 1 5 9] [--context 512]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from verispec import LLM
from verispec.bench.profile import measure_bandwidth
from verispec.models.kernels.quant import QuantTensor, weight_bytes
from verispec.runners.costs import kv_bytes_read

ROLES = ("qkv", "o", "gate_up", "down")


def float32_peak_gflops(n: int = 2048, repeats: int = 3) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def formats(w) -> str:
    return "+".join(sorted(set(w.formats))) if isinstance(w, QuantTensor) else "F32"


def part_sizes(model) -> dict[str, tuple[int, int, str]]:
    """part -> (bytes, weights, formats) over every layer."""
    out = {}
    for role in ROLES:
        ws = [getattr(layer, role) for layer in model.layers]
        fmts = sorted({f for w in ws for f in formats(w).split("+")})
        out[role] = (sum(weight_bytes(w) for w in ws), sum(w.shape[0] * w.shape[1] for w in ws), "+".join(fmts))
    head = model.lm_head
    out["head"] = (weight_bytes(head), head.shape[0] * head.shape[1], formats(head))
    return out


def profile(llm, rows: int, context: int, repeats: int) -> tuple[dict[str, float], float]:
    """(part -> ms per forward, whole forward ms), the best of `repeats` rounds of 5 forwards."""
    runner = llm.runner
    stack = runner.model._stack
    seq = runner.open(context + rows + 1)
    try:
        vocab = min(runner.vocab_size, 1000)
        runner.forward(seq, [(i * 7919) % vocab for i in range(context)], num_logits=1)
        tokens = [(i * 31) % vocab for i in range(rows)]
        best, best_parts = float("inf"), {}
        for _ in range(repeats + 1):  # the first round warms up
            stack.set_profile(True)
            t = time.perf_counter()
            for _ in range(5):
                runner.forward(seq, tokens, num_logits=rows)
                runner.truncate(seq, context)
            total = (time.perf_counter() - t) / 5 * 1000
            names, seconds, n = stack.profile()
            stack.set_profile(False)
            if total < best:
                best, best_parts = total, {k: s / n * 1000 for k, s in zip(names, seconds)}
        return best_parts, best
    finally:
        runner.close(seq)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--formats", nargs="+", default=["gguf", "gguf-int8"])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 5, 9])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    bandwidth = measure_bandwidth()
    peak = float32_peak_gflops()
    print(f"model {args.model}; context {args.context}; threads {torch.get_num_threads()}; "
          f"memory bandwidth {bandwidth:.1f} GB/s; float32 peak (MKL 2048^3) {peak:.0f} GFLOP/s")
    for fmt in args.formats:
        llm = LLM(args.model, weights_format=fmt, max_model_len=args.context + max(args.rows) + 8)
        model = llm.runner.model
        sizes = part_sizes(model)
        kv = kv_bytes_read(llm.runner.config, args.context, llm.runner.kv_bytes_per_value)
        sizes_all = {**sizes, "attention": (kv, 0, f"KV f32 @{args.context}")}
        results = {r: profile(llm, r, args.context, args.repeats) for r in args.rows}
        print(f"\n### {fmt} ({model.kernel_variant} kernels)\n")
        head = "| part | formats | MB read | " + " | ".join(
            f"{r} row{'s' if r > 1 else ''} ms | floor ms | x floor" for r in args.rows) + " |"
        print(head)
        print("|" + "---|" * (3 + 3 * len(args.rows)))
        order = ["qkv", "o", "gate_up", "down", "head", "attention", "glue", "outside", "forward"]
        for part in order:
            nbytes, weights, fmts = sizes_all.get(part, (0, 0, ""))
            cells = []
            for r in args.rows:
                parts, total = results[r]
                ms = total - sum(parts.values()) if part == "outside" else total if part == "forward" else parts[part]
                if part == "forward":
                    nbytes = sum(b for b, _, _ in sizes_all.values())
                    weights = sum(w for _, w, _ in sizes.values())
                mem = nbytes / bandwidth / 1e6 if nbytes else 0.0
                # the exact arithmetic's products: 2 flops a weight and row at the measured float32 peak
                comp = 2 * weights * r / peak / 1e6 if (weights and fmt == "gguf") else 0.0
                floor = max(mem, comp)
                cells.append(f"{ms:.2f} | {floor:.2f}{'c' if comp > mem else ''} | {ms / floor:.2f}" if floor else f"{ms:.2f} | - | -")
            print(f"| {part} | {fmts} | {nbytes / 1e6:.0f} | " + " | ".join(cells) + " |")
        print("\n(floor: bytes over bandwidth; 'c': the float32 compute bound is the higher)")
        del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
