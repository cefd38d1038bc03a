"""`verispec demo`: the bundled model decodes a few prompts plainly and speculatively, side by side
(interleaved per prompt), and shows whether the outputs are identical and the speedup. The prompts
are the project's own (verispec.prompts: Spec-Bench's six kinds of task), or a question file.
Drafters: --method; with --draft-model, prompt lookup and that draft model; or by default prompt
lookup and, where verispec ships an EAGLE-3 head for the model (heads/), eagle3 with that head: no
training needed."""

from __future__ import annotations

import argparse
import sys
import time

from tqdm import tqdm

from verispec.config import SamplingParams, SpeculativeConfig
from verispec.data import pick_spread, questions as load_prompt_set, subtask


DEFAULT_METHODS = ("prompt_lookup", "eagle3")  # the demo's drafters, each where it needs nothing beside the model


def demo_methods(args: argparse.Namespace, runner) -> list[str]:
    """--method where given; prompt lookup and the draft model where --draft-model is; else the
    default methods that draft for this model as it is (eagle3 where verispec ships a head for it)."""
    from verispec.engine.assembly import ready_methods

    if args.method:
        return [args.method]
    if args.draft_model:  # a draft model given: it drafts (and prompt lookup beside it)
        return ["prompt_lookup", "draft_model"]
    ready = ready_methods(runner)
    return [m for m in DEFAULT_METHODS if m in ready]


def run_demo(args: argparse.Namespace) -> int:
    from verispec import LLM
    from verispec.flags import from_args
    from verispec.config import EngineConfig
    from verispec.engine.assembly import build_decoder

    engine = from_args(EngineConfig, args, speculative=None)
    questions = pick_spread(load_prompt_set(args.questions), args.num_prompts)
    t0 = time.perf_counter()
    llm = LLM.from_config(engine)
    methods = demo_methods(args, llm.runner)
    specs = {m: from_args(SpeculativeConfig, args, method=m) for m in methods}  # every speculation flag counts
    decoders = {m: build_decoder(llm.runner, spec, engine) for m, spec in specs.items()}
    print(f"loaded {args.model} in {time.perf_counter() - t0:.1f}s; drafters: "
          + ", ".join(f"{m} (k={s.num_speculative_tokens})" for m, s in specs.items()))
    plain = build_decoder(llm.runner, None, engine)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    tok = llm.tokenizer
    rows = []  # (question, plain result, {method: result})
    bar = tqdm(questions, desc="demo", unit="prompt", file=sys.stderr)
    for q in bar:
        ids = tok.encode_chat([{"role": "user", "content": q["turns"][0]}])
        bar.set_postfix_str(f"q{q['question_id']} {subtask(q)}: plain")
        a = plain.generate(ids, params)
        spec_out = {}
        for m, decoder in decoders.items():
            bar.set_postfix_str(f"q{q['question_id']} {subtask(q)}: {m}")
            spec_out[m] = decoder.generate(ids, params)
        rows.append((q, a, spec_out))
    bar.close()

    head = f"{'id':>4} {'category':<14} {'tokens':>6} {'plain tok/s':>11}"
    for m in methods:
        head += f" | {m:>13} tok/s {'speedup':>7} {'accepted':>8} same"
    print("\n" + head)
    all_same = True
    t_plain, n_tok = 0.0, 0
    t_spec = dict.fromkeys(methods, 0.0)
    for q, a, outs in rows:
        t_plain += a.metrics.total_time
        n_tok += len(a.output_ids)
        line = f"{q['question_id']:>4} {subtask(q):<14} {len(a.output_ids):>6} {a.metrics.tokens_per_second:>11.1f}"
        mismatches = []
        for m in methods:
            b = outs[m]
            same = a.output_ids == b.output_ids
            all_same &= same
            t_spec[m] += b.metrics.total_time
            speedup = b.metrics.tokens_per_second / a.metrics.tokens_per_second
            line += (f" | {b.metrics.tokens_per_second:>19.1f} {speedup:>6.2f}x {b.metrics.mean_acceptance_length:>8.2f} "
                     f"{'yes ' if same else 'NO  '}")
            if not same:
                pos = next(i for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids + [None])) if x != y)
                mismatches.append(f"     MISMATCH ({m}) at output position {pos}: plain {a.output_ids[pos:pos + 5]} "
                                  f"vs spec {b.output_ids[pos:pos + 5]}")
        print(line)
        for msg in mismatches:
            print(msg)
    first = rows[0]
    print(f"\nsample output (q{first[0]['question_id']}): {tok.decode(first[1].output_ids)[:300]!r}")
    print(f"\noverall: plain {n_tok / t_plain:.1f} tok/s; "
          + "; ".join(f"{m} {n_tok / t_spec[m]:.1f} tok/s, speedup {t_plain / t_spec[m]:.2f}x" for m in methods)
          + f"; outputs identical: {'YES' if all_same else 'NO'}")
    return 0 if all_same else 1
