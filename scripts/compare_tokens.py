"""Do two sets of bench results hold the same tokens? (A refactor's check: the same runs before and
after a change.)

    python scripts/compare_tokens.py BEFORE AFTER

BEFORE and AFTER are folders of `verispec bench` outputs: every results.json under BEFORE is paired
with the one at the same relative path under AFTER. Within each pair, every (method, question)
record must carry the same new token ids (`Record.token_ids`), and within each run every
speculative method must match its plain decoding (`matches_plain`; plain decoding on another
arithmetic, plain@torch:gguf-int8, is compared with the exact one for information only). Prints a line per pair and a total; exits 1
on any difference or missing record, 2 when a run has no token ids to compare.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def records(path: Path) -> dict[tuple[str, int], dict]:
    return {(r["method"], r["question_id"]): r for r in json.loads(path.read_text())["records"]}


def compare(before: Path, after: Path) -> tuple[int, list[str]]:
    """(records compared, problems) of one pair of results.json files."""
    old, new = records(before), records(after)
    problems = [f"{before.parent.name}: {key} missing after" for key in sorted(set(old) - set(new))]
    problems += [f"{before.parent.name}: {key} new after" for key in sorted(set(new) - set(old))]
    compared = 0
    for key in sorted(set(old) & set(new)):
        a, b = old[key].get("token_ids"), new[key].get("token_ids")
        if not a and not b and old[key]["new_tokens"]:
            raise SystemExit(2)
        compared += 1
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            problems.append(f"{before.parent.name}: {key} differs at new token {at}")
    for name, recs in (("before", old), ("after", new)):
        problems += [f"{before.parent.name} ({name}): {r['method']} q{r['question_id']} differs from plain "
                     f"at {r['first_mismatch']}" for r in recs.values()
                     if r.get("matches_plain") is False and r["method"].partition("@")[0] != "plain"]
    return compared, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    pairs = sorted(args.before.rglob("results.json"))
    if not pairs:
        print(f"no results.json under {args.before}", file=sys.stderr)
        return 1
    total, failed = 0, []
    for before in pairs:
        after = args.after / before.relative_to(args.before)
        if not after.exists():
            failed.append(f"{after} missing")
            continue
        n, problems = compare(before, after)
        methods = sorted({m for m, _ in records(before)})
        print(f"{before.parent.relative_to(args.before)}: {n} records ({len(methods)} methods: {', '.join(methods)}), "
              f"{'identical' if not problems else f'{len(problems)} problems'}")
        total += n
        failed += problems
    for problem in failed:
        print("  " + problem)
    print(f"{total} records compared, {len(failed)} problems")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
