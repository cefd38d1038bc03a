"""Per-request speculative metrics, as data. Conventions follow vLLM:

- num_drafts: verification steps that checked at least one draft token;
- num_draft_tokens: draft tokens proposed (and verified);
- num_accepted_tokens: draft tokens accepted *and emitted* (a stop inside an accepted block
  cuts this count at the stop: nothing after the stop is counted);
- accepted_per_position[i]: how often the draft token at position i was accepted;
- mean_acceptance_length = 1 + num_accepted_tokens / num_drafts (counts the bonus token;
  1.0 for plain decoding).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RequestMetrics:
    num_prompt_tokens: int = 0
    num_cached_prompt_tokens: int | None = None  # of which reused from the prefix cache (None: no prefix cache)
    num_output_tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    accepted_lengths: list[int] = field(default_factory=list)  # accepted draft tokens of each draft
    num_target_forwards: int = 0  # prefill included
    time_to_first_token: float = 0.0  # seconds, prefill plus the first token
    total_time: float = 0.0  # seconds, prefill to the last token
    queue_time: float = 0.0  # seconds waiting for a place in the running batch (server)

    def observe_draft(self, num_draft_tokens: int, num_accepted: int, depth: int | None = None) -> None:
        """A verified draft of num_draft_tokens tokens (a token tree: its nodes, `depth` its
        deepest path) of which num_accepted were kept."""
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        self.accepted_lengths.append(num_accepted)
        positions = num_draft_tokens if depth is None else depth
        if len(self.accepted_per_position) < positions:
            self.accepted_per_position += [0] * (positions - len(self.accepted_per_position))
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.num_output_tokens / self.total_time if self.total_time > 0 else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(
            mean_acceptance_length=self.mean_acceptance_length,
            acceptance_rate=self.acceptance_rate,
            tokens_per_second=self.tokens_per_second,
        )
        return d
