"""Draft-model drafting: a smaller model with the target's vocabulary proposes up to k tokens.

The drafter keeps its own KV cache per request. Its cache holds a prefix of the request's
tokens; `propose` feeds what it has not seen, then drafts autoregressively (greedy for greedy
requests; otherwise sampled from the same processed distribution the verifier will use as q).
`accept` rolls the cache back to the tokens the target kept. A running batch drafts together:
one draft forward per draft position for every request still drafting (`propose_batch`).

A long context costs the draft a prefill of its own: it catches up on at most `draft_window` tokens
at once (starting its cache afresh from the request's last ones where it lags further).

Example, k = 3: tokens t0..t9 (t9 not yet seen by the target), drafter cache holds t0..t8.
propose feeds [t9] -> d1, [d1] -> d2, [d2] -> d3; the cache now holds t0..t9 d1 d2.
accept(1): the target kept d1, so the cache is cut to t0..t9 d1 (length 11).

Where drafting stops: each position's draft distribution q gives its confidence, the largest
probability in q; their product along the chain is the drafter's estimate that the target keeps
every token so far (the chain's path probabilities, calibrated by the k policy as suffix
decoding's). The first token is drafted wherever the kind's acceptance rate pays for drafting at
all (`Budget.pays`: so the calibration learns even of a draft that underrates itself); from the
second on, drafting stops at the first position the policy says is not worth its cost
(`Budget.worth`). The confidence is read off q before the position's token is drawn, so whether
a sampled token is drafted never depends on the token itself (the verification stays lossless).

What it costs: the draft takes the cheapest arithmetic its runner offers (the target's
`build_drafter`: int8 activations on GGUF blocks, whatever the target's arithmetic, and logits over
the vocabulary's first `draft_head_rows` ids), and a draft token's price in the k policy is the
draft's one-token forward over the target's, timed once per machine (runners/costs.py).
"""

from __future__ import annotations

import torch

from verispec.errors import ContextLengthError, IncompatibleDraftError
from verispec.proposers.base import Budget, Draft, Proposer, SequenceView, register
from verispec.runners.base import BatchItem
from verispec.runners.costs import cached_relative_cost
from verispec.sampling.processors import logits_to_probs, sample_from_probs


