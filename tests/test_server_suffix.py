"""Suffix decoding in a real `verispec serve` process: the store of earlier responses is shared by
all requests of the server, under continuous batching, and outputs stay plain decoding's."""

from __future__ import annotations

import asyncio

import openai
import pytest

from server_utils import metric, server_process
from verispec import LLM, SamplingParams

MODEL = "tiny"
PROMPTS = [" ".join(f"w{(7 * i + j) % 90 + 3}" for j in range(6)) for i in range(8)]


@pytest.fixture(scope="module")
def target(tiny_dir):
    return str(tiny_dir("llama", seed=0))


def test_later_requests_draft_from_earlier_responses(target):
    plain = LLM(target)
    refs = [plain.generate(p, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))[0].text for p in PROMPTS]

    async def one(client, prompt):
        stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0, stream=True,
                                                 extra_body={"ignore_eos": True})
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def round_(base):
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        return await asyncio.gather(*(one(client, p) for p in PROMPTS))

    with server_process("--model", target, "--served-model-name", MODEL, "--method", "suffix", "--k", "6",
                        "--no-adaptive-k") as base:
        accepted = []
        for _ in range(2):  # the same 8 prompts twice, 8 streams at once each time
            before = metric(base, "vllm:spec_decode_num_accepted_tokens_total")
            texts = asyncio.run(round_(base))
            accepted.append(metric(base, "vllm:spec_decode_num_accepted_tokens_total") - before)
            assert texts == refs  # greedy: plain decoding's text, whatever the batch and the store
        # the store, on /metrics: 16 responses of 32 tokens (each after its prompt's last tokens)
        assert metric(base, "verispec:drafter_cached_tokens") > 16 * 32
        assert metric(base, "verispec:drafter_memory_bytes") > 0
    # the second time, each answer is in the store: almost all of it is drafted and accepted
    assert accepted[1] > accepted[0]
    assert accepted[1] >= 8 * 20


def test_load_test_cycles_a_small_question_set_and_reports_the_store():
    import argparse

    from verispec.server.loadtest import Level, _conversations, report

    convs = _conversations("repetitive", 75)  # 30 questions in the set: cycled
    assert len(convs) == 75 and convs[30] == convs[0] and convs[0] != convs[1]
    args = argparse.Namespace(model="m", backend="torch", weights_format=None, batch_invariant=True, requests=75,
                              questions="repetitive", max_tokens=8)
    text = report(args, [Level("suffix", 1)], {}, {"plain": (0, 0), "suffix": (41034, 524288)})
    assert "- suffix: 41034 tokens, 0.5 MiB" in text
    assert "- plain:" not in text  # a drafter that keeps nothing is not listed
