"""Measured side by side in one run: the costs and gains of issue 17's features.

  constrained  JSON-schema outputs on the project's own extraction prompts: plain vs speculative
               (prompt lookup, suffix decoding), unconstrained beside them; outputs checked
               identical to plain and valid
  multiturn    time to first token of Spec-Bench's multi-turn questions (MT-bench, two turns),
               prefix caching off (one-pass prefill) and on (decoding-kernel prefill, earlier
               turns reused)
  chunked      running streams' inter-token gaps while a 2,000-token prompt arrives, with and
               without chunked prefill

    python scripts/api_features.py --model smollm2-135m --parts constrained,multiturn,chunked --out docs/results/api
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

PEOPLE = [
    ("Maria Lopez", 34, "Seville", "a nurse who moved there in 2015"),
    ("Kenji Watanabe", 58, "Osaka", "who has run a noodle shop for thirty years"),
    ("Amara Okafor", 27, "Lagos", "a software engineer at a fintech start-up"),
    ("Lukas Becker", 41, "Hamburg", "a harbour pilot and amateur photographer"),
    ("Sofia Rossi", 19, "Bologna", "a first-year student of medieval history"),
    ("David Cohen", 66, "Haifa", "a retired physics teacher"),
    ("Priya Nair", 45, "Kochi", "who manages a spice export business"),
    ("Tom Baker", 30, "Leeds", "a bus driver who plays in a brass band"),
]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city", "occupation"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"},
                         "occupation": {"type": "string"}}}


def constrained(model: str, k: int) -> str:
    from verispec import LLM, SamplingParams
    from verispec.config import SpeculativeConfig, StructuredOutputsParams
    from verispec.engine.assembly import build_decoder

    llm = LLM(model)
    prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": f"Here is a note: {name}, aged {age}, lives in {city}; {what}. "
                                                                       "Extract name, age, city and occupation as JSON."}])
               for name, age, city, what in PEOPLE]
    decoders = {"plain": llm.decoder}
    for method in ("prompt_lookup", "suffix"):  # on the same weights
        decoders[method] = build_decoder(llm.runner, SpeculativeConfig(method=method, num_speculative_tokens=k))
    rows = []
    for so_name, so in (("none", None), ("json_schema", StructuredOutputsParams(json=SCHEMA))):
        params = SamplingParams(temperature=0, max_tokens=96, structured_outputs=so)
        reference = None
        for name, decoder in decoders.items():
            decoder.generate(prompts[0], SamplingParams(temperature=0, max_tokens=4))  # warm
            tokens, seconds, texts, accepted, drafts = 0, 0.0, [], 0, 0
            for ids in prompts:  # decoding speed: the tokens after the first, over their time
                req = decoder.generate(ids, params)
                seconds += req.metrics.total_time - req.metrics.time_to_first_token
                tokens += len(req.output_ids) - 1
                texts.append(req.text())
                accepted += req.metrics.num_accepted_tokens
                drafts += req.metrics.num_drafts
            reference = texts if reference is None else reference
            valid = sum(1 for t in texts if _valid(t)) if so else None
            rows.append((so_name, name, tokens / seconds, 1 + accepted / drafts if drafts else 1.0, texts == reference, valid,
                         tokens / len(prompts) + 1))
    base = {r[0]: r[2] for r in rows if r[1] == "plain"}
    lines = ["| constraint | method | decode tok/s | vs plain | mean acceptance length | identical to plain | valid JSON | "
             "tokens per answer |", "|---|---|---|---|---|---|---|---|"]
    for so, name, tps, mal, same, valid, length in rows:
        lines.append(f"| {so} | {name} | {tps:.1f} | {tps / base[so]:.2f}x | {mal:.2f} | {'yes' if same else 'NO'} | "
                     f"{'-' if valid is None else f'{valid}/{len(PEOPLE)}'} | {length:.0f} |")
    return "\n".join(lines) + f"\n\nDecode tok/s: output tokens after the first over their time (prefill excluded). {len(PEOPLE)} prompts, greedy, up to 96 tokens, k <= {k} adaptive, one request at a time."


def _valid(text: str) -> bool:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(value, dict) and set(value) == set(SCHEMA["required"]) and isinstance(value["age"], int)


def multiturn(model: str, k: int, n: int) -> str:
    from verispec import LLM, SamplingParams
    from verispec.data import pick_spread, questions, subtask

    qs = [q for q in pick_spread(questions("spec_bench"), 10_000) if subtask(q) == "multi_turn"][:n]
    spec = {"method": "prompt_lookup", "num_speculative_tokens": k}
    params = SamplingParams(temperature=0, max_tokens=128)
    lines = ["| prefix caching | turn 1 TTFT (ms, median) | turn 2 TTFT (ms, median) | turn 2 prompt tokens (mean) | "
             "turn 2 tokens reused (mean) |", "|---|---|---|---|---|"]
    results = {}
    for caching in (False, True):
        llm = LLM(model, speculative=spec, enable_prefix_caching=caching)
        llm.chat([{"role": "user", "content": "Hello"}], SamplingParams(temperature=0, max_tokens=4))  # warm
        t1, t2, n2, reused = [], [], [], []
        for q in qs:
            chat = [{"role": "user", "content": q["turns"][0]}]
            first = llm.chat(chat, params)[0]
            chat += [{"role": "assistant", "content": first.text}, {"role": "user", "content": q["turns"][1]}]
            second = llm.chat(chat, params)[0]
            t1.append(first.metrics.time_to_first_token)
            t2.append(second.metrics.time_to_first_token)
            n2.append(second.metrics.num_prompt_tokens)
            reused.append(second.metrics.num_cached_prompt_tokens or 0)
        results[caching] = statistics.median(t2)
        lines.append(f"| {'on' if caching else 'off'} | {1e3 * statistics.median(t1):.0f} | {1e3 * statistics.median(t2):.0f} | "
                     f"{statistics.mean(n2):.0f} | {statistics.mean(reused):.0f} |")
    lines.append(f"\nTurn 2 TTFT with prefix caching / without: {results[True] / results[False]:.2f} ({len(qs)} questions).")
    return "\n".join(lines)


def chunked(model: str, streams: int, prompt_tokens: int) -> str:
    from verispec import LLM, SamplingParams
    from verispec.data import questions
    from verispec.engine.scheduler import Scheduler

    lines = ["| chunked prefill | long prompt TTFT (s) | streams' max gap (ms) | streams' median gap during the prefill (ms) | "
             "streams' median gap before (ms) |", "|---|---|---|---|---|"]
    text = " ".join(t for q in questions("builtin") for t in q["turns"])
    for enabled in (False, True):
        llm = LLM(model, enable_chunked_prefill=enabled)
        ids = llm.tokenizer.encode(text * 20)[:prompt_tokens]
        sched = Scheduler(llm.decoder, max_num_seqs=streams + 1, chunked_prefill=enabled)
        stamps: list[list[float]] = [[] for _ in range(streams)]
        for i in range(streams):
            sched.submit(llm.tokenizer.encode(f"Count from {i} upwards:"), SamplingParams(temperature=0, max_tokens=400, ignore_eos=True),
                         lambda e, i=i: stamps[i].append(time.perf_counter()))
        for _ in range(10):
            sched.step()
        first = []
        t_submit = time.perf_counter()
        sched.submit(ids, SamplingParams(temperature=0, max_tokens=2), lambda e: first.append(time.perf_counter()) if not first else None)
        while not first:
            sched.step()
        for _ in range(3):
            sched.step()
        gaps_during = [b - a for s in stamps for a, b in zip(s, s[1:]) if b > t_submit and a < first[0]]
        gaps_before = [b - a for s in stamps for a, b in zip(s, s[1:]) if b < t_submit][streams:]
        lines.append(f"| {'on' if enabled else 'off'} | {first[0] - t_submit:.2f} | {1e3 * max(gaps_during):.0f} | "
                     f"{1e3 * statistics.median(gaps_during):.0f} | {1e3 * statistics.median(gaps_before):.0f} |")
    return "\n".join(lines) + f"\n\n{streams} streams decoding (greedy, no drafter) when a {prompt_tokens}-token prompt arrives."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--parts", default="constrained,multiturn,chunked")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--questions", type=int, default=10, help="multi-turn questions")
    ap.add_argument("--out", default=None, help="folder for <model>.md")
    args = ap.parse_args()
    import platform

    import torch

    sections = [f"# Issue 17 features on {args.model}\n",
                f"`python scripts/api_features.py --model {args.model} --parts {args.parts}` on {platform.processor() or platform.machine()}, "
                f"{torch.get_num_threads()} threads, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n"]
    for part in args.parts.split(","):
        t = time.perf_counter()
        body = {"constrained": lambda: constrained(args.model, args.k), "multiturn": lambda: multiturn(args.model, args.k, args.questions),
                "chunked": lambda: chunked(args.model, 4, 2000)}[part]()
        sections.append(f"## {part}\n\n{body}\n\n({time.perf_counter() - t:.0f} s)\n")
        print(sections[-1], flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"{args.model}.md").write_text("\n".join(sections))


if __name__ == "__main__":
    main()
