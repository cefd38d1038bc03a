"""The README's performance table, generated from the latest Spec-Bench results under docs/results/.

    python scripts/readme_table.py            # rewrite the block between the markers in README.md
    python scripts/readme_table.py --check    # exit 1 if README.md's block is not what this would write
    python scripts/readme_table.py --print    # print the block, change nothing

`verispec bench` writes a results.json per run and model (its config, every question's figures,
"created"). This script reads every results.json under the results folder, keeps the runs on
Spec-Bench's questions (all six subtasks), and per model the latest of them by "created". Each
engine of that run is one row: our engine per backend and weights format (`plain`,
`plain@torch:gguf-int8`, ...) and each peer (llama-cpp-python, Hugging Face transformers): its
plain decoding, its fastest speculative method and that method's speedup over the same engine's
plain decoding, all from the same run.

tok/s is the mean over questions of new tokens / wall time (prompt processing included), and a
speedup is the ratio of two such means: Spec-Bench's convention, the "overall speedup" of the
run's report.md (which divides by the default engine's plain decoding, not by each engine's own).

The commit and CPU come from results.json ("commit", "cpu") where the bench recorded them, else
from the run's README.md ("code of <hash>", "Intel ..."/"AMD ..."), else "not recorded".
Standard library only; the output depends on the files alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parent.parent
START = "<!-- perf-table:start -->"
END = "<!-- perf-table:end -->"
SPEC_BENCH_SUBTASKS = ("multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag")

# Peers, by method name (bench/peers.py): the label of their engine row and the name of their plain
# decoding. A new peer gets a line here; an unknown one whose name starts with a known prefix
# is still shown as a peer, under its own name.
PEER_FAMILIES = {
    "llamacpp": ("llama-cpp-python `Llama.generate` (a Python loop, not native llama.cpp speed)",
                 ("llamacpp", "llamacpp_prompt_lookup")),
    "llamacpp_native": ("llama.cpp's own `llama-server` (native, over HTTP)", ("llamacpp_native",)),
    "hf": ("Hugging Face transformers `generate`", ("hf", "hf_prompt_lookup", "hf_assisted")),
}
PEER_PREFIXES = ("llamacpp", "llama_cpp", "llama-", "hf")

# our engine's families (the part after '@' in a method name; '' = the default torch engine)
OUR_FAMILIES = {
    "": "verispec, torch backend, default weights (exact)",
    "torch:gguf": "verispec, torch backend, default weights (exact)",
    "torch:gguf-int8": "verispec, torch backend, `gguf-int8` (int8 activations)",
    "torch:float32": "verispec, torch backend, `float32` weights",
    "torch:fast": "verispec, torch backend, `--no-batch-invariant`",
    "llamacpp": "verispec, llama.cpp backend",
}


def _peer_family(method: str) -> str | None:
    """The peer family of a method name, None for ours."""
    if "@" in method:
        return None
    for family, (_, names) in PEER_FAMILIES.items():
        if method in names:
            return family
    return method if method.startswith(PEER_PREFIXES) else None


def _our_family(method: str) -> str:
    family = method.partition("@")[2]
    return "" if family in ("torch", "torch:gguf") else family


def _family_label(key: tuple[str, str]) -> str:
    kind, family = key
    if kind == "peer":
        return PEER_FAMILIES[family][0] if family in PEER_FAMILIES else f"peer `{family}`"
    if family in OUR_FAMILIES:
        return OUR_FAMILIES[family]
    backend, _, fmt = family.partition(":")
    return f"verispec, {backend} backend, `{fmt}` weights" if fmt else f"verispec, {backend} backend"


def _is_plain(kind: str, family: str, method: str) -> bool:
    if kind == "ours":
        return method.partition("@")[0] == "plain"
    names = PEER_FAMILIES[family][1] if family in PEER_FAMILIES else (family,)
    return method == names[0]


def is_spec_bench(config: dict) -> bool:
    """A run on Spec-Bench's questions, every subtask."""
    questions = config.get("questions")
    if questions not in (None, "spec_bench") and not str(questions).endswith("question.jsonl"):
        return False
    categories = config.get("categories")
    return categories is None or set(SPEC_BENCH_SUBTASKS) <= set(categories)


