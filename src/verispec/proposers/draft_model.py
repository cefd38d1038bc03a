"""Draft-model drafting: a smaller model with the target's vocabulary proposes k tokens.

The drafter keeps its own KV cache per request. Its cache holds a prefix of the request's
tokens; `propose` feeds what it has not seen, then drafts k tokens autoregressively (greedy
for greedy requests; otherwise sampled from the same processed distribution the verifier will
use as q). `accept` rolls the cache back to the tokens the target kept.

Example, k = 3: tokens t0..t9 (t9 not yet seen by the target), drafter cache holds t0..t8.
propose feeds [t9] -> d1, [d1] -> d2, [d2] -> d3; the cache now holds t0..t9 d1 d2.
accept(1): the target kept d1, so the cache is cut to t0..t9 d1 (length 11).
"""

from __future__ import annotations

import torch

from verispec.errors import ContextLengthError, IncompatibleDraftError
from verispec.proposers.base import Budget, Draft, Proposer, SequenceView, register
from verispec.sampling.processors import logits_to_probs, sample_from_probs


@register("draft_model")
class DraftModelProposer(Proposer):
    draft_model_kind = "model"

    def __init__(self, runner, relative_cost: float) -> None:
        self.runner = runner
        self.relative_cost = relative_cost  # decoding is bound by reading the weights: their ratio
        self._seqs: dict[int, int] = {}  # request id -> drafter sequence id
        self._drafted_from: dict[int, int] = {}  # request id -> len(tokens) at the last propose

    @classmethod
    def create(cls, config, target) -> "DraftModelProposer":
        runner = target.build_drafter(config.draft_model)  # the drafter runs where the target runs
        check_same_vocabulary(target, runner)
        return cls(runner, runner.weight_bytes / max(1, target.weight_bytes))

    def begin(self, seq: SequenceView) -> None:
        if seq.capacity > self.runner.max_context:
            raise ContextLengthError(
                f"prompt + max_tokens = {seq.capacity} tokens exceeds the draft model's context of "
                f"{self.runner.max_context} tokens"
            )
        self._seqs[seq.request_id] = self.runner.open(seq.capacity)

    def propose(self, seq: SequenceView, budget: Budget) -> Draft:
        k = budget.pays("")  # each token costs a forward of the draft model: no more than pay
        if k <= 0:
            return Draft(tokens=[])
        sid = self._seqs[seq.request_id]
        cached = self.runner.length(sid)
        new = seq.tokens[cached:]  # >= 1 token: the drafter never holds the last token
        self._drafted_from[seq.request_id] = len(seq.tokens)
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            logits = self.runner.forward(sid, new, num_logits=1).logits  # [1, vocab]
            if seq.params.greedy:
                token = int(logits[0].argmax())
            else:
                p = logits_to_probs(logits, seq.params.temperature, seq.params.top_k, seq.params.top_p)
                token = int(sample_from_probs(p, seq.generator)[0])
                probs.append(p[0])
            tokens.append(token)
            new = [token]
        return Draft(tokens=tokens, probs=torch.stack(probs) if probs else None)

    def accept(self, seq: SequenceView, num_accepted: int) -> None:
        sid = self._seqs[seq.request_id]
        before = self._drafted_from[seq.request_id]
        # the cache holds tokens[:before] + draft[:k-1]; keep tokens[:before] + the accepted ones
        self.runner.truncate(sid, min(self.runner.length(sid), before + num_accepted))

    def end(self, seq: SequenceView) -> None:
        sid = self._seqs.pop(seq.request_id, None)
        self._drafted_from.pop(seq.request_id, None)
        if sid is not None:
            self.runner.close(sid)


def check_same_vocabulary(target, draft) -> None:
    """A draft model must speak the target's vocabulary token for token (the runners'
    vocab_fingerprint); where it does not, say how far apart the two are."""
    if target.vocab_fingerprint() != draft.vocab_fingerprint():
        t_vocab, d_vocab = target.tokenizer.tok.get_vocab(), draft.tokenizer.tok.get_vocab()
        differing = sum(1 for tok, i in t_vocab.items() if d_vocab.get(tok) != i)
        raise IncompatibleDraftError(
            f"the draft model's vocabulary differs from the target's (sizes {draft.vocab_size} vs "
            f"{target.vocab_size}, {differing} tokens with other ids); method draft_model needs a "
            "draft model sharing the target's tokenizer"
        )
