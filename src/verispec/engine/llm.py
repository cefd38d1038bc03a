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
from verispec.engine.logprobs import TokenLogprob
from verispec.engine.metrics import RequestMetrics
from verispec.engine.scheduler import Event, Handle, Scheduler
from verispec.engine.decoder import Request
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
    index: int = 0  # which of the prompt's n completions
    logprobs: list[TokenLogprob] | None = None  # one per token, when SamplingParams.logprobs is set


@dataclass
class RequestOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None  # None for the first token

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
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Complete each prompt (text, or a list of token ids). One output per prompt, in order.

        `sampling_params`: one for every prompt, or a list with one per prompt. The prompts (and
        each one's n completions) run together through the scheduler, up to `max_num_seqs` at a time.
        """
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        items = []
        for prompt in prompts:
            if isinstance(prompt, str):
                items.append((prompt, self.tokenizer.encode(prompt)))
            elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                items.append((None, list(prompt)))
            else:
                raise InvalidPromptError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        return self._run(items, _per_prompt(sampling_params, len(items)), use_tqdm)

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Chat completion with the model's chat template; one conversation or a list of them
        (run together, as `generate` runs its prompts)."""
        if not isinstance(messages, list) or not messages:
            raise InvalidPromptError("messages must be a non-empty list of {'role', 'content'} dicts")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        items = []
        for conv in conversations:
            _check_messages(conv)
            items.append((None, self.tokenizer.encode_chat(conv)))  # type: ignore[arg-type]
        return self._run(items, _per_prompt(sampling_params, len(items)), use_tqdm)

    def _run(self, items: list[tuple[str | None, list[int]]], params: list[SamplingParams], use_tqdm: bool) -> list[RequestOutput]:
        """Every prompt's n completions through one scheduler, stepped on this thread."""
        total = sum(p.n for p in params)
        scheduler = Scheduler(self.decoder, max_num_seqs=self.config.max_num_seqs, max_waiting=total,
                              chunked_prefill=self.config.enable_chunked_prefill, kv_budget=self.config.kv_cache_max_bytes)
        errors: list[Exception] = []
        progress = None
        if use_tqdm:
            from tqdm import tqdm

            progress = tqdm(total=total, desc="generate", unit="completion")

        def on_event(event: Event) -> None:
            if event.error is not None:
                errors.append(event.error)
            elif event.finished and progress is not None:
                progress.update(1)

        handles: list[list[Handle]] = []
        try:
            for (_, ids), p in zip(items, params):
                handles.append([scheduler.submit(ids, child, on_event) for child in p.children()])
            while (scheduler.num_waiting or scheduler.num_running) and not errors:
                scheduler.step()
        finally:
            if progress is not None:
                progress.close()
            if errors or scheduler.num_waiting or scheduler.num_running:  # failed or interrupted: free all
                for hs in handles:
                    for h in hs:
                        scheduler.abort(h)
                scheduler.step()
        if errors:
            raise errors[0]
        return [RequestOutput(text, ids, [_completion(h.req, i) for i, h in enumerate(hs)],
                              hs[0].req.prompt_logprobs)
                for (text, ids), hs in zip(items, handles)]


def _completion(req: Request, index: int = 0) -> CompletionOutput:
    return CompletionOutput(req.text(), list(req.output_ids), req.finish_reason, req.metrics, index,
                            None if req.logprobs is None else req.logprobs[: len(req.output_ids)])


def _check_params(params: Any) -> SamplingParams:
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise InvalidSamplingParamsError(
            f"sampling_params must be a SamplingParams, got {type(params).__name__}; "
            "write SamplingParams(**your_dict)"
        )
    return params


def _per_prompt(params: Any, count: int) -> list[SamplingParams]:
    if isinstance(params, (list, tuple)):
        if len(params) != count:
            raise InvalidSamplingParamsError(f"got {len(params)} SamplingParams for {count} prompts: give one, or one per prompt")
        return [_check_params(p) for p in params]
    return [_check_params(params)] * count


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
