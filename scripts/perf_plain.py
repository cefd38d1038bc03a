"""Plain greedy decoding: verispec's engine against Hugging Face `generate`, side by side in one run.

Prints tokens/s of each and the ratio (interleaved repetitions, best-of and median), plus our
per-token time next to the time the model's linear layers alone take (the matrix-vector floor).
Not a test: machines are noisy, read the ratios.

    python scripts/perf_plain.py --models smollm2-135m gemma3-270m --max-tokens 128 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from verispec import LLM, SamplingParams
from verispec.bench.profile import linear_floor_ms
from verispec.data import find_spec_bench, load_questions
from verispec.models.weights.registry import resolve


def hf_model(name: str):
    from transformers import AutoModelForCausalLM

    path = resolve(name)
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    q = next(x for x in load_questions(find_spec_bench()) if x["category"] == "summarization")
    rows = []
    for name in args.models:
        llm = LLM(name)
        ids = llm.tokenizer.encode(q["turns"][0])[:300]
        hf = hf_model(name)
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
        ours, theirs = [], []
        same = True
        for r in range(args.repeats + 1):  # the first round warms both up and is not counted
            out = llm.generate([ids], params)[0]
            with torch.inference_mode():
                t = time.perf_counter()
                ref = hf.generate(
                    torch.tensor([ids]), max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens,
                    do_sample=False, eos_token_id=None,
                )
                hf_s = time.perf_counter() - t
            same &= ref[0, len(ids):].tolist() == out.token_ids
            if r:
                ours.append(out.metrics.tokens_per_second)
                theirs.append(args.max_tokens / hf_s)
        # one token through every linear layer, our projection and F.linear's
        floor = linear_floor_ms(llm.runner)
        floor_linear = linear_floor_ms(llm.runner, project=F.linear)
        per_tok = 1000 / max(ours)
        rows.append((name, max(ours), statistics.median(ours), max(theirs), statistics.median(theirs), per_tok, floor, floor_linear, same))
        del hf
    print(f"\nplain greedy, {args.max_tokens} new tokens after a {len(ids)}-token prompt, {args.repeats} interleaved repeats")
    print("(tok/s include the prompt's prefill; ms/tok = 1000 / best tok/s; linear floors: one token through all")
    print(" linear layers, our projection and F.linear; 'same' = our greedy tokens equal HF's)")
    print(f"{'model':<14} {'ours tok/s':>10} {'HF tok/s':>9} {'ratio best':>10} {'ratio median':>12} {'ours ms/tok':>11} {'floor ours':>10} {'floor F.linear':>14} {'vs floor':>8} same")
    for name, ob, om, hb, hm, per_tok, floor, floor_linear, same in rows:
        print(f"{name:<14} {ob:>10.1f} {hb:>9.1f} {ob / hb:>9.2f}x {om / hm:>11.2f}x {per_tok:>11.1f} {floor:>10.1f} {floor_linear:>14.1f} {per_tok / floor:>7.2f}x {same}")


if __name__ == "__main__":
    main()
