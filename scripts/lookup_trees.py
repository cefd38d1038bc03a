"""Would token trees pay for prompt lookup? An offline count on Spec-Bench.

Greedy answers to Spec-Bench questions are generated once (first turns, plain decoding). Then, at
every step of each answer, the prompt-lookup chain draft (`find_continuation`, what the engine
drafts) and trees of several n-gram matches' continuations merged by shared prefixes are scored
against the answer: the tokens a target forward would yield (accepted drafts + 1) and the tree
nodes it would verify. Greedy verification is deterministic, so this is exact for greedy
decoding without running a single verification.

    python scripts/lookup_trees.py --model smollm2-135m --limit 5
"""

from __future__ import annotations

import argparse

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from verispec import LLM, SamplingParams
from verispec.data import find_spec_bench, load_questions, subtask
from verispec.bench.run import SUBTASKS
from verispec.proposers.prompt_lookup import find_continuation


def candidates(tokens: list[int], k: int, min_n: int, max_n: int, width: int) -> list[list[int]]:
    """Continuations (up to k tokens) of up to `width` distinct earlier matches of the tail:
    longest n first, most recent match first."""
    arr = np.asarray(tokens, dtype=np.int64)
    out: list[list[int]] = []
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        windows = sliding_window_view(arr[: len(tokens) - 1], n)
        for hit in np.flatnonzero((windows == arr[len(tokens) - n :]).all(axis=1))[::-1]:
            cont = arr[hit + n : hit + n + k].tolist()
            if cont and cont not in out:
                out.append(cont)
            if len(out) == width:
                return out
    return out


def score(answers: list[tuple[list[int], list[int]]], propose) -> tuple[float, float]:
    """(tokens per forward, tree nodes per forward) of a drafter over greedy answers."""
    forwards = produced = nodes = 0
    for prompt, answer in answers:
        seq, i = list(prompt), 0
        while i < len(answer):
            paths = propose(seq)
            trie = {tuple(p[:j]) for p in paths for j in range(1, len(p) + 1)}
            best = 0
            for p in paths:
                m = 0
                while m < len(p) and i + m < len(answer) and p[m] == answer[i + m]:
                    m += 1
                best = max(best, m)
            take = min(best + 1, len(answer) - i)
            seq += answer[i : i + take]
            i += take
            forwards += 1
            produced += take
            nodes += len(trie)
    return produced / forwards, nodes / forwards


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--backend", default="llamacpp", help="backend that generates the answers (default: llamacpp, fast)")
    p.add_argument("--limit", type=int, default=5, help="questions per subtask (default: 5)")
    p.add_argument("--max-tokens", type=int, default=128)
    args = p.parse_args()
    llm = LLM(args.model, backend=args.backend)
    questions = load_questions(find_spec_bench())
    picked = [q for cat in SUBTASKS for q in [q for q in questions if subtask(q) == cat][: args.limit]]
    answers = []
    for q in picked:
        ids = llm.tokenizer.encode_chat([{"role": "user", "content": q["turns"][0]}])
        out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=args.max_tokens))[0]
        answers.append((ids, out.token_ids))
    print(f"{args.model}: {len(answers)} Spec-Bench first turns, {args.max_tokens} new tokens at most, greedy\n")
    print("| drafter | n-gram sizes | depth k | candidates | tokens per forward | nodes per forward |")
    print("|---|---|---|---|---|---|")
    for k in (4, 8):
        rate, nodes = score(answers, lambda s: [c] if (c := find_continuation(s, k, 2, 4)) else [])
        print(f"| chain (the engine's) | 2-4 | {k} | 1 | {rate:.3f} | {nodes:.2f} |")
    for min_n in (2, 1):
        for k, width in ((4, 2), (4, 4), (8, 4)):
            rate, nodes = score(answers, lambda s: candidates(s, k, min_n, 4, width))
            print(f"| tree | {min_n}-4 | {k} | {width} | {rate:.3f} | {nodes:.2f} |")


if __name__ == "__main__":
    main()
