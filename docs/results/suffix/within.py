"""Ratios within one arithmetic, from a bench run's results.json files: for each speculative
method, the mean of its per-question speedups over the plain decoding of the same arithmetic, its
total tokens over total time against plain's, and its tokens per target forward.

    python docs/results/suffix/within.py docs/results/suffix/<run>/<model>/results.json ...
"""
import collections
import json
import statistics
import sys

for path in sys.argv[1:]:
    d = json.load(open(path))
    speed, tokens, wall, forwards = (collections.defaultdict(dict) for _ in range(4))
    for r in d["records"]:
        m, q = r["method"], r["question_id"]
        speed[m][q] = r["new_tokens"] / r["wall_time"]
        tokens[m][q], wall[m][q], forwards[m][q] = r["new_tokens"], r["wall_time"], r["target_forwards"]
    print(path, "| mismatches:", len(d.get("mismatches") or []))
    for m in speed:
        base = "plain@" + m.split("@")[1] if "@" in m else "plain"
        if m == base or base not in speed:
            continue
        qs = [q for q in speed[base] if q in speed[m]]
        per_q = statistics.mean(speed[m][q] / speed[base][q] for q in qs)
        overall = (sum(tokens[m][q] for q in qs) / sum(wall[m][q] for q in qs)) / (sum(tokens[base][q] for q in qs) / sum(wall[base][q] for q in qs))
        per_fwd = sum(tokens[m][q] for q in qs) / max(1, sum(forwards[m][q] for q in qs))
        print(f"  {m:32s} over {base:22s} per-question {per_q:.3f}x  tokens/time {overall:.3f}x  tokens/forward {per_fwd:.2f}")
