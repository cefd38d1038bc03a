"""Plain decoding and prompt processing: verispec beside llama.cpp's own native `llama-bench`, on the
same GGUF files, in one run.

Per model, interleaved: llama-bench's tg128 (`-t 2 -p 0 -n 128 -r 3`), then ours, then llama-bench
again (the faster of its two runs counts); ours is `LLM.generate` with `ignore_eos`, 128 tokens after
a short prompt, decode speed after the first token, best of 3, for each weights format. Prompt
processing: our time to the first token of a 512-token prompt (best of 3) beside llama-bench's pp512
(`-p 512 -n 0 -r 3`). The memory bandwidth is measured once in the same run (bench/profile.py's
measure_bandwidth), with each model's bytes a token (weights + the KV cache read after the short
prompt) and the floor they set. llama.cpp's tools come from `make peers` (verispec.bench.native).

    python scripts/compare_native.py [--models smollm2-135m gemma3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b]
        [--formats gguf gguf-int8] [--out docs/results/native-<date>]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from verispec import LLM, SamplingParams
from verispec.bench import native
from verispec.bench.profile import measure_bandwidth
from verispec.models.kernels import rowwise
from verispec.models.weights import chunked
from verispec.models.weights.registry import resolve
from verispec.runners.costs import kv_bytes_read, time_forwards

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."


def llama_bench(model: Path, prompt: int, gen: int, repeats: int = 3, threads: int = 2) -> float:
    """llama-bench's mean tokens/s for one test (pp<prompt> or tg<gen>)."""
    cmd = [str(native.tool("llama-bench")), "-m", str(model), "-t", str(threads), "-p", str(prompt), "-n", str(gen),
           "-r", str(repeats), "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed: {done.stderr[-2000:]}")
    rows = json.loads(done.stdout)
    return float(rows[0]["avg_ts"])


def ours_decode(llm: LLM, tokens: int, repeats: int) -> float:
    """Best of `repeats` decode speeds (tokens after the first over the time after the first)."""
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    llm.generate(PROMPT, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))  # warm-up
    best = 0.0
    for _ in range(repeats):
        m = llm.generate(PROMPT, params)[0].metrics
        best = max(best, (m.num_output_tokens - 1) / (m.total_time - m.time_to_first_token))
    return best