CHECK_ONLY = "CHECK_ONLY"  # a folder holding this file (and its subfolders) is left out of the table


def find_runs(results_dir: Path) -> dict[str, tuple[Path, dict]]:
    """Model name -> (results.json path, its data) of that model's latest Spec-Bench run."""
    latest: dict[str, tuple[tuple[str, str], Path, dict]] = {}
    for path in sorted(results_dir.rglob("results.json")):
        if any((folder / CHECK_ONLY).exists() for folder in path.parents if results_dir in folder.parents):
            continue  # a check (runs side by side on one thread each), not a measure of speed
        try:
            data = json.loads(path.read_text())
            config = data["config"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not is_spec_bench(config) or not any(r.get("method") == "plain" for r in data.get("records", ())):
            continue
        model = Path(config["model"]).name
        key = (str(data.get("created", "")), path.relative_to(results_dir).as_posix())
        if model not in latest or key > latest[model][0]:
            latest[model] = (key, path, data)
    return {m: (p, d) for m, (_, p, d) in latest.items()}


def run_meta(path: Path, data: dict, results_dir: Path) -> tuple[str, str]:
    """(commit, CPU) of a run: recorded in results.json, else read from the run's README.md."""
    commit, cpu = data.get("commit"), data.get("cpu")
    folders = [path.parent]
    if path.parent.name == Path(data["config"]["model"]).name and path.parent.parent != results_dir:
        folders.append(path.parent.parent)  # a multi-model run: <run>/<model>/results.json
    for folder in folders:
        for name in ("README.md", "summary.md"):
            readme = folder / name
            if (commit and cpu) or not readme.is_file():
                continue
            text = " ".join(readme.read_text().split())
            found = re.search(r"\b[Cc]ode of ([0-9a-f]{7,40})\b", text)
            commit = commit or (found.group(1) if found else None)
            found = re.search(r"(?:[Ss]hared )?(?:\d+-core )?(?:Intel|AMD) [A-Z][\w-]*(?: \([^)]*\))?", text)
            cpu = cpu or (found.group(0) if found else None)
    return commit or "commit not recorded", cpu or "CPU not recorded"


def engine_rows(data: dict) -> list[dict]:
    """Per engine of a run: plain decoding's mean tok/s, the fastest speculative method, its mean
    tok/s, speedup and identical-to-plain count. Engines in the order of the run's methods."""
    per_q: dict[str, list[float]] = {}
    identical: dict[str, list[bool]] = {}
    for r in data["records"]:
        if r.get("wall_time"):
            per_q.setdefault(r["method"], []).append(r["new_tokens"] / r["wall_time"])
        if r.get("matches_plain") is not None:
            identical.setdefault(r["method"], []).append(bool(r["matches_plain"]))
    order = list(dict.fromkeys([*data["config"].get("methods", ()), *per_q]))
    families: dict[tuple[str, str], dict[str, list[str]]] = {}
    for m in order:
        if m not in per_q:
            continue
        peer = _peer_family(m)
        key = ("peer", peer) if peer else ("ours", _our_family(m))
        slot = "plain" if _is_plain(*key, m) else "spec"
        families.setdefault(key, {"plain": [], "spec": []})[slot].append(m)
    rows = []
    for key in sorted(families, key=lambda k: k[0] == "peer"):  # ours first; stable otherwise
        ms = families[key]
        plain = ms["plain"][0] if ms["plain"] else None
        best = max(ms["spec"], key=lambda m: mean(per_q[m])) if ms["spec"] else None
        row = {"engine": _family_label(key), "ours": key[0] == "ours", "plain": plain, "best": best,
               "plain_tps": mean(per_q[plain]) if plain else None,
               "best_tps": mean(per_q[best]) if best else None, "identical": None}
        row["speedup"] = row["best_tps"] / row["plain_tps"] if plain and best else None
        if best and key[0] == "ours" and identical.get(best):
            row["identical"] = f"{sum(identical[best])}/{len(identical[best])}"
        rows.append(row)
    return rows


def _model_order(models) -> list[str]:
    bundled = ("smollm2-135m", "gemma3-270m")  # the README's order: the default model first
    return [m for m in bundled if m in models] + sorted(m for m in models if m not in bundled)


def caption(model: str, path: Path, data: dict, results_dir: Path, readme_dir: Path) -> str:
    cfg = data["config"]
    commit, cpu = run_meta(path, data, results_dir)
    n_q = len({r["question_id"] for r in data["records"] if r["method"] == "plain"})
    temp = cfg.get("temperature", 0.0)
    k = cfg.get("k")
    parts = [
        f"{n_q} questions ({cfg.get('limit')} per subtask)",
        f"up to {cfg.get('max_tokens')} new tokens per turn",
        "greedy" if not temp else f"temperature {temp}",
        f"k up to {k}, chosen per step" if cfg.get("adaptive_k") else f"k = {k}",
    ]
    if cfg.get("prefix_caching"):
        parts.append("prefix caching")
    folder = os.path.relpath(path.parent, readme_dir).replace(os.sep, "/")
    line = (f"- **{model}**: run of {str(data.get('created', '?'))[:10]}, code of {commit}, {cpu}; "
            + ", ".join(parts) + f"; [report]({folder}/report.md)")
    if data.get("failed"):
        line += "; failed in this run: " + ", ".join(sorted(data["failed"]))
    return line


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def render(results_dir: Path, readme_dir: Path) -> str:
    """The block between the markers (without them), ending in a newline."""
    runs = find_runs(results_dir)
    index = os.path.relpath(results_dir / "README.md", readme_dir).replace(os.sep, "/")
    lines = ["<!-- generated by scripts/readme_table.py from the latest results.json files: "
             "edit the script or rerun it, not this block -->", ""]
    if not runs:
        return "\n".join(lines + ["No Spec-Bench results found.", ""])
    lines += ["Spec-Bench, each model's latest run (each row of a model measured in that one run, "
              "methods interleaved per question):", ""]
    models = _model_order(runs)
    lines += [caption(m, *runs[m], results_dir, readme_dir) for m in models]
    lines += ["", "| model | engine | plain tok/s | fastest speculative method | its tok/s | speedup over the "
              "engine's plain | identical to plain |", "|---|---|---|---|---|---|---|"]
    for model in models:
        for row in engine_rows(runs[model][1]):
            lines.append("| " + " | ".join([
                model, row["engine"], _fmt(row["plain_tps"], ".1f"),
                f"`{row['best']}`" if row["best"] else "-", _fmt(row["best_tps"], ".1f"),
                _fmt(row["speedup"], ".2f", "x"), row["identical"] or "-",
            ]) + " |")
    lines += ["", "tok/s: mean over questions of new tokens / wall time, prompt processing included; speedup: the "
              "ratio of two such means in the same run (Spec-Bench's convention). \"identical to plain\": greedy "
              "outputs token for token equal to the same engine's plain decoding. "
              f"Every run, older ones and other workloads: [docs/results/]({index}).", ""]
    return "\n".join(lines)


def splice(text: str, block: str) -> str:
    """`text` with the part between the markers replaced by `block`."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"README has no {START} ... {END} block")
    return text[: start + len(START)] + "\n" + block + text[end:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--readme", type=Path, default=ROOT / "README.md")
    p.add_argument("--results", type=Path, default=ROOT / "docs" / "results")
    p.add_argument("--check", action="store_true", help="exit 1 if the README's block differs from what would be written")
    p.add_argument("--print", action="store_true", help="print the block, change nothing")
    args = p.parse_args(argv)
    block = render(args.results.resolve(), args.readme.resolve().parent)
    if args.print:
        print(block, end="")
        return 0
    text = args.readme.read_text()
    new = splice(text, block)
    if args.check:
        if new != text:
            print(f"{args.readme}: the performance table is stale; run python scripts/readme_table.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.readme.write_text(new)
        print(f"updated {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
