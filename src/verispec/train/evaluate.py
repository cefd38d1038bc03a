"""A head's held-out acceptance, measured through the engine itself (greedy, a fixed chain of k)."""

from __future__ import annotations

from verispec.conversations import conversations, first_exchange


def heldout_prompts(tokenizer, source: str, start: int, count: int, max_prompt: int) -> list[list[int]]:
    """The first user turns of `count` conversations from record `start` on, as chat prompts."""
    prompts = []
    for _, messages in conversations(source, start, None):
        exchange = first_exchange(messages)
        if exchange is None:
            continue
        ids = tokenizer.encode_chat(exchange[0])
        if len(ids) <= max_prompt:
            prompts.append(ids)
        if len(prompts) >= count:
            break
    return prompts


def evaluate_head(model: str, head: str, prompts: list[list[int]], k: int = 5, max_tokens: int = 128) -> dict:
    """Mean accepted tokens per step and acceptance per draft position over the prompts (greedy),
    with every output checked against plain decoding's."""
    from verispec import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    plain = LLM(model).generate(prompts, params)
    llm = LLM(model, speculative={"method": "eagle3", "draft_model": head, "num_speculative_tokens": k, "adaptive_k": False})
    outs = llm.generate(prompts, params)
    identical = sum(o.token_ids == p.token_ids for o, p in zip(outs, plain))
    steps = sum(o.metrics.num_drafts for o in outs)  # verification steps that had a draft
    accepted = sum(o.metrics.num_accepted_tokens for o in outs)
    per_position = [sum(o.metrics.accepted_per_position[i] for o in outs if i < len(o.metrics.accepted_per_position))
                    for i in range(k)]
    reached = [steps] + per_position[:-1]
    return {
        "prompts": len(prompts), "k": k, "max_tokens": max_tokens, "identical_to_plain": identical,
        "mean_accepted_length": (steps + accepted) / max(1, steps),  # tokens per verification step, bonus included
        "acceptance_per_position": [a / r if r else 0.0 for a, r in zip(per_position, reached)],  # conditional
        "first_draft_accuracy": per_position[0] / max(1, steps),
        "output_tokens": sum(len(o.token_ids) for o in outs),
    }
