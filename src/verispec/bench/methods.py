"""Decoding methods the benchmark measures, ours and peers', behind one small interface.

Every method gets the same prompt token ids (our tokenizer and chat template), so the comparison
is of decoding, not of prompting. A method returns a `Run`: new token ids and the timings.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from verispec.config import SamplingParams, SpeculativeConfig


@dataclass
class Run:
    token_ids: list[int]
    wall_time: float  # seconds, prompt processing included
    ttft: float  # seconds to the first new token
    target_forwards: int  # prefill included; plain decoding: one per token
    accepted_lengths: list[int] = field(default_factory=list)  # draft tokens accepted per draft
    accepted_per_position: list[int] = field(default_factory=list)
    cached_prompt_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache


class Method(Protocol):
    name: str
    speculative: bool  # greedy outputs must equal our plain decoding's
    weight_bytes: int  # bytes of target weights read per token (the bandwidth bound)

    def run(self, prompt_ids: list[int], max_tokens: int, temperature: float, seed: int) -> Run: ...


class Unavailable(Exception):
    """A peer that cannot run here (package not installed, no same-vocabulary assistant)."""


# ---------------------------------------------------------------------------------------------
# ours


class OursMethod:
    def __init__(self, name: str, llm, spec: SpeculativeConfig | None, prefix_caching: bool = False) -> None:
        from verispec.config import EngineConfig
        from verispec.engine.assembly import build_decoder
        from verispec.errors import ConfigError

        self.name = name
        self.speculative = spec is not None
        self.weight_bytes = llm.runner.weight_bytes  # the target's (a draft model's are not counted)
        engine = EngineConfig(enable_prefix_caching=prefix_caching)
        try:
            self.decoder = build_decoder(llm.runner, spec, engine)  # spec None: plain decoding
        except ConfigError as e:  # prefix caching on a runner without the row-wise kernels
            raise Unavailable(str(e)) from e

    def run(self, prompt_ids, max_tokens, temperature, seed) -> Run:
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
        req = self.decoder.generate(prompt_ids, params)
        m = req.metrics
        return Run(list(req.output_ids), m.total_time, m.time_to_first_token, m.num_target_forwards,
                   list(m.accepted_lengths), list(m.accepted_per_position), m.num_cached_prompt_tokens or 0)


# ---------------------------------------------------------------------------------------------
# Hugging Face transformers


class _FirstTokenTimer:
    """A generate() streamer that notes when the first new token arrives (the first put is the prompt)."""

    def __init__(self) -> None:
        self.puts = 0
        self.first: float | None = None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.first is None:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


class HFMethod:
    """transformers `generate`: plain, prompt lookup, or with an assistant model."""

    def __init__(self, name: str, model, eos_ids: list[int], prompt_lookup: int = 0, assistant=None) -> None:
        self.name = name
        self.speculative = False  # a peer: its output is compared, but a mismatch is not our bug
        self.model = model
        self.eos_ids = eos_ids
        self.extra = {}
        if prompt_lookup:
            self.extra["prompt_lookup_num_tokens"] = prompt_lookup
        if assistant is not None:
            self.extra["assistant_model"] = assistant
        self._forwards = 0
        self.weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        model.register_forward_hook(self._count)

    def _count(self, *args) -> None:
        self._forwards += 1

    def run(self, prompt_ids, max_tokens, temperature, seed) -> Run:
        timer = _FirstTokenTimer()
        # override whatever the model's generation_config carries: the same plain distribution as ours
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
        sampling["repetition_penalty"] = 1.0
        if temperature > 0:
            torch.manual_seed(seed)
        self._forwards = 0
        ids = torch.tensor([prompt_ids])
        with torch.inference_mode():
            t = time.perf_counter()
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, eos_token_id=self.eos_ids,
                pad_token_id=self.eos_ids[0], streamer=timer, **sampling, **self.extra,
            )
            wall = time.perf_counter() - t
        new = out[0, len(prompt_ids):].tolist()  # a final EOS stays, as ours keeps the stop token id
        return Run(new, wall, (timer.first or time.perf_counter()) - t, self._forwards)


def load_hf_model(name: str):
    from transformers import AutoModelForCausalLM

    from verispec.models.weights.registry import resolve

    path = resolve(name)
    if path.is_dir():
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


# ---------------------------------------------------------------------------------------------
# llama.cpp (optional)


@contextlib.contextmanager
def _without_extra_bufts():
    """`llama_cpp.Llama` built inside loads its model with use_extra_bufts off, as our runner does
    (runners/llamacpp.py, model_params: llama.cpp's AMX weight repacking crashes in
    llama_decode on Intel Xeons with AMX). `Llama` fills its llama_model_params itself without
    that option and hands them to `_internals.LlamaModel`, which loads the file: for the duration,
    that class is one that turns the field off first (on the Llama's own `model_params`)."""
    import llama_cpp._internals as internals

    original = internals.LlamaModel

    class LlamaModel(original):
        def __init__(self, *, params, **kwargs) -> None:
            params.use_extra_bufts = False
            super().__init__(params=params, **kwargs)

    internals.LlamaModel = LlamaModel
    try:
        yield
    finally:
        internals.LlamaModel = original


class LlamaCppMethod:
    """llama-cpp-python on the same GGUF file: plain decoding, or its prompt-lookup drafter."""

    def __init__(self, name: str, gguf_path: str, eos_ids: list[int], prompt_lookup: int = 0) -> None:
        try:
            import llama_cpp
        except ImportError as e:
            raise Unavailable("llama-cpp-python is not installed (pip install llama-cpp-python)") from e
        draft = None
        if prompt_lookup:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(num_pred_tokens=prompt_lookup)
        self.name = name
        self.speculative = False
        self.eos_ids = set(eos_ids)
        # its speculative path reads logits of every position: it needs logits_all (n_ctx x vocab floats)
        with _without_extra_bufts():
            self.llm = llama_cpp.Llama(model_path=gguf_path, n_ctx=4096, verbose=False, draft_model=draft,
                                       logits_all=draft is not None, n_threads=torch.get_num_threads())
        self.weight_bytes = int(llama_cpp.llama_model_size(self.llm.model))

    def run(self, prompt_ids, max_tokens, temperature, seed) -> Run:
        self.llm.reset()
        self.llm.set_seed(seed)
        tokens: list[int] = []
        t = time.perf_counter()
        first = None
        # every truncation off (llama.cpp defaults to top-k 40, top-p 0.95, min-p 0.05): the plain distribution
        gen = self.llm.generate(prompt_ids, temp=temperature, top_k=0 if temperature else 1, top_p=1.0, min_p=0.0,
                                typical_p=1.0, repeat_penalty=1.0, reset=True)
        for tok in gen:
            first = first or time.perf_counter()
            tokens.append(tok)
            if tok in self.eos_ids or len(tokens) >= max_tokens:
                break
        wall = time.perf_counter() - t
        return Run(tokens, wall, (first or t) - t, 0)


Builder = Callable[[], Method]
