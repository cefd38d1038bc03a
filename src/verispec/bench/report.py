"""Bench results -> a Markdown report in the Spec-Bench leaderboard's shape, and PNG plots.

Conventions (Spec-Bench): a subtask's speedup is the mean per-question tokens/s of the method
divided by that of our plain decoding on the same questions; mean accepted tokens is tokens
produced per target forward (1.00 for plain decoding; prefill counted as the forward that
produced the first token).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from statistics import mean

from verispec.bench.peers import PEERS
from verispec.bench.run import BenchResult, Record, our_methods, split_family, subtasks_in
from verispec.config import EngineConfig
from verispec.data import question_set_name



def print_and_save(lines: list[str], out: Path | None) -> None:
    """A measuring script's table: printed, and written to `out` when given (its folder made)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


def _by(records: list[Record], method: str, sub: str | None = None) -> list[Record]:
    return [r for r in records if r.method == method and (sub is None or r.subtask == sub)]


def summarize(result: BenchResult) -> dict[str, dict]:
    """Per method: speedup per subtask and overall, mean accepted tokens, tok/s, TTFT."""
    recs = result.records
    methods = list(dict.fromkeys(r.method for r in recs))
    subs = subtasks_in(r.subtask for r in recs)
    out: dict[str, dict] = {}
    for m in methods:
        row: dict = {"speedup": {}}
        for s in subs:
            mine, base = _by(recs, m, s), _by(recs, "plain", s)
            if mine and base:
                row["speedup"][s] = mean(r.tokens_per_s for r in mine) / mean(r.tokens_per_s for r in base)
        mine, base = _by(recs, m), _by(recs, "plain")
        row["overall"] = mean(r.tokens_per_s for r in mine) / mean(r.tokens_per_s for r in base)
        forwards = sum(r.target_forwards for r in mine)
        row["mean_accepted"] = sum(r.new_tokens for r in mine) / forwards if forwards else None
        row["tokens_per_s"] = sum(r.new_tokens for r in mine) / sum(r.wall_time for r in mine)
        row["ttft"] = mean(r.ttft for r in mine)
        drafts = sum(len(r.accepted_lengths) for r in mine)
        per_pos: dict[int, int] = defaultdict(int)
        for r in mine:
            for i, a in enumerate(r.accepted_per_position):
                per_pos[i] += a
        row["acceptance_by_position"] = [per_pos[i] / drafts for i in sorted(per_pos)] if drafts else []
        matches = [r.matches_plain for r in mine if r.matches_plain is not None]
        row["identical_to_plain"] = f"{sum(matches)}/{len(matches)}" if matches else "-"
        out[m] = row
    return out


def family_of(method: str) -> tuple[str, bool]:
    """(backend family, speculative?) of a method: 'prompt_lookup@llamacpp:Q8_0' -> ('llamacpp:Q8_0', True);
    our methods without '@' run on the default backend; peers form the families their registry names
    ('hf', 'llama.cpp (peer)'); our plain decoding (no drafter) is not speculative."""
    if method in PEERS:
        return PEERS[method].family, PEERS[method].speculative
    base, family = split_family(method)
    return family or EngineConfig.backend, our_methods().get(base) is not None


def decode_rate(records: list[Record]) -> float:
    """Tokens/s after the first token (prompt processing of the first turn left out; the second
    turn's of multi-turn questions stays in)."""
    time = sum(r.wall_time - r.ttft for r in records)
    return sum(max(0, r.new_tokens - 1) for r in records) / time if time > 0 else float("nan")


