"""Memory of suffix decoding's store of earlier responses (proposers/suffix/) after N requests.

Feeds N responses through SuffixProposer.begin/end, as an engine does when requests finish, and
reports the store's size (tracemalloc: every byte Python allocated for it) against the bound of
`suffix_decoding_max_cached_requests`. Two kinds of response:
- text: answers of the bundled model's tokenizer over the project's own prompts and workloads,
  cycled (real bigram statistics, many repeats);
- random: uniform random token ids (the worst case: almost every bigram new, one dictionary entry
  per token).

    python scripts/suffix_memory.py --requests 1000 --tokens 256 --max-cached 10000 --model smollm2-135m
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc


def responses(kind: str, n: int, length: int, tokenizer) -> list[list[int]]:
    if kind == "random":
        rng = random.Random(0)
        return [[rng.randrange(tokenizer.vocab_size) for _ in range(length)] for _ in range(n)]
    from verispec.data import questions

    texts = [t for src in ("builtin", "repetitive") for q in questions(src) for t in q["turns"]]
    ids = [tokenizer.encode(t) for t in texts]
    out = []
    for i in range(n):  # each response: texts joined until `length` tokens, starting at a different one
        r: list[int] = []
        j = i
        while len(r) < length:
            r += ids[j % len(ids)]
            j += 1
        out.append(r[:length])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=256, help="tokens per response")
    ap.add_argument("--max-cached", type=int, default=10000, help="suffix_decoding_max_cached_requests")
    ap.add_argument("--model", default="smollm2-135m", help="whose tokenizer (and vocabulary size)")
    args = ap.parse_args()

    from verispec.config import SamplingParams
    from verispec.models.weights.registry import load_model
    from verispec.proposers.base import SequenceView
    from verispec.proposers.suffix import SuffixProposer

    tok = load_model(args.model, blocks=True).tokenizer
    print(f"{args.requests} responses of {args.tokens} tokens, max_cached_requests {args.max_cached}, "
          f"{args.model}'s tokenizer ({tok.vocab_size} ids)")
    print("| responses | cached | live tokens | store MiB (tracemalloc) | bytes per live token | "
          "index's own estimate MiB | mean propose ms |")
    print("|---|---|---|---|---|---|---|")
    for kind in ("text", "random"):
        data = responses(kind, args.requests, args.tokens, tok)
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        p = SuffixProposer(max_cached_requests=args.max_cached)
        greedy = SamplingParams(temperature=0)
        for i, r in enumerate(data):
            v = SequenceView(i, [1, 2, 3], 3, greedy, None, 0)
            p.begin(v)
            v.tokens += r
            p.end(v)
        size = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        ix = p.responses.index
        probe = SequenceView(-1, data[-1][:40], 40, greedy, None, 0)
        p.begin(probe)
        t = time.perf_counter()
        for _ in range(100):
            p.propose(probe, 8)
        ms = (time.perf_counter() - t) / 100 * 1e3
        print(f"| {kind} | {len(p.responses)} | {len(ix)} | {size / 2**20:.1f} | {size / max(1, len(ix)):.0f} | "
              f"{ix.nbytes / 2**20:.1f} | {ms:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
