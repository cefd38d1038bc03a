"""`verispec demo`: the bundled model decodes a few prompts plainly and speculatively, side by side
(interleaved per prompt), and shows whether the outputs are identical and the speedup. The prompts
are the project's own (verispec.prompts: Spec-Bench's six kinds of task), or a question file."""

from __future__ import annotations

import argparse
import sys
import time

from tqdm import tqdm

from verispec.config import SamplingParams, SpeculativeConfig
from verispec.data import pick_spread, questions as load_prompt_set, subtask


def run_demo(args: argparse.Namespace) -> int:
    from verispec import LLM
    from verispec.cli import _from_args
    from verispec.config import EngineConfig
    from verispec.engine.assembly import build_decoder

    method = args.method or "prompt_lookup"
    spec = _from_args(SpeculativeConfig, args, method=method)  # every engine and speculation flag counts
    engine = _from_args(EngineConfig, args, speculative=spec)
    questions = pick_spread(load_prompt_set(args.questions), args.num_prompts)
    t0 = time.perf_counter()
    llm = LLM.from_config(engine)
    print(f"loaded {args.model} in {time.perf_counter() - t0:.1f}s; method {method}, k={spec.num_speculative_tokens}")
    plain = build_decoder(llm.runner, None)
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
