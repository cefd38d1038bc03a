"""Speculation where drafts fail: random-token prompts, plain decoding against speculative methods
with a fixed k and with the adaptive policy (engine/policy.py), interleaved per prompt. The
`random_draft` drafter (defined here) drafts random tokens: every draft fails. (Prompt lookup is
no adversary on random prompts: the model soon repeats itself, and lookup drafts that well.)

The cost model's promise: never slower than plain decoding beyond noise when drafts fail.
Not a test: machines are noisy, read the ratios.

    python scripts/adversarial.py --model smollm2-135m --prompts 8 --max-tokens 64
    python scripts/adversarial.py --backend llamacpp --draft-model <same-vocabulary gguf>
"""

from __future__ import annotations

import argparse
import statistics

import torch

from verispec import LLM, SamplingParams
from verispec.config import SpeculativeConfig
from verispec.engine.assembly import build_decoder
from verispec.proposers.base import Draft, register


@register("random_draft")
class RandomDraft:
    """Drafts that (almost) always fail: uniformly random token ids. Defined here, not shipped."""

    relative_cost = 0.0

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.g = torch.Generator().manual_seed(1)

    @classmethod
    def create(cls, config, target) -> "RandomDraft":
        return cls(target.vocab_size)

    def begin(self, seq) -> None:
        pass

    def propose(self, seq, k: int) -> Draft:
        return Draft(tokens=torch.randint(0, self.vocab, (k,), generator=self.g).tolist())

    def accept(self, seq, num_accepted: int) -> None:
        pass

    def end(self, seq) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--weights-format", default=None)
    ap.add_argument("--draft-model", default=None, help="also measure draft_model with this drafter")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--cost-profile", default=None)
    args = ap.parse_args()

    llm = LLM(args.model, backend=args.backend, weights_format=args.weights_format)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1000, llm.runner.vocab_size, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.prompts)]
    methods = {"plain": build_decoder(llm.runner, None)}
    for name in ["random_draft", "prompt_lookup"] + (["draft_model"] if args.draft_model else []):
        for adaptive in (False, True):
            spec = SpeculativeConfig(method=name, num_speculative_tokens=args.k, draft_model=args.draft_model,
                                     adaptive_k=adaptive, cost_profile=args.cost_profile)
            methods[f"{name} k={args.k}" + (" adaptive" if adaptive else " fixed")] = build_decoder(llm.runner, spec)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    for d in methods.values():  # warm-up
        d.generate(prompts[0][:8], SamplingParams(temperature=0, max_tokens=4))
    rates: dict[str, list[float]] = {m: [] for m in methods}
    drafted: dict[str, list[float]] = {m: [] for m in methods}
    identical: dict[str, int] = {m: 0 for m in methods}
    for i, p in enumerate(prompts):
        order = list(methods)[i % len(methods):] + list(methods)[: i % len(methods)]  # rotated
        outputs = {}
        for name in order:
            req = methods[name].generate(p, params)
            rates[name].append(req.metrics.tokens_per_second)
            drafted[name].append(req.metrics.num_draft_tokens)
            outputs[name] = req.output_ids
        for name in methods:
            identical[name] += outputs[name] == outputs["plain"]
    base = statistics.mean(rates["plain"])
    print(f"{args.model} ({args.backend}{':' + args.weights_format if args.weights_format else ''}), "
          f"{args.prompts} random-token prompts of {args.prompt_tokens} tokens, {args.max_tokens} new tokens, greedy")
    print("| method | tok/s | vs plain | draft tokens per request | identical to plain |")
    print("|---|---|---|---|---|")
    for name in methods:
        r = statistics.mean(rates[name])
        print(f"| {name} | {r:.1f} | {r / base:.3f}x | {statistics.mean(drafted[name]):.1f} | {identical[name]}/{len(prompts)} |")


if __name__ == "__main__":
    main()
