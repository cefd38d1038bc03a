"""`verispec demo`: the bundled model decodes a few Spec-Bench prompts plainly and speculatively,
side by side (interleaved per prompt), and shows whether the outputs are identical and the speedup."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tqdm import tqdm

from verispec.config import SamplingParams, SpeculativeConfig
from verispec.errors import VerispecError

DEFAULT_QUESTIONS = "shared/data/spec_bench/question.jsonl"


class DataNotFoundError(VerispecError):
    """Spec-Bench's question file could not be found."""


def find_spec_bench(path: str | None = None) -> Path:
    """The given path, $VERISPEC_SPEC_BENCH, or shared/data/spec_bench/question.jsonl in a parent
    of the working directory or of this package (the project's ../shared)."""
    if path:
        p = Path(path)
        if not p.exists():
            raise DataNotFoundError(f"Spec-Bench questions not found at {p}")
        return p
    if os.environ.get("VERISPEC_SPEC_BENCH"):
        return find_spec_bench(os.environ["VERISPEC_SPEC_BENCH"])
    for start in (Path.cwd(), Path(__file__).resolve()):
        for parent in [start, *start.parents]:
            candidate = parent / DEFAULT_QUESTIONS
            if candidate.exists():
                return candidate
    raise DataNotFoundError(
        f"cannot find {DEFAULT_QUESTIONS} above {Path.cwd()}; pass --questions PATH or set VERISPEC_SPEC_BENCH"
    )


def load_questions(path: Path) -> list[dict]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


def subtask(question: dict) -> str:
    """Spec-Bench's six subtasks: MT-bench's eight categories count as one, multi_turn."""
    return "multi_turn" if question["category"] in MT_BENCH else question["category"]


def pick_spread(questions: list[dict], n: int) -> list[dict]:
    """n questions taken round-robin across the six subtasks, so every one is represented."""
    by_cat: dict[str, list[dict]] = {}
    for q in questions:
        by_cat.setdefault(subtask(q), []).append(q)
    picked: list[dict] = []
    i = 0
    while len(picked) < n and any(i < len(v) for v in by_cat.values()):
        for v in by_cat.values():
            if i < len(v) and len(picked) < n:
                picked.append(v[i])
        i += 1
    return picked


def run_demo(args: argparse.Namespace) -> int:
    from verispec import LLM
    from verispec.cli import _from_args
    from verispec.config import EngineConfig
    from verispec.engine.llm import engine_options
    from verispec.engine.speculative import SpeculativeDecoder

    method = args.method or "prompt_lookup"
    spec = _from_args(SpeculativeConfig, args, method=method)  # every engine and speculation flag counts
    engine = _from_args(EngineConfig, args, speculative=spec)
    questions = pick_spread(load_questions(find_spec_bench(args.questions)), args.num_prompts)
    t0 = time.perf_counter()
    llm = LLM(engine.model, speculative=spec, **engine_options(engine))
    print(f"loaded {args.model} in {time.perf_counter() - t0:.1f}s; method {method}, k={spec.num_speculative_tokens}")
    plain = SpeculativeDecoder(llm.runner)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    tok = llm.tokenizer
    rows = []
    bar = tqdm(questions, desc="demo", unit="prompt", file=sys.stderr)
    for q in bar:
        ids = tok.encode_chat([{"role": "user", "content": q["turns"][0]}])
        bar.set_postfix_str(f"q{q['question_id']} {subtask(q)}: plain")
        a = plain.generate(ids, params)
        bar.set_postfix_str(f"q{q['question_id']} {subtask(q)}: {method}")
        b = llm.decoder.generate(ids, params)
        rows.append((q, a, b))
    bar.close()

    print(f"\n{'id':>4} {'category':<14} {'tokens':>6} {'plain tok/s':>11} {'spec tok/s':>10} {'speedup':>7} {'accept len':>10} identical")
    all_same = True
    t_plain = t_spec = 0.0
    n_tok = 0
    for q, a, b in rows:
        same = a.output_ids == b.output_ids
        all_same &= same
        t_plain += a.metrics.total_time
        t_spec += b.metrics.total_time
        n_tok += len(a.output_ids)
        speedup = b.metrics.tokens_per_second / a.metrics.tokens_per_second
        print(
            f"{q['question_id']:>4} {subtask(q):<14} {len(a.output_ids):>6} {a.metrics.tokens_per_second:>11.1f} "
            f"{b.metrics.tokens_per_second:>10.1f} {speedup:>6.2f}x {b.metrics.mean_acceptance_length:>10.2f} "
            f"{'yes' if same else 'NO'}"
        )
        if not same:
            pos = next(i for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids + [None])) if x != y)
            print(f"     MISMATCH at output position {pos}: plain {a.output_ids[pos:pos + 5]} vs spec {b.output_ids[pos:pos + 5]}")
    first = rows[0]
    print(f"\nsample output (q{first[0]['question_id']}): {tok.decode(first[2].output_ids)[:300]!r}")
    print(
        f"\noverall: plain {n_tok / t_plain:.1f} tok/s, {method} {n_tok / t_spec:.1f} tok/s, "
        f"speedup {t_plain / t_spec:.2f}x; outputs identical: {'YES' if all_same else 'NO'}"
    )
    return 0 if all_same else 1
