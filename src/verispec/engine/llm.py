"""The offline API, in the vLLM style:

    from verispec import LLM, SamplingParams
    llm = LLM(model="smollm2-135m", speculative={"method": "prompt_lookup", "num_speculative_tokens": 4})
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=32))[0]
    print(out.text, out.metrics.mean_acceptance_length)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable

from verispec.config import EngineConfig, SamplingParams, SpeculativeConfig
from verispec.engine.assembly import build_engine
from verispec.engine.metrics import RequestMetrics
from verispec.engine.speculative import Request
from verispec.errors import ConfigError, InvalidPromptError, InvalidSamplingParamsError

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
        self.engine = build_engine(self.config)
        self.runner = self.engine.runner
        self.tokenizer = self.engine.tokenizer
        self.decoder = self.engine.decoder

    @classmethod
    def from_config(cls, config: EngineConfig) -> "LLM":
        """The LLM an EngineConfig describes (the CLI's and the server's way in)."""
        return cls(config.model, speculative=config.speculative, **engine_options(config))

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
