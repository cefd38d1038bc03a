"""The decoding loop: one speculative step at a time, for one request or a running batch.

Invariant: the target's cache holds every token of the request except the last one (`pending`,
the newest output token, not yet seen by the target). A step:

  1. propose  the drafter offers up to k tokens continuing prompt + output;
  2. verify   one target forward over [pending] + draft -> logits at all k + 1 positions;
  3. accept   greedy: keep drafts while they equal the target's argmax; sampling: lossless
              rejection sampling; either way one more token (recovered or bonus) follows;
  4. commit   roll the target's cache back to the kept tokens, tell the drafter;
  5. emit     append the kept tokens, stopping at exactly the token where a stop condition hits.

Plain decoding is the same loop with no drafter (k = 0): a one-token forward and one token out.
Where the runner verifies in chunks (`ModelRunner.verify_chunks`), step 2 forwards the rows a
chunk at a time and a greedy request stops at its first rejected draft (`_verify`).
A running batch takes the same steps, each request with its own draft and one forward for all
(`step_batch`); `engine/policy.py` decides each request's k.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from verispec.config import SamplingParams
from verispec.engine.metrics import RequestMetrics
from verispec.engine.policy import AcceptanceEstimate, SpeculationPolicy
from verispec.engine.runner import BatchItem, ModelRunner
from verispec.engine.stops import StopChecker
from verispec.errors import ContextLengthError, InvalidPromptError
from verispec.proposers.base import Draft, Proposer, SequenceView
from verispec.sampling.processors import logits_to_probs
from verispec.sampling.rejection import VerifyOutput, greedy_verify, rejection_sample


@dataclass
class Request:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    view: SequenceView  # view.tokens is prompt + output, shared with the drafter
    stops: StopChecker
    target_seq: int
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    text_end: int | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    estimate: AcceptanceEstimate = field(default_factory=AcceptanceEstimate)  # for the policy
    estimates: dict[str, AcceptanceEstimate] = field(default_factory=dict)  # per draft kind (Draft.kind)
    started: float = 0.0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def text(self) -> str:
        """The output text, stop strings and stop tokens cut."""
        return self.stops.final_text(self.output_ids, self.text_end)


class SpeculativeDecoder:
    def __init__(
        self,
        target: ModelRunner,
        proposer: Proposer | None = None,
        num_speculative_tokens: int = 0,
        policy: SpeculationPolicy | None = None,
    ) -> None:
        """`policy` chooses k per request and step; by default always `num_speculative_tokens`."""
        self.target = target
        self.proposer = proposer
        k = num_speculative_tokens if proposer is not None else 0
        self.policy = policy if policy is not None else SpeculationPolicy(k, adaptive=False)
        self._next_id = 0

    # -- request lifecycle --------------------------------------------------------------------
    def start(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        """Check the request, prefill the prompt and emit the first token."""
        started = time.perf_counter()
        self.check_prompt(prompt_ids, params)
        capacity = len(prompt_ids) + params.max_tokens
        generator = None
        if not params.greedy:
            generator = torch.Generator()
            generator.manual_seed(params.seed if params.seed is not None else int(torch.randint(2**62, ())))
        self._next_id += 1
        view = SequenceView(self._next_id, list(prompt_ids), len(prompt_ids), params, generator, capacity)
        req = Request(
            request_id=self._next_id,
            prompt_ids=list(prompt_ids),
            params=params,
            view=view,
            stops=StopChecker(params, self.target.tokenizer, self.target.eos_token_ids),
            target_seq=self.target.open(capacity),
            started=started,
        )
        req.metrics.num_prompt_tokens = len(prompt_ids)
        try:
            if self.proposer is not None:
                self.proposer.begin(view)
            logits = self.target.forward(req.target_seq, prompt_ids, num_logits=1).logits  # [1, vocab]
            req.metrics.num_target_forwards += 1
            first = self._accept(req, logits, Draft(tokens=[]))
            self._emit(req, first.output_tokens[0, :1].tolist())
        except BaseException:
            self.finish(req)  # nothing held by a request that never started
            raise
        req.metrics.time_to_first_token = time.perf_counter() - req.started
        return req

    def finish(self, req: Request) -> None:
        """Free the request's caches (target and drafter)."""
        req.metrics.total_time = time.perf_counter() - req.started
        req.metrics.num_output_tokens = len(req.output_ids)
        self.target.close(req.target_seq)
        if self.proposer is not None:
            self.proposer.end(req.view)

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        req = self.start(prompt_ids, params)
        try:
            while not req.finished:
                self.step(req)
        finally:
            self.finish(req)
        return req

    # -- one step -----------------------------------------------------------------------------
    def step(self, req: Request) -> list[int]:
        """One propose-verify-accept-commit-emit step; returns the tokens emitted."""
        return self.step_batch([req])[0]

    def step_batch(self, reqs: list[Request]) -> list[list[int]]:
        """One step for every request of a running batch, verified by one target forward.

        Each request drafts its own number of tokens (the policy's choice, zero included), so the
        forward is a ragged batch of [pending] + draft per request. Returns each one's emitted tokens.
        """
        # 1. propose
        drafts = [self._propose(req, len(reqs)) for req in reqs]
        # 2. verify
        bases = [self.target.length(req.target_seq) for req in reqs]  # pending goes at base
        verified = self._verify(reqs, drafts)
        emitted_all = []
        for req, draft, base, logits in zip(reqs, drafts, bases, verified):
            req.metrics.num_target_forwards += 1
            # 3. accept (over the rows verified: a greedy verification may have stopped early)
            result = self._accept(req, logits, Draft(draft.tokens[: logits.shape[0] - 1], draft.probs))  # [m, vocab]
            num_accepted = int(result.num_accepted[0])
            block = result.output_tokens[0, : num_accepted + 1].tolist()
            # 4. commit
            self.target.truncate(req.target_seq, base + 1 + num_accepted)
            if len(draft):
                self.proposer.accept(req.view, num_accepted)
                req.estimate.observe(len(draft), num_accepted)
                if draft.kind is not None:
                    req.estimates[draft.kind].observe(len(draft), num_accepted)
            # 5. emit
            emitted = self._emit(req, block)
            req.metrics.observe_draft(len(draft), min(num_accepted, len(emitted)))
            emitted_all.append(emitted)
        return emitted_all

    def _verify(self, reqs: list[Request], drafts: list[Draft]) -> list[torch.Tensor]:
        """Each request's target logits over [pending] + draft: [m, vocab], m <= len(draft) + 1.

        One forward for the whole batch, or, where the runner verifies in chunks (`verify_chunks`:
        the batch-invariant torch backend's products of 2-3 rows, llama.cpp's invariant_rows), one
        forward per round of chunks; a greedy request leaves after the chunk that holds its first
        rejected draft, since nothing after it could be kept. Example, k = 4 in chunks [3, 2]: rows
        [pending, d1, d2] first; if their argmaxes are d1, d2, d3, then [d3, d4]; else m = 3 and
        the weights are read once instead of twice.
        """
        rows = [[req.output_ids[-1], *d.tokens] for req, d in zip(reqs, drafts)]
        plans = [self.target.verify_chunks(len(r)) for r in rows]
        if all(len(plan) == 1 for plan in plans):
            items = [BatchItem(req.target_seq, r, num_logits=len(r)) for req, r in zip(reqs, rows)]
            return [out.logits for out in self.target.forward_batch(items)]
        parts: list[list[torch.Tensor]] = [[] for _ in reqs]
        done = [0] * len(reqs)  # rows of each request forwarded so far
        active, chunk = list(range(len(reqs))), 0
        while active:
            sizes = [plans[i][chunk] for i in active]
            items = [BatchItem(reqs[i].target_seq, rows[i][done[i] : done[i] + n], num_logits=n) for i, n in zip(active, sizes)]
            still = []
            for i, n, out in zip(active, sizes, self.target.forward_batch(items)):
                parts[i].append(out.logits)  # [n, vocab]: the targets of rows[i][done + 1 .. done + n]
                agreed = not reqs[i].params.greedy or out.logits.argmax(-1).tolist() == rows[i][done[i] + 1 : done[i] + 1 + n]
                done[i] += n
                if chunk + 1 < len(plans[i]) and agreed:
                    still.append(i)
            active, chunk = still, chunk + 1
        return [p[0] if len(p) == 1 else torch.cat(p) for p in parts]

    def _propose(self, req: Request, batch_size: int) -> Draft:
        if self.proposer is None:
            return Draft(tokens=[])
        # never more than can still be emitted, so the cache never overflows
        room = req.params.max_tokens - len(req.output_ids) - 1
        early_exit = req.params.greedy  # see _verify; the policy weighs the chunks it may skip
        if getattr(self.proposer, "labels_drafts", False):  # draft first, then the k its kind pays for
            most = min(self.policy.choose(AcceptanceEstimate(1.0, 0.0), batch_size, early_exit), room)
            draft = self.proposer.propose(req.view, most) if most > 0 else Draft(tokens=[])
            if not len(draft):
                return Draft(tokens=[])
            estimate = req.estimates.setdefault(draft.kind or "", AcceptanceEstimate())
            k = min(self.policy.choose(estimate, batch_size, early_exit), len(draft))
            return Draft(draft.tokens[:k], None if draft.probs is None else draft.probs[:k], kind=draft.kind or "")
        k = min(self.policy.choose(req.estimate, batch_size, early_exit), room)
        if k <= 0:
            return Draft(tokens=[])
        draft = self.proposer.propose(req.view, k)
        return Draft(draft.tokens[:k], None if draft.probs is None else draft.probs[:k])

    def _accept(self, req: Request, logits: torch.Tensor, draft: Draft) -> VerifyOutput:
        draft_tokens = torch.tensor([draft.tokens], dtype=torch.int64)  # [1, n]
        if req.params.greedy:
            return greedy_verify(logits.argmax(dim=-1)[None], draft_tokens)
        p = req.params
        target_probs = logits_to_probs(logits, p.temperature, p.top_k, p.top_p)[None]  # [1, n + 1, vocab]
        draft_probs = None if draft.probs is None else draft.probs[None]  # [1, n, vocab]
        return rejection_sample(target_probs, draft_probs, draft_tokens, generators=req.view.generator)

    def _emit(self, req: Request, block: list[int]) -> list[int]:
        result = req.stops.check(req.output_ids, block)
        kept = block[: result.num_kept]
        req.output_ids.extend(kept)
        req.view.tokens.extend(kept)
        if result.finish_reason is not None:
            req.finish_reason = result.finish_reason
            req.text_end = result.text_end
        return kept

    # -- checks -------------------------------------------------------------------------------
    def check_prompt(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise InvalidPromptError("the prompt is empty (it encodes to no tokens)")
        vocab = self.target.vocab_size
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidPromptError(f"prompt token ids out of the vocabulary [0, {vocab}): {bad[:5]}")
        need = len(prompt_ids) + params.max_tokens
        if need > self.target.max_context:
            raise ContextLengthError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = {need} "
                f"exceeds the model's context of {self.target.max_context} tokens"
            )
