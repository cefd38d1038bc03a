"""Peak memory with a target and its draft model loaded and a batch of requests running: the
process's peak RSS against the two GGUF files plus the KV caches the requests filled.

    .venv/bin/python scripts/pair_memory.py --model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b

Runs `--requests` HumanEval prompts (or the project's own prompts) together through the engine's
scheduler (the server's continuous batching, without HTTP), `--max-tokens` each, and prints one
Markdown row. The KV figure is what the runners' caches held at their fullest (target's and
draft's: `cache_bytes`, sampled after every step), the budget's worst case beside it.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--weights-format", default=None, help="the target's (default: gguf, exact)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--questions", default="humaneval")
    args = ap.parse_args()

    from verispec import LLM, SamplingParams
    from verispec.data import questions
    from verispec.engine.scheduler import Scheduler
    from verispec.models.weights.registry import resolve

    files = resolve(args.model).stat().st_size + resolve(args.draft_model).stat().st_size
    llm = LLM(args.model, weights_format=args.weights_format, max_num_seqs=args.requests,
              speculative={"method": "draft_model", "draft_model": args.draft_model, "num_speculative_tokens": 8})
    prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": q["turns"][0]}]) for q in questions(args.questions)[: args.requests]]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    scheduler = Scheduler(llm.decoder, max_num_seqs=args.requests, max_waiting=args.requests, kv_budget=llm.config.kv_cache_max_bytes)
    done: list = []
    for p in prompts:
        scheduler.submit(p, params, lambda e: done.append(e) if e.finished else None)
    runners = [llm.runner, llm.decoder.proposer.runner]
    kv_peak, t = 0, time.perf_counter()
    while len(done) < len(prompts):
        scheduler.step()
        kv_peak = max(kv_peak, sum(r.cache_bytes for r in runners))
    wall = time.perf_counter() - t
    worst = sum(llm.decoder.kv_bytes(len(p) + args.max_tokens) for p in prompts)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
    ratio = rss / (files + kv_peak)
    print(f"| {args.model} + {args.draft_model} | {llm.runner.weights_format} | {args.requests} | {files / 2**20:.0f} | "
          f"{kv_peak / 2**20:.0f} | {worst / 2**20:.0f} | {rss / 2**20:.0f} | {ratio:.2f} | {wall:.0f} |")
    print("(model, target format, requests, files MiB, KV peak MiB, KV worst case MiB, peak RSS MiB, "
          "RSS / (files + KV peak), seconds)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