def ours_prefill(llm: LLM, n: int, repeats: int) -> float:
    """Best of `repeats` prompt speeds: n prompt tokens over the time to the first token."""
    vocab = min(llm.runner.vocab_size, 20000)
    prompt = [100 + (i * 7919) % (vocab - 100) for i in range(n)]
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    llm.generate(prompt[: n // 4], params)  # warm-up
    best = 0.0
    for _ in range(repeats):
        m = llm.generate(prompt, params)[0].metrics
        best = max(best, n / m.time_to_first_token)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_models = ["smollm2-135m", "gemma3-270m", *[m for m in chunked.CHUNKED if chunked.is_cached(m)]]
    ap.add_argument("--models", nargs="+", default=default_models)
    ap.add_argument("--formats", nargs="+", default=["gguf", "gguf-int8"])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-prefill", action="store_true", help="decoding only")
    ap.add_argument("--batch-rows", type=int, default=8,
                    help="also time one forward of this many rows (a verification) beside llama-bench -p N -n 0 (0: skip)")
    ap.add_argument("--out", type=Path, default=None, help="folder for native.json and table.md")
    args = ap.parse_args()

    try:
        native.where()
    except native.NativeUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    bandwidth = measure_bandwidth()
    header = (f"CPU: {rowwise.cpu_name()} ({rowwise.chosen_variant()} kernels); memory read bandwidth {bandwidth:.1f} GB/s "
              f"(2-thread sum / one-row product over 512 MiB, the faster); {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(header, flush=True)
    results = []
    for name in args.models:
        path = resolve(name)
        row: dict = {"model": name, "file": path.name}
        row["native_tg"] = [llama_bench(path, 0, args.tokens)]
        for fmt in args.formats:
            llm = LLM(name, weights_format=fmt, max_model_len=args.prompt_tokens + args.tokens + 64)
            row[f"{fmt}_tg"] = ours_decode(llm, args.tokens, args.repeats)
            if not args.no_prefill:
                row[f"{fmt}_pp"] = ours_prefill(llm, args.prompt_tokens, args.repeats)
            if args.batch_rows:
                # one forward of batch_rows new tokens with logits at each (a verification) after 64, best of 10
                row[f"{fmt}_batch_ms"] = time_forwards(llm.runner, 64, [args.batch_rows], repeats=10, best=True)[0]
            weights = llm.runner.weight_bytes
            kv = kv_bytes_read(llm.runner.config, 64, llm.runner.kv_bytes_per_value)
            row[f"{fmt}_floor_tg"] = bandwidth * 1e9 / (weights + kv)
            print(f"  {name} {fmt}: decode {row[f'{fmt}_tg']:.1f} tok/s" +
                  ("" if args.no_prefill else f", prompt {row[f'{fmt}_pp']:.1f} tok/s"), flush=True)
            del llm
        row["native_tg"].append(llama_bench(path, 0, args.tokens))
        if not args.no_prefill:
            row["native_pp"] = llama_bench(path, args.prompt_tokens, 0)
        if args.batch_rows:
            row["native_batch_ms"] = args.batch_rows / llama_bench(path, args.batch_rows, 0, repeats=10) * 1000
        print(f"  {name} llama-bench: tg{args.tokens} {row['native_tg']}" +
              ("" if args.no_prefill else f", pp{args.prompt_tokens} {row['native_pp']:.1f}"), flush=True)
        results.append(row)

    lines = [header, "",
             "| model | llama.cpp tg tok/s (before / after) | " +
             " | ".join(f"{f} tok/s (x native) | {f} x memory floor" for f in args.formats) +
             ("" if args.no_prefill else " | llama.cpp pp tok/s | " + " | ".join(f"{f} pp tok/s (x)" for f in args.formats)) +
             ("" if not args.batch_rows else f" | llama.cpp {args.batch_rows}-row batch ms | " +
              " | ".join(f"{f} {args.batch_rows}-row ms (speed x)" for f in args.formats)) + " |"]
    ncol = 2 + 2 * len(args.formats) + (0 if args.no_prefill else 1 + len(args.formats)) + (1 + len(args.formats) if args.batch_rows else 0)
    lines.append("|" + "---|" * ncol)
    for r in results:
        best = max(r["native_tg"])
        cells = [r["model"], " / ".join(f"{v:.1f}" for v in r["native_tg"])]
        for f in args.formats:
            cells += [f"{r[f + '_tg']:.1f} ({r[f + '_tg'] / best:.2f}x)", f"{r[f + '_tg'] / r[f + '_floor_tg']:.2f}"]
        if not args.no_prefill:
            cells.append(f"{r['native_pp']:.1f}")
            cells += [f"{r[f + '_pp']:.1f} ({r[f + '_pp'] / r['native_pp']:.2f}x)" for f in args.formats]
        if args.batch_rows:
            cells.append(f"{r['native_batch_ms']:.1f}")
            cells += [f"{r[f + '_batch_ms']:.1f} ({r['native_batch_ms'] / r[f + '_batch_ms']:.2f}x)" for f in args.formats]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"tg: {args.tokens} tokens after a short prompt (ours: best of {args.repeats}, after the first token; "
                 f"llama-bench -t 2 -p 0 -n {args.tokens} -r 3 before and after ours, the faster counts); "
                 f"x memory floor: our speed over bandwidth / (weight bytes + KV bytes read) (1.00 = at the floor); "
                 f"pp: {args.prompt_tokens}-token prompt, time to the first token (best of {args.repeats}) beside "
                 f"llama-bench -p {args.prompt_tokens} -n 0 -r 3; {args.batch_rows}-row batch: one forward of {args.batch_rows} "
                 f"new tokens with logits at each after 64 (ours, best of 10) beside llama-bench -p {args.batch_rows} -n 0 -r 10 "
                 f"(speed x: theirs over ours, above 1 is faster).")
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "native.json").write_text(json.dumps({"header": header, "results": results}, indent=1))
        (args.out / "table.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
