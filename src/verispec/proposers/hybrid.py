"""Hybrid drafting: suffix decoding where it is confident, a model drafter elsewhere (Arctic
Inference's suffix + EAGLE combination).

At each step suffix decoding offers its best draft with its score (the expected number of
accepted tokens: the sum of its path probabilities, proposers/suffix/). If the score reaches
`hybrid_min_score`, that draft is verified; otherwise the model drafter (`hybrid_drafter`: an
EAGLE-3 head or a draft model) drafts. Repetitive spans (code edits, templated answers, text
copied from the prompt) then cost nothing to draft, and open text still gets a model's drafts.

Both drafters see every request from begin to end. The model drafter catches up by itself on
the steps it sat out: a draft model feeds the tokens its cache lacks at its next propose, an
EAGLE head the target states the decoder kept meanwhile (`SequenceView.states`). `accept` goes
to the drafter whose draft was verified. Drafts are labelled by source ("suffix:..." or
"model"), so the k policy keeps an acceptance estimate for each.

Either drafter's verification is lossless, so the choice (made from the request's own past
only) never changes the output's distribution; greedy output is plain decoding's.
"""

from __future__ import annotations

import dataclasses

from verispec.errors import InvalidSpeculativeConfigError
from verispec.proposers.base import PROPOSERS, Budget, Draft, Proposer, SequenceView, create_proposer, register
from verispec.proposers.suffix import SuffixProposer


@register("hybrid")
class HybridProposer(Proposer):
    """Kinds: suffix's own (sized by their path probabilities) and "model" (sized by its kind's
    rate). Suffix's drafts are free; a model draft token costs the model drafter's `relative_cost`."""

    shared_sources = SuffixProposer.shared_sources  # suffix's earlier responses: one estimate per kind for the engine
    draft_model_kind = "drafter"  # draft_model is its model drafter's (hybrid_drafter's) model or head

    def __init__(self, suffix: SuffixProposer, model: Proposer, min_score: float) -> None:
        self.suffix = suffix
        self.model = model
        self.min_score = min_score
        self.target_states = model.target_states  # an EAGLE head's: the decoder hands it the target's states
        self.runner = model.runner  # a draft model's runner, for cache statistics
        self._last: dict[int, object] = {}  # request id -> the drafter of its last draft
        self.stats = suffix.stats  # drafts by source: request, global, none (suffix's), model

    @classmethod
    def create(cls, config, target) -> "HybridProposer":
        model_drafters = sorted(name for name, c in PROPOSERS.items() if c.draft_model_kind in ("model", "head"))
        if config.hybrid_drafter not in model_drafters:
            raise InvalidSpeculativeConfigError(
                f"hybrid_drafter must be one of {', '.join(model_drafters)}, got {config.hybrid_drafter!r}")
        suffix = SuffixProposer.create(config, target)
        model = create_proposer(dataclasses.replace(config, method=config.hybrid_drafter), target)
        return cls(suffix, model, config.hybrid_min_score)

    def kind_cost(self, kind: str) -> float:
        """A draft token's cost in one-token target forwards, by kind: the model drafter's, or
        nothing (suffix decoding's index lookups)."""
        return self.model.relative_cost if kind == "model" else 0.0

    def kind_probes(self, kind: str) -> bool:
        """The model drafter's own answer for its kind; suffix's drafts are free to probe."""
        return self.model.kind_probes("") if kind == "model" else True

    @property
    def memory_bytes(self) -> int:
        return self.suffix.memory_bytes

    @property
    def cached_tokens(self) -> int:
        return self.suffix.cached_tokens

    def begin(self, seq: SequenceView) -> None:
        self.suffix.begin(seq)
        self.model.begin(seq)

    def propose(self, seq: SequenceView, budget: Budget) -> Draft:
        return self.propose_batch([seq], [budget])[0]

    def propose_batch(self, seqs: list[SequenceView], budgets: list[Budget]) -> list[Draft]:
        """Suffix's draft if confident, else the model's (if its kind pays), else suffix's all the
        same (free); else nothing. Suffix's drafts carry their path probabilities: the policy sizes
        them as suffix decoding's alone; the model drafts for all the requests that asked it at
        once (its `propose_batch`), each within its kind's k and stopped where its kind's
        calibrated confidence says (`Budget.worth`)."""
        drafts: list[Draft | None] = []
        asked, chains = [], []  # the requests the model drafts for, and their budgets
        for i, (seq, budget) in enumerate(zip(seqs, budgets)):
            pick = self.suffix.candidate(seq, budget.depth)
            if pick is not None and pick.score >= self.min_score:
                drafts.append(self._suffix(seq, pick))
                continue
            k_model = budget.pays("model")  # model tokens cost: only as many as pay
            if k_model > 0:
                self._last[seq.request_id] = self.model
                self.stats["model"] += 1
                asked.append(i)
                chains.append(Budget.chain(k_model, lambda kind, probs, b=budget: b.worth("model", probs)))
                drafts.append(None)
            elif pick is not None:
                drafts.append(self._suffix(seq, pick))
            else:
                self.stats["none"] += 1
                drafts.append(Draft(tokens=[]))
        if asked:
            for i, draft in zip(asked, self.model.propose_batch([seqs[i] for i in asked], chains)):
                drafts[i] = dataclasses.replace(draft, kind="model")
        return drafts  # type: ignore[return-value]

    def _suffix(self, seq: SequenceView, pick) -> Draft:
        self._last[seq.request_id] = self.suffix
        return self.suffix.draft_of(pick)

    def accept(self, seq: SequenceView, num_accepted: int) -> None:
        self._last.get(seq.request_id, self.suffix).accept(seq, num_accepted)

    def end(self, seq: SequenceView) -> None:
        self._last.pop(seq.request_id, None)
        self.suffix.end(seq)
        self.model.end(seq)
