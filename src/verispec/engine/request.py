"""One request's state in the decoding loop: its tokens, stops, metrics, and the acceptance
estimates the policy keeps for each kind of draft it was offered."""

from __future__ import annotations

from dataclasses import dataclass, field

from verispec.config import SamplingParams
from verispec.engine.logits import LogitsProcessor
from verispec.engine.logprobs import TokenLogprob
from verispec.engine.metrics import RequestMetrics
from verispec.engine.policy import AcceptanceEstimate
from verispec.engine.stops import StopChecker
from verispec.proposers.base import SequenceView


class Estimates:
    """A request's acceptance estimates, one per draft kind ("source:detail", Draft.kind).

    A kind first drafted starts from the rate the request's drafts of the same source showed so
    far (a prior worth one draft token), else from a new request's prior. A kind whose source
    every request shares (the drafter's `shared_sources`: suffix decoding's earlier responses) has
    one estimate for the whole engine (`shared`): how well the store predicts is the store's, not
    one request's. Example: after drafts of kind "request:long" accepted 3 tokens of 4, a first
    draft of "request:short" starts at a = 0.75; "global:long" starts from the engine's estimate."""

    def __init__(self, shared: dict[str, AcceptanceEstimate], shared_sources: frozenset[str]) -> None:
        self.by_kind: dict[str, AcceptanceEstimate] = {}
        self.shared = shared  # the engine's, for kinds of shared sources
        self.shared_sources = shared_sources

    def __getitem__(self, kind: str) -> AcceptanceEstimate:
        estimate = self.by_kind.get(kind)
        if estimate is not None:
            return estimate
        source = kind.split(":")[0]
        shared = source in self.shared_sources
        if shared and kind in self.shared:
            estimate = self.by_kind[kind] = self.shared[kind]
            return estimate
        same = [e for k, e in self.by_kind.items() if k.split(":")[0] == source]
        if same:
            accepted, rejected = sum(e.accepted for e in same), sum(e.rejected for e in same)
            a = accepted / (accepted + rejected)
            estimate = AcceptanceEstimate(accepted=a, rejected=1.0 - a)
        else:
            estimate = AcceptanceEstimate()
        self.by_kind[kind] = estimate
        if shared:
            self.shared[kind] = estimate
        return estimate


@dataclass
class Request:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    view: SequenceView  # view.tokens is prompt + output, shared with the drafter
    stops: StopChecker
    target_seq: int
    estimates: Estimates  # for the policy, per draft kind
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    text_end: int | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    started: float = 0.0
    processor: LogitsProcessor | None = None  # None: temperature, top-k, top-p and min-p only
    logprobs: list[TokenLogprob] | None = None  # one per output token, when params.logprobs is set
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per prompt token (None for the first)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def room(self) -> int:
        """Draft tokens the request can still take: never more than can be emitted after the
        step's own token, so the cache never overflows."""
        return self.params.max_tokens - len(self.output_ids) - 1

    def text(self) -> str:
        """The output text, stop strings and stop tokens cut."""
        return self.stops.final_text(self.output_ids, self.text_end)
