"""The OpenAI fields clients rely on, through the official client against real `verispec serve`
processes with speculation on: structured outputs of every kind, logprobs (streamed too), echo,
n and penalties, each equal to what offline plain decoding of the same request gives."""

from __future__ import annotations

import json
import re

import openai
import pytest
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, Field

from server_utils import server_process
from verispec import LLM, SamplingParams
from verispec.config import StructuredOutputsParams

MODEL = "tiny"


@pytest.fixture(scope="module")
def target(tiny_dir):
    return str(tiny_dir("llama", seed=0, vocab=320, tokenizer="bytes"))


@pytest.fixture(scope="module")
def client(target):
    # the target drafting for itself: long accepted runs, so verification covers most tokens
    with server_process("--model", target, "--served-model-name", MODEL, "--method", "draft_model", "--draft-model", target,
                        "--k", "4", "--no-adaptive-k") as base:
        yield openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def plain(target):
    return LLM(target)


class Person(BaseModel):
    name: str = Field(max_length=6)
    age: int = Field(ge=0, le=120)
    admin: bool


def test_structured_outputs_of_every_kind(client, plain):
    chat = [{"role": "user", "content": "Who?"}]
    r = client.chat.completions.parse(model=MODEL, messages=chat, response_format=Person, max_tokens=60, temperature=0)
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and r.choices[0].finish_reason == "stop"
    ids = plain.tokenizer.encode_chat(chat)
    so = StructuredOutputsParams(json=to_strict_json_schema(Person))  # the schema parse() sends
    assert r.choices[0].message.content == plain.generate([ids], SamplingParams(temperature=0, max_tokens=60, structured_outputs=so))[0].text

    r = client.chat.completions.create(model=MODEL, messages=chat, response_format={"type": "json_object"}, max_tokens=40, temperature=0)
    if r.choices[0].finish_reason == "stop":  # a random model may write one long string
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    extra = [({"guided_regex": r"\d{3}-[a-z]{2}"}, lambda t: re.fullmatch(r"\d{3}-[a-z]{2}", t)),
             ({"guided_choice": ["red", "green", "blue"]}, lambda t: t in ("red", "green", "blue")),
             ({"guided_grammar": 'start: "(" /[0-9]/ ("," /[0-9]/)* ")"'}, lambda t: re.fullmatch(r"\(\d(,\d)*\)", t)),
             ({"structured_outputs": {"regex": "(yes|no)!"}}, lambda t: t in ("yes!", "no!"))]
    for body, valid in extra:
        for temperature in (0, 1.0):
            r = client.completions.create(model=MODEL, prompt="Answer:", max_tokens=30, temperature=temperature, seed=1, extra_body=body)
            assert valid(r.choices[0].text), (body, r.choices[0].text)


def test_response_format_text_is_no_constraint(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                       response_format={"type": "text"})
    assert r.choices[0].message.content is not None


def test_invalid_constraints_answer_400(client):
    for body in ({"guided_regex": "[a-"}, {"guided_grammar": "start: nowhere"}, {"guided_json": {"type": "nonsense"}},
                 {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=MODEL, prompt="Answer:", max_tokens=5, extra_body=body)
        assert e.value.body["message"]


def test_logprobs_echo_n_and_penalties_equal_offline_plain(client, plain, target):
    prompt = "The list: ab, ab, ab,"
    ids = plain.tokenizer.encode(prompt)
    offline = plain.generate([ids], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2, prompt_logprobs=2,
                                                   frequency_penalty=0.5, presence_penalty=0.3, logit_bias={70: 2.0}))[0]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=2, echo=True,
                                  frequency_penalty=0.5, presence_penalty=0.3, logit_bias={"70": 2.0},
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert r.choices[0].text == prompt + offline.text
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids) + len(offline.token_ids)
    assert lp.token_logprobs[len(ids):] == [e.logprob for e in offline.outputs[0].logprobs]
    assert lp.token_logprobs[1:len(ids)] == [e.logprob for e in offline.prompt_logprobs[1:]]
    assert r.usage.speculative["num_accepted_tokens"] > 0

    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=2, echo=True,
                                       frequency_penalty=0.5, presence_penalty=0.3, logit_bias={"70": 2.0},
                                       extra_body={"ignore_eos": True}, stream=True)
    chunks = [c.choices[0] for c in stream if c.choices]
    assert "".join(c.text for c in chunks) == r.choices[0].text
    assert [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs] == lp.token_logprobs

    chat = [{"role": "user", "content": "Say ab ab ab"}]
    whole = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=10, temperature=0, logprobs=True, top_logprobs=3)
    streamed = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=10, temperature=0, logprobs=True,
                                              top_logprobs=3, stream=True)
    parts = [c.choices[0].logprobs.content for c in streamed if c.choices and c.choices[0].logprobs]
    assert [t.logprob for p in parts for t in p] == [t.logprob for t in whole.choices[0].logprobs.content]
    assert all(len(t.top_logprobs) == 3 for t in whole.choices[0].logprobs.content)

    # seeded sampling reproduces under the same drafter (its draws depend on the drafts): offline, the server's
    spec = LLM(target, speculative={"method": "draft_model", "draft_model": target, "num_speculative_tokens": 4, "adaptive_k": False})
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=1.0, seed=11, n=3, extra_body={"ignore_eos": True})
    children = [spec.generate([ids], SamplingParams(temperature=1.0, seed=11 + i, max_tokens=8, ignore_eos=True))[0].text for i in range(3)]
    assert [c.index for c in r.choices] == [0, 1, 2] and [c.text for c in r.choices] == children