def backends_table(result: BenchResult) -> list[str]:
    """Per backend and weights format: plain decoding (tok/s, fraction of the bandwidth bound) and the
    best speculative method, with ratios to llama.cpp's plain decoding measured in the same run."""
    summary = summarize(result)
    families: dict[str, dict[str, list[str]]] = {}
    for m in summary:
        family, speculative = family_of(m)
        families.setdefault(family, {"plain": [], "spec": []})["spec" if speculative else "plain"].append(m)
    peer = summary.get("llamacpp")
    bw = result.bandwidth_gbs
    lines = [
        "| backend | plain method | weight MB | plain tok/s | plain decode tok/s | fraction of bandwidth bound "
        "| best speculative | its tok/s | best / our torch plain | best / llama.cpp plain |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for family, ms in families.items():
        plain = ms["plain"][0] if ms["plain"] else None
        best = max(ms["spec"], key=lambda m: summary[m]["overall"]) if ms["spec"] else None
        cells = [family, plain or "-"]
        if plain:
            rate = decode_rate(_by(result.records, plain))
            wb = result.weight_bytes.get(plain)
            bound = f"{wb * rate / (bw * 1e9):.2f}" if wb and bw else "-"
            cells += [f"{wb / 1e6:.0f}" if wb else "-", f"{summary[plain]['tokens_per_s']:.1f}", f"{rate:.1f}", bound]
        else:
            cells += ["-"] * 4
        if best:
            row = summary[best]
            cells += [best, f"{row['tokens_per_s']:.1f}", f"{row['overall']:.2f}x",
                      f"{row['overall'] / peer['overall']:.2f}x" if peer else "-"]
        else:
            cells += ["-"] * 4
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Fraction of bandwidth bound: the time to read the weights once ({'%.1f' % bw if bw else '?'} GB/s measured "
        "before the run) over the time per decoded token (plain decode tok/s: tokens after the first over the time "
        "after the first token). Ratios are of mean per-question tokens/s, as the speedups above.",
    ]
    return lines


def markdown(result: BenchResult) -> str:
    cfg = result.config
    summary = summarize(result)
    subs = subtasks_in(s for row in summary.values() for s in row["speedup"])
    n_q = len({r.question_id for r in result.records})
    lines = [
        f"# {question_set_name(cfg.questions)}: {cfg.model}",
        "",
        f"{n_q} questions ({cfg.limit} per subtask at most), max {cfg.max_tokens} new tokens per turn, "
        f"temperature {cfg.temperature}, k = {cfg.k} for our speculative methods (the peers' prompt lookup drafts "
        "10 tokens, their usual setting). Speedup = mean per-question tokens/s over our plain decoding's, measured "
        "in the same run, methods interleaved per question "
        + ("(order rotated, one untimed warm-up each)" if result.protocol == "rotated"
           else "(in a fixed order, plain first, no warm-up run)")
        + ". tok/s and TTFT include prompt processing"
        + ("; our methods with prefix caching (each its own cache: later turns forward only their new tokens)."
           if cfg.prefix_caching else "."),
        "",
        "| method | " + " | ".join(subs) + " | mean accepted | overall speedup | tok/s | TTFT s | identical to plain |",
        "|---|" + "---|" * (len(subs) + 5),
    ]
    for m, row in summary.items():
        cells = [f"{row['speedup'].get(s, float('nan')):.2f}x" for s in subs]
        acc = f"{row['mean_accepted']:.2f}" if row["mean_accepted"] else "n/a"
        lines.append(
            f"| {m} | " + " | ".join(cells) + f" | {acc} | {row['overall']:.2f}x | {row['tokens_per_s']:.1f} "
            f"| {row['ttft']:.2f} | {row['identical_to_plain']} |"
        )
    for m, why in result.failed.items():
        lines.append(f"| {m} | " + " | ".join(["-"] * len(subs)) + f" | - | failed: {why} | - | - | - |")
    ours = [m for m in summary if m not in PEERS]
    peers = [m for m in summary if m in PEERS]
    if peers:
        best = max(ours, key=lambda m: summary[m]["overall"])
        lines += ["", f"Our best method ({best}) against each peer, ratio of mean per-question tokens/s:", ""]
        for p in peers:
            lines.append(f"- {best} / {p}: {summary[best]['overall'] / summary[p]['overall']:.2f}x")
    if len({family_of(m)[0] for m in summary}) > 1:
        lines += ["", "## Per backend", ""] + backends_table(result)
    if result.skipped:
        lines += ["", "Skipped:", ""] + [f"- {m}: {why}" for m, why in result.skipped.items()]
    if result.failed:
        lines += ["", "Failed (each peer runs in its own process; a failed one's results are left out, "
                  "the other methods ran to the end):", ""]
        lines += [f"- {m}: {why}" for m, why in result.failed.items()]
    lines += ["", "'identical to plain' of a peer is informative only: llama.cpp computes with its quantised "
              "kernels and HF with its own float32 kernels, so near-ties can break differently.",
              "", "Greedy mismatches of lossless methods against plain decoding (bugs):", ""]
    lines += [f"- {m}" for m in result.mismatches] or ["- none"]
    return "\n".join(lines) + "\n"


def plots(result: BenchResult, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize(result)
    subs = subtasks_in(s for row in summary.values() for s in row["speedup"])
    paths = []
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(1, len(summary))
    for i, (m, row) in enumerate(summary.items()):
        xs = [j + i * width for j in range(len(subs))]
        ax.bar(xs, [row["speedup"].get(s, 0) for s in subs], width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8)
    top = max((v for row in summary.values() for v in row["speedup"].values()), default=1.0)
    ax.set_ylim(0, top * 1.3)  # room for the legend above the bars
    ax.set_xticks([j + width * (len(summary) - 1) / 2 for j in range(len(subs))], subs)
    ax.set_ylabel("speedup over our plain decoding")
    ax.set_title(f"{question_set_name(result.config.questions)}: speedup per subtask, {result.config.model}")
    ax.legend(fontsize=8, ncol=min(4, len(summary)), loc="upper center")
    fig.tight_layout()
    paths.append(out / "speedup.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for m, row in summary.items():
        if row["acceptance_by_position"]:
            ax.plot(range(1, len(row["acceptance_by_position"]) + 1), row["acceptance_by_position"], marker="o", label=m)
    longest = max((len(row["acceptance_by_position"]) for row in summary.values()), default=0)
    ax.set_xticks(range(1, longest + 1))
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafts")
    ax.set_ylim(0, 1)
    ax.set_title("acceptance rate by draft position")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "acceptance.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
