"""The offline API, in the vLLM style:

    from verispec import LLM, SamplingParams
    llm = LLM(model="smollm2-135m", speculative={"method": "prompt_lookup", "num_speculative_tokens": 4})
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=32))[0]
    print(out.text, out.metrics.mean_acceptance_length)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from verispec.config import EngineConfig, SamplingParams, SpeculativeConfig
from verispec.engine.metrics import RequestMetrics
from verispec.engine.costs import backend_cost, cached_cost, measured_cost, profile_cost
from verispec.engine.policy import SpeculationPolicy
from verispec.engine.runner import TorchRunner
from verispec.engine.speculative import Request, SpeculativeDecoder
from verispec.errors import ConfigError, InvalidPromptError, InvalidSamplingParamsError
from verispec.models.registry import load_model
from verispec.proposers.base import create_proposer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_runner(
    model: str,
    dtype: torch.dtype | str = torch.float32,
    max_context: int | None = None,
    backend: str = "torch",
    weights_format: str | None = None,
    batch_invariant: bool = True,
):
    """A ModelRunner for `model` on the chosen backend (`batch_invariant`: see EngineConfig; the
    llama.cpp runner always is)."""
    if backend == "llamacpp":
        from verispec.engine.llamacpp_runner import LlamaCppRunner
        from verispec.models.registry import resolve

        path = resolve(model)
        if path.suffix.lower() != ".gguf":
            raise ConfigError(f"the llamacpp backend runs GGUF files; {path} is not one")
        if dtype not in (torch.float32, "float32"):
            raise ConfigError("the llamacpp backend computes in the GGUF's own formats; choose them with weights_format, not dtype")
        return LlamaCppRunner(path, max_context=max_context, weights_format=weights_format, num_threads=torch.get_num_threads())
    from verispec.models.loaders import file_key
    from verispec.models.registry import resolve

    loaded = load_model(model)
    if isinstance(dtype, str):
        dtype = _DTYPES[dtype]
    return TorchRunner(loaded.config, loaded.weights, loaded.tokenizer, dtype=dtype, max_context=max_context,
                       batch_invariant=batch_invariant, source=file_key(resolve(model)))


def build_policy(spec: SpeculativeConfig, draft_cost: float = 0.0, runner=None) -> SpeculationPolicy:
    """The speculation-length policy the configuration asks for, on `runner`'s cost curve:
    "measured" (timed once per machine and model, then read from the cache), "auto" (timed now),
    "builtin" (the backend's built-in curve), or a profile file."""
    k = spec.num_speculative_tokens if spec.method else 0
    cost = backend_cost(runner)
    timed = spec.method and spec.adaptive_k and runner is not None
    if spec.cost_profile in ("auto", "measured"):
        if runner is None and spec.cost_profile == "auto":
            raise ConfigError('cost_profile "auto" needs the loaded model to time')
        if timed:
            cost = measured_cost(runner, k + 1) if spec.cost_profile == "auto" else cached_cost(runner, k + 1)
    elif spec.cost_profile and spec.cost_profile != "builtin":
        from verispec.bench.profile import CostProfile

        try:
            cost = profile_cost(CostProfile.load(Path(spec.cost_profile)))
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ConfigError(f"cannot read the cost profile {spec.cost_profile}: {e}") from e
    return SpeculationPolicy(k, adaptive=spec.adaptive_k, disable_by_batch_size=spec.disable_by_batch_size, cost=cost,
                             draft_cost=draft_cost, chunks=getattr(runner, "verify_chunks", None))


# the EngineConfig fields LLM(...) takes as keyword options (model and speculative are its own arguments)
ENGINE_OPTIONS = tuple(f.name for f in dataclasses.fields(EngineConfig) if f.name not in ("model", "speculative"))


def engine_options(config: EngineConfig) -> dict[str, Any]:
    """An EngineConfig as LLM(...)'s keyword options."""
    return {name: getattr(config, name) for name in ENGINE_OPTIONS}


@dataclass
class CompletionOutput:
    text: str
    token_ids: list[int]
    finish_reason: str | None
    metrics: RequestMetrics


@dataclass
class RequestOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)

    # the single completion's fields, directly on the output
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def metrics(self) -> RequestMetrics:
        return self.outputs[0].metrics


class LLM:
    def __init__(
        self,
        model: str = "smollm2-135m",
        speculative: dict[str, Any] | SpeculativeConfig | None = None,
        **engine_options: Any,
    ) -> None:
        spec = speculative if isinstance(speculative, SpeculativeConfig) else SpeculativeConfig.from_dict(speculative)
        unknown = sorted(set(engine_options) - set(ENGINE_OPTIONS))
        if unknown:
            raise ConfigError(f"unknown LLM option(s) {unknown}; known: {sorted(ENGINE_OPTIONS)}")
        self.config = EngineConfig(model=model, speculative=spec, **engine_options)
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        c = self.config
        self.runner = build_runner(model, c.dtype, c.max_model_len, c.backend, c.weights_format, c.batch_invariant)
        self.tokenizer = self.runner.tokenizer
        proposer = create_proposer(spec, self.runner) if spec.method else None
        policy = build_policy(spec, getattr(proposer, "relative_cost", 0.0), self.runner)
        self.decoder = SpeculativeDecoder(self.runner, proposer, spec.num_speculative_tokens, policy)

    def generate(
        self,
        prompts: str | list[int] | Iterable[str] | Iterable[list[int]],
        sampling_params: SamplingParams | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Complete each prompt (text, or a list of token ids). One output per prompt, in order."""
        params = _check_params(sampling_params)
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        items = list(prompts)
        if use_tqdm:
            from tqdm import tqdm

            items = tqdm(items, desc="generate", unit="prompt")
        outputs = []
        for prompt in items:
            if isinstance(prompt, str):
                text, ids = prompt, self.tokenizer.encode(prompt)
            elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
                text, ids = None, list(prompt)
            else:
                raise InvalidPromptError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")
            outputs.append(self._run(text, ids, params))
        return outputs

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | None = None,
    ) -> list[RequestOutput]:
        """Chat completion with the model's chat template; one conversation or a list of them."""
        if not isinstance(messages, list) or not messages:
            raise InvalidPromptError("messages must be a non-empty list of {'role', 'content'} dicts")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        outs = []
        for conv in conversations:
            _check_messages(conv)
            ids = self.tokenizer.encode_chat(conv)  # type: ignore[arg-type]
            outs.append(self._run(None, ids, _check_params(sampling_params)))
        return outs

    def _run(self, text: str | None, ids: list[int], params: SamplingParams) -> RequestOutput:
        req = self.decoder.generate(ids, params)
        return RequestOutput(text, ids, [_completion(req)])


def _completion(req: Request) -> CompletionOutput:
    return CompletionOutput(req.text(), list(req.output_ids), req.finish_reason, req.metrics)


def _check_params(params: Any) -> SamplingParams:
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise InvalidSamplingParamsError(
            f"sampling_params must be a SamplingParams, got {type(params).__name__}; "
            "write SamplingParams(**your_dict)"
        )
    return params


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidPromptError("messages must be a non-empty list of {'role', 'content'} dicts")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in (
            "system",
            "user",
            "assistant",
        ):
            raise InvalidPromptError(
                f"each message needs role system/user/assistant and string content, got {m!r}"
            )
