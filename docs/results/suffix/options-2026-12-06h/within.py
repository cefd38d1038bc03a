import json, sys, statistics, collections
d = json.load(open(sys.argv[1]))
base = sys.argv[2] if len(sys.argv) > 2 else "plain"
by = collections.defaultdict(dict); agg = collections.defaultdict(lambda: [0, 0, 0])
for r in d['records']:
    by[r['method']][r['question_id']] = r['new_tokens'] / r['wall_time']
    a = agg[r['method']]; a[0] += r['new_tokens']; a[1] += r['target_forwards']; a[2] += r['wall_time']
print("mismatches:", len(d.get("mismatches") or []))
for m in by:
    b = base if not m.endswith("gguf-int8") else "plain@torch:gguf-int8"
    qs = by[b].keys()
    a = agg[m]
    print(f"  {m:32s} mean per-q {statistics.mean(by[m][q] / by[b][q] for q in qs):.3f}x  tok/step {a[0]/a[1]:.2f}  tok/s {a[0]/a[2]:.1f}")