def test_bundled_smollm2_parses_a_pydantic_model_with_speculation():
    """The issue's case: beta.chat.completions.parse on SmolLM2 with suffix decoding, equal to plain."""
    class City(BaseModel):
        city: str = Field(max_length=24)
        country: str = Field(max_length=24)
        population_millions: float

    chat = [{"role": "user", "content": "Give the capital of France as JSON with city, country and population."}]
    with server_process("--model", "smollm2-135m", "--served-model-name", "m", "--method", "suffix", "--k", "8") as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        r = client.beta.chat.completions.parse(model="m", messages=chat, response_format=City, max_tokens=80, temperature=0)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, City) and parsed.city
    llm = LLM("smollm2-135m")
    so = StructuredOutputsParams(json=to_strict_json_schema(City))
    assert r.choices[0].message.content == llm.chat(chat, SamplingParams(temperature=0, max_tokens=80, structured_outputs=so))[0].text


def test_bundled_smollm2_held_out_schemas_are_valid_and_plain_equal():
    """Schemas of our own (nested objects, arrays, enums, optional fields), greedy and sampled:
    every output validates; greedy speculative output equals plain."""
    from typing import Literal

    from verispec.config import SpeculativeConfig
    from verispec.engine.assembly import build_decoder

    class Ingredient(BaseModel):
        name: str = Field(max_length=30)
        grams: int = Field(ge=0, le=5000)

    class Recipe(BaseModel):
        title: str = Field(max_length=40)
        difficulty: Literal["easy", "medium", "hard"]
        ingredients: list[Ingredient] = Field(min_length=1, max_length=3)

    class Review(BaseModel):
        stars: int = Field(ge=1, le=5)
        summary: str = Field(max_length=60)
        would_return: bool

    class Trip(BaseModel):
        origin: str = Field(max_length=20)
        destination: str = Field(max_length=20)
        stops: list[str] = Field(max_length=2)

    cases = [(Recipe, "Write a simple pancake recipe as JSON."),
             (Review, "Review a small Italian restaurant you liked, as JSON."),
             (Trip, "Plan a train trip from Paris to Rome as JSON.")]
    llm = LLM("smollm2-135m", speculative={"method": "suffix", "num_speculative_tokens": 8})
    plain = build_decoder(llm.runner, None)
    for model, ask in cases:
        ids = llm.tokenizer.encode_chat([{"role": "user", "content": ask}])
        so = StructuredOutputsParams(json=to_strict_json_schema(model))
        greedy = SamplingParams(temperature=0, max_tokens=160, structured_outputs=so)
        out = llm.generate([ids], greedy)[0]
        assert out.finish_reason == "stop", out.text
        model.model_validate_json(out.text)
        assert out.token_ids == plain.generate(ids, greedy).output_ids
        sampled = llm.generate([ids], SamplingParams(temperature=0.8, seed=2, max_tokens=160, structured_outputs=so))[0]
        if sampled.finish_reason == "stop":
            model.model_validate_json(sampled.text)
