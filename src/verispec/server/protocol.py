"""Request bodies of the OpenAI-compatible endpoints, as pydantic models.

Completion and chat share their sampling fields (`_SamplingFields`). Numbers are strict (no
"0.5" strings, no booleans for integers). Fields we accept but do not implement are rejected
with a 400 when set to anything but their no-op value, never silently ignored; fields we do not
know are ignored, as OpenAI's own clients send new ones over time.

Structured outputs come as OpenAI's `response_format` (json_schema, json_object), vLLM's
`structured_outputs` ({json, regex, choice, grammar}) or vLLM's older `guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar`: one of them per request.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from verispec.config import MAX_LOGPROBS, SamplingParams, StructuredOutputsParams
from verispec.errors import InvalidSamplingParamsError
from verispec.server.errors import APIError

MAX_STOP_STRINGS = 16


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    max_tokens: int | None = None
    temperature: float | None = None  # OpenAI's default is 1
    top_p: float | None = None
    top_k: int | None = None  # vLLM's extension
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False  # vLLM's extension
    stop_token_ids: list[int] | None = None  # vLLM's extension
    repetition_penalty: float | None = None  # vLLM's extension
    min_p: float | None = None  # vLLM's extension
    user: str | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM's extension
    guided_json: dict[str, Any] | str | None = None  # vLLM's older names
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def sampling_params(self, max_tokens: int, logprobs: int | None = None, prompt_logprobs: int | None = None) -> SamplingParams:
        """The engine's SamplingParams; out-of-range values answer 400 with the field's name."""
        self._reject_unsupported()
        t = 1.0 if self.temperature is None else self.temperature
        if not 0.0 <= t <= 2.0:
            raise APIError(400, f"temperature must be in [0, 2], got {t}", param="temperature")
        top_p = 1.0 if self.top_p is None else self.top_p
        if not 0.0 < top_p <= 1.0:
            raise APIError(400, f"top_p must be in (0, 1], got {top_p}", param="top_p")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
            raise APIError(400, f"stop takes at most {MAX_STOP_STRINGS} non-empty strings", param="stop")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise APIError(400, f"seed must be in [0, 2**63), got {self.seed}", param="seed")
        if self.top_k is not None and self.top_k < -1:
            raise APIError(400, f"top_k must be >= -1 (0 or -1 = off), got {self.top_k}", param="top_k")
        if max_tokens < 1:
            raise APIError(400, f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
        if any(i < 0 for i in self.stop_token_ids or []):
            raise APIError(400, "stop_token_ids must be non-negative", param="stop_token_ids")
        if not 1 <= self.n <= 128:
            raise APIError(400, f"n must be in [1, 128], got {self.n}", param="n")
        for name, lo, hi in (("presence_penalty", -2.0, 2.0), ("frequency_penalty", -2.0, 2.0), ("min_p", 0.0, 1.0)):
            value = getattr(self, name)
            if value is not None and not lo <= value <= hi:
                raise APIError(400, f"{name} must be in [{lo:g}, {hi:g}], got {value}", param=name)
        if self.repetition_penalty is not None and not 0.0 < self.repetition_penalty <= 100.0:
            raise APIError(400, f"repetition_penalty must be in (0, 100], got {self.repetition_penalty}", param="repetition_penalty")
        values: dict[str, Any] = dict(
            temperature=t, top_p=top_p, top_k=self.top_k or 0, seed=self.seed, max_tokens=max_tokens, stop=stops,
            stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos, n=self.n,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            min_p=self.min_p or 0.0, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
        )
        try:
            values["structured_outputs"] = self._structured()
        except InvalidSamplingParamsError as e:
            raise APIError(400, str(e), param=self._structured_source()) from e
        try:
            return SamplingParams(**values, logit_bias=self.logit_bias)
        except InvalidSamplingParamsError as e:
            raise APIError(400, str(e), param="logit_bias" if "logit_bias" in str(e) else None) from e

    def _structured_source(self) -> str:
        given = [name for name in ("response_format", "structured_outputs", "guided_json", "guided_regex",
                                   "guided_choice", "guided_grammar") if getattr(self, name) is not None]
        if self.response_format is not None and self.response_format.get("type", "text") == "text":
            given.remove("response_format")
        if len(given) > 1:
            raise APIError(400, f"give one structured-output constraint, got {', '.join(given)}", param=given[1])
        return given[0] if given else "response_format"

    def _structured(self) -> StructuredOutputsParams | None:
        """The one structured-output constraint of the request, whichever field it came in."""
        self._structured_source()  # at most one (a 400 naming the second otherwise)
        if self.guided_json is not None:
            return StructuredOutputsParams(json=self.guided_json)
        if self.guided_regex is not None:
            return StructuredOutputsParams(regex=self.guided_regex)
        if self.guided_choice is not None:
            return StructuredOutputsParams(choice=self.guided_choice)
        if self.guided_grammar is not None:
            return StructuredOutputsParams(grammar=self.guided_grammar)
        if self.structured_outputs is not None:
            return StructuredOutputsParams.from_dict(self.structured_outputs)
        rf = self.response_format
        if rf is None or rf.get("type", "text") == "text":
            return None
        kind = rf.get("type")
        if kind == "json_object":
            return StructuredOutputsParams(json_object=True)
        if kind == "json_schema":
            spec = rf.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise APIError(400, "response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}",
                               param="response_format")
            return StructuredOutputsParams(json=schema)
        raise APIError(400, f"response_format type must be text, json_object or json_schema, got {kind!r}",
                       param="response_format")

    def _reject_unsupported(self) -> None:
        pass

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise APIError(400, "prompt is empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]

    def params(self, max_tokens: int) -> SamplingParams:
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise APIError(400, f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}", param="logprobs")
        prompt_logprobs = self.logprobs if self.echo else None
        return self.sampling_params(max_tokens, self.logprobs, prompt_logprobs)

    def _reject_unsupported(self) -> None:
        super()._reject_unsupported()
        if self.best_of not in (None, self.n):
            raise APIError(400, "best_of (other than n) is not supported", param="best_of")
        if self.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def as_template_message(self) -> dict[str, str]:
        """{'role', 'content'} for the chat template (developer is the newer name of system)."""
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class ChatCompletionRequest(_SamplingFields):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None  # OpenAI's newer name of max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None

    def params(self, max_tokens: int) -> SamplingParams:
        if self.top_logprobs is not None:
            if not 0 <= self.top_logprobs <= MAX_LOGPROBS:
                raise APIError(400, f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {self.top_logprobs}", param="top_logprobs")
            if not self.logprobs:
                raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return self.sampling_params(max_tokens, (self.top_logprobs or 0) if self.logprobs else None)

    def _reject_unsupported(self) -> None:
        super()._reject_unsupported()
        if self.tools:
            raise APIError(400, "tools are not supported", param="tools")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
