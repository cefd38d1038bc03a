"""Request bodies of the OpenAI-compatible endpoints, as pydantic models.

Completion and chat share their sampling fields (`_SamplingFields`). Numbers are strict (no
"0.5" strings, no booleans for integers). Fields we accept but do not implement are rejected
with a 400 when set to anything but their no-op value, never silently ignored; fields we do not
know are ignored, as OpenAI's own clients send new ones over time.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from verispec.config import SamplingParams
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
    user: str | None = None

    def sampling_params(self, max_tokens: int) -> SamplingParams:
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
        return SamplingParams(
            temperature=t,
            top_p=top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
            max_tokens=max_tokens,
            stop=stops,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
        )

    def _reject_unsupported(self) -> None:
        if self.n != 1:
            raise APIError(400, f"n = {self.n} is not supported: only n = 1 (send the request n times)", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise APIError(400, f"{name} must be in [-2, 2], got {value}", param=name)
            if value != 0.0:
                raise APIError(400, f"{name} is not supported (it changes the target distribution)", param=name)
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias")

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

    def _reject_unsupported(self) -> None:
        super()._reject_unsupported()
        if self.echo:
            raise APIError(400, "echo is not supported", param="echo")
        if self.logprobs is not None:
            raise APIError(400, "logprobs is not supported", param="logprobs")
        if self.best_of not in (None, 1):
            raise APIError(400, "best_of > 1 is not supported", param="best_of")
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
    response_format: dict[str, Any] | None = None

    def _reject_unsupported(self) -> None:
        super()._reject_unsupported()
        if self.logprobs or self.top_logprobs:
            raise APIError(400, "logprobs is not supported", param="logprobs")
        if self.tools:
            raise APIError(400, "tools are not supported", param="tools")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise APIError(400, "response_format other than text is not supported", param="response_format")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