@register("draft_model")
class DraftModelProposer(Proposer):
    draft_model_kind = "model"

    def __init__(self, runner, relative_cost: float, vocab_size: int, window: int = 0) -> None:
        self.runner = runner
        self.relative_cost = relative_cost  # a draft token in one-token target forwards
        self.vocab_size = vocab_size  # the target's: a sampled draft's q spans it (zeros past the draft's head)
        self.window = window  # the most tokens the draft catches up on at once (0: all)
        self._seqs: dict[int, int] = {}  # request id -> drafter sequence id
        self._offset: dict[int, int] = {}  # request id -> the request's first token the draft's cache holds
        self._drafted_from: dict[int, int] = {}  # request id -> len(tokens) at the last propose

    @classmethod
    def create(cls, config, target) -> "DraftModelProposer":
        runner = target.build_drafter(config.draft_model, head_rows=config.draft_head_rows)
        check_same_vocabulary(target, runner)
        cost = config.draft_cost if config.draft_cost is not None else cached_relative_cost(runner, target)
        return cls(runner, cost, target.vocab_size, config.draft_window)

    def kind_probes(self, kind: str) -> bool:
        """No probes: after a stretch without drafts, a probe's one token would cost a catch-up of
        every token missed (measured on Spec-Bench with the 1.5B on int8: ~0.7 s a probe)."""
        return False

    def begin(self, seq: SequenceView) -> None:
        if seq.capacity > self.runner.max_context:
            raise ContextLengthError(
                f"prompt + max_tokens = {seq.capacity} tokens exceeds the draft model's context of "
                f"{self.runner.max_context} tokens"
            )
        self._seqs[seq.request_id] = self.runner.open(seq.capacity)
        self._offset[seq.request_id] = 0

    def propose(self, seq: SequenceView, budget: Budget) -> Draft:
        return self.propose_batch([seq], [budget])[0]

    def propose_batch(self, seqs: list[SequenceView], budgets: list[Budget]) -> list[Draft]:
        """Every request's chain, drafted position by position in one draft forward for all the
        requests still drafting. A request drafts while its kind pays (`pays`), up to the budget's
        depth, and stops where its next token is not worth drafting (`worth`)."""
        drafts = [Draft(tokens=[]) for _ in seqs]
        limit, feed, paths, probs = {}, {}, {}, {}  # by index into seqs, for the requests drafting
        for i, (seq, budget) in enumerate(zip(seqs, budgets)):
            if budget.depth > 0 and budget.pays("") > 0:  # each token costs a draft forward
                limit[i] = budget.depth  # the longest draft that could pay; confidence stops it sooner
                feed[i] = self._catch_up(seq)
                paths[i], probs[i] = [], []
                self._drafted_from[seq.request_id] = len(seq.tokens)
        while feed:
            active = list(feed)
            outs = self.runner.forward_batch([BatchItem(self._seqs[seqs[i].request_id], feed[i]) for i in active])
            for i, out in zip(active, outs):
                seq, draft = seqs[i], drafts[i]
                logits = out.logits  # [1, head rows]
                if seq.params.greedy:
                    q = torch.softmax(logits[0], dim=-1)  # the draft's own confidence, at temperature 1
                    token = int(logits[0].argmax())
                else:
                    q = logits_to_probs(logits, seq.params.temperature, seq.params.top_k, seq.params.top_p)[0]
                    token = int(sample_from_probs(q[None], seq.generator)[0])
                path = paths[i]
                path.append((path[-1] if path else 1.0) * confidence(q, token))
                if len(path) > 1 and not budgets[i].worth("", path):  # the first token: its kind pays (`pays`)
                    path.pop()
                    del feed[i]
                    continue
                if not seq.params.greedy:
                    probs[i].append(q)
                draft.tokens.append(token)
                if len(draft.tokens) >= limit[i]:
                    del feed[i]
                else:
                    feed[i] = [token]
        for i in paths:
            draft = drafts[i]
            if not draft.tokens:
                continue
            # stopped here already: the policy verifies the chain whole (re-cutting a sampled chain
            # by its later nodes' confidences, which depend on the tokens drawn before them, would
            # select tokens on themselves) and calibrates the kind on its path probabilities
            draft.node_probs, draft.sized = paths[i], True
            if probs[i]:  # q over the target's vocabulary: the draft's head may cover its first ids only
                q = torch.stack(probs[i])  # [n, head rows]
                draft.probs = torch.nn.functional.pad(q, (0, self.vocab_size - q.shape[1])) if q.shape[1] < self.vocab_size else q
        return drafts

    def _catch_up(self, seq: SequenceView) -> list[int]:
        """The request's tokens the draft's cache lacks (>= 1: it never holds the last one). Where
        they are more than `window` (a long prompt, or many steps without drafts), the cache starts
        afresh from the request's last `window` tokens: a draft only proposes, so it may read less
        of the context, and its catch-up stays a bounded cost."""
        rid, sid = seq.request_id, self._seqs[seq.request_id]
        held = self._offset[rid] + self.runner.length(sid)
        if self.window and len(seq.tokens) - held > self.window:
            self.runner.truncate(sid, 0)
            held = self._offset[rid] = len(seq.tokens) - self.window
        return seq.tokens[held:]

    def accept(self, seq: SequenceView, num_accepted: int) -> None:
        sid = self._seqs[seq.request_id]
        before = self._drafted_from[seq.request_id] - self._offset[seq.request_id]
        # the cache holds tokens[offset:before] + draft[:n-1] (fewer where drafting stopped early);
        # keep tokens[offset:before] + the accepted ones
        self.runner.truncate(sid, min(self.runner.length(sid), before + num_accepted))

    def end(self, seq: SequenceView) -> None:
        sid = self._seqs.pop(seq.request_id, None)
        self._drafted_from.pop(seq.request_id, None)
        self._offset.pop(seq.request_id, None)
        if sid is not None:
            self.runner.close(sid)


def confidence(q: torch.Tensor, token: int) -> float:
    """A draft position's confidence: the largest probability of its distribution q [head rows]
    (the drawn token's own would select sampled tokens on themselves: not lossless)."""
    return float(q.max())


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
