"""The decoding loop: one speculative step at a time, for one request or a running batch.

Invariant: the target's cache holds every token of the request except the last one (`pending`,
the newest output token, not yet seen by the target). A step:

  1. propose  the policy gives a budget, the drafter returns a draft (a chain, or a token tree
              where `tree_nodes` allows), the policy sizes it (engine/policy.py), cut at the
              first token a structured-output grammar rejects;
  2. verify   one target forward over [pending] + draft -> logits at all k + 1 positions (a
              tree's nodes each seeing only their path: the runner's `capabilities.trees`);
  3. accept   each position's logits processed as plain decoding would (logit bias, grammar
              mask, penalties counting the drafts before it: engine/logits.py); greedy: keep
              drafts while they equal the argmax; sampling: lossless rejection sampling (a tree:
              sampling/tree.py); either way one more token (recovered or bonus) follows;
  4. commit   roll the target's cache back to the kept tokens (a tree: keep its accepted path),
              tell the drafter;
  5. emit     append the kept tokens (and their logprobs), stopping at exactly the token where a
              stop condition hits.

Plain decoding is the same loop with no drafter (k = 0): a one-token forward and one token out.
Where the runner verifies in chunks (`ModelRunner.verify_chunks`), step 2 forwards the rows a
chunk at a time and a greedy request stops at its first rejected draft (`_verify`).
A running batch takes the same steps, each request with its own draft and one forward for all
(`step_batch`).
"""

from __future__ import annotations

import time

import torch

from verispec.config import SamplingParams
from verispec.engine.logits import LogitsProcessor
from verispec.engine.logprobs import prompt_logprobs, row_logprobs
from verispec.engine.policy import AcceptanceEstimate, SpeculationPolicy
from verispec.engine.prefix_cache import PrefixCache
from verispec.engine.request import Estimates, Request
from verispec.engine.stops import StopChecker
from verispec.errors import (ContextLengthError, InvalidPromptError, InvalidSamplingParamsError,
                             InvalidSpeculativeConfigError)
from verispec.proposers.base import Draft, Proposer, SequenceView
from verispec.runners.base import BatchItem, ModelRunner, kv_bytes_per_token
from verispec.sampling.processors import greedy_tokens, logits_to_probs
from verispec.sampling.rejection import greedy_accept, rejection_sample
from verispec.sampling.tree import greedy_tree_verify, tree_rejection_sample
from verispec.structured.grammar import GrammarCompiler


class SpeculativeDecoder:
    def __init__(
        self,
        target: ModelRunner,
        proposer: Proposer | None = None,
        num_speculative_tokens: int = 0,
        policy: SpeculationPolicy | None = None,
        logprobs_mode: str = "raw_logprobs",
        prefix_cache: PrefixCache | None = None,
        prefill_rows: int | None = None,
        tree_nodes: int = 0,
    ) -> None:
        """`policy` chooses k per request and step; by default always `num_speculative_tokens`.
        `prefix_cache`: reuse earlier requests' prefixes; `prefill_rows`: prefill prompts that many
        rows per forward through the decoding kernels (None: a prompt in one forward).
        `tree_nodes` > 0: the drafter may propose token trees of up to that many nodes, k deep, sized
        by the policy (a tree, or its main path as a chain); requests that process logits
        (penalties, grammars, logit bias) keep chains."""
        if tree_nodes and not (proposer is not None and proposer.proposes_trees):
            raise InvalidSpeculativeConfigError(f"tree_max_nodes needs a drafter that proposes token trees (suffix, eagle3), "
                                                f"not {proposer.name if proposer is not None else None!r}")
        if tree_nodes and not target.capabilities.trees:
            raise InvalidSpeculativeConfigError(f"the {target.backend} backend does not verify token "
                                                f"trees: set tree_max_nodes to 0")
        self.tree_nodes = tree_nodes
        self.target = target
        self.proposer = proposer
        k = num_speculative_tokens if proposer is not None else 0
        self.policy = policy if policy is not None else SpeculationPolicy(k, adaptive=False)
        self.logprobs_mode = logprobs_mode
        self.prefix_cache = prefix_cache
        self.prefill_rows = prefill_rows
        self.grammars = GrammarCompiler(target.tokenizer, target.vocab_size)
        self._next_id = 0
        # estimates of draft kinds whose source every request shares (Proposer.shared_sources)
        self._shared_estimates: dict[str, AcceptanceEstimate] = {}
        self._shared_sources = proposer.shared_sources if proposer is not None else frozenset()
        # drafters that read the target's hidden states (EAGLE) name them: layers, or "final"
        states = proposer.target_states if proposer is not None else None
        self._state_args = {} if states is None else {"return_hidden": True} if states == "final" else {"aux_layers": tuple(states)}

    # -- request lifecycle --------------------------------------------------------------------
    def start(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        """Check the request, prefill the prompt and emit the first token."""
        req = self.begin(prompt_ids, params)
        try:
            while not self.prefill(req):
                pass
        except BaseException:
            self.finish(req)
            raise
        return req

    def begin(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        """Check the request and open its caches (the cached part of its prompt written in);
        `prefill` then forwards the rest of the prompt."""
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
            estimates=Estimates(self._shared_estimates, self._shared_sources),
            started=started,
        )
        req.metrics.num_prompt_tokens = len(prompt_ids)
        try:
            if params.processes_logits:
                grammar = self.grammars.matcher(params.structured_outputs) if params.structured_outputs else None
                req.processor = LogitsProcessor(params, prompt_ids, grammar)
                req.processor.begin_step([])
            if params.logprobs is not None:
                req.logprobs = []
            if params.prompt_logprobs is not None:
                req.prompt_logprobs = prompt_logprobs(self.target, prompt_ids, params.prompt_logprobs)
            if self.prefix_cache is not None:
                req.metrics.num_cached_prompt_tokens = self.prefix_cache.reuse(req.target_seq, prompt_ids)
                view.states_start = req.metrics.num_cached_prompt_tokens  # no target states before it
            if self.proposer is not None:
                self.proposer.begin(view)
        except BaseException:
            self.finish(req)  # nothing held by a request that never started
            raise
        return req

    def prefill(self, req: Request, max_rows: int | None = None) -> bool:
        """Forward the next part of the prompt: at most `prefill_rows` rows (all of it when None)
        and at most `max_rows`. True once the whole prompt is in and the first token is out."""
        prompt, done = req.prompt_ids, self.target.length(req.target_seq)
        end = len(prompt)
        for limit in (self.prefill_rows, max_rows):
            if limit is not None:
                end = min(end, done + limit)
        out = self.target.forward(req.target_seq, prompt[done:end], num_logits=1, **self._state_args)
        logits = out.logits  # [1, vocab]
        self._keep_states(req, out)
        if end < len(prompt):
            return False
        req.metrics.num_target_forwards += 1
        block, _, dist = self._accept(req, logits, Draft(tokens=[]))
        self._emit(req, block, logits, dist)
        req.metrics.time_to_first_token = time.perf_counter() - req.started
        return True

    def finish(self, req: Request) -> None:
        """Free the request's caches (target and drafter); its blocks stay in the prefix cache."""
        req.metrics.total_time = time.perf_counter() - req.started
        req.metrics.num_output_tokens = len(req.output_ids)
        if self.prefix_cache is not None:
            self.prefix_cache.remember(req.target_seq, req.view.tokens)
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
        drafts = self._propose(reqs)
        for req, draft in zip(reqs, drafts):
            if req.processor is not None:
                req.processor.begin_step(draft.tokens)
        # 2. verify
        bases = [self.target.length(req.target_seq) for req in reqs]  # pending goes at base
        verified, states = self._verify(reqs, drafts)
        emitted_all = []
        for req, draft, base, logits, state in zip(reqs, drafts, bases, verified, states):
            req.metrics.num_target_forwards += 1
            # 3. accept (over the rows verified: a greedy chain's verification may have stopped early)
            block, path, dist = self._accept(req, logits, draft)
            rows = [0] + [i + 1 for i in path]  # the pending token's row, then the accepted nodes'
            # 4. commit: a chain keeps its first rows; a tree's accepted path moves in after the pending token
            if draft.parents is None:
                self.target.truncate(req.target_seq, base + len(rows))
            else:
                self.target.keep(req.target_seq, base, rows)
            if state is not None:
                req.view.states.append(state[rows])  # [kept rows, state_width]
            if len(draft):
                self.proposer.accept(req.view, len(path))
                self._learn(req, draft, path)
            # 5. emit (a tree's path rows gathered in order, only where logprobs read them)
            if draft.parents is not None and req.logprobs is not None:
                logits, dist = logits[rows], dist[rows]
            emitted = self._emit(req, block, logits, dist)
            req.metrics.observe_draft(len(draft), min(len(path), len(emitted)), draft.depth)
            emitted_all.append(emitted)
        return emitted_all

    def _learn(self, req: Request, draft: Draft, path: list[int]) -> None:
        """The draft kind's estimate learns what was kept of a verified draft: its rate (a tree
        counts as a chain as deep) and, for a draft sized by its tokens' probabilities, their
        calibration (`path`: the accepted nodes)."""
        estimate = req.estimates[draft.kind]
        estimate.observe(draft.depth, len(path))
        if draft.node_probs is not None:
            estimate.observe_tree(draft.node_probs, draft.node_groups(), path)

    def _keep_states(self, req: Request, out) -> None:
        """Hand a prefill chunk's target states ([chunk rows, state_width]) to a drafter that reads them."""
        state = self._state_of(out)
        if state is not None:
            req.view.states.append(state)

    def _state_of(self, out) -> torch.Tensor | None:
        if not self._state_args:
            return None
        return out.hidden if "return_hidden" in self._state_args else out.aux

    def _verify(self, reqs: list[Request], drafts: list[Draft]) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """Each request's target logits over [pending] + draft: [m, vocab], m <= len(draft) + 1,
        and the target's states of those rows ([m, state_width]) where the drafter reads them.

        One forward for the whole batch, or, where the runner verifies in chunks (`verify_chunks`:
        the batch-invariant torch backend's products of 2-3 rows, llama.cpp's invariant_rows), one
        forward per round of chunks; a greedy request leaves after the chunk that holds its first
        rejected draft, since nothing after it could be kept. Example, k = 4 in chunks [3, 2]: rows
        [pending, d1, d2] first; if their argmaxes are d1, d2, d3, then [d3, d4]; else m = 3 and
        the weights are read once instead of twice.
        """
        rows = [[req.output_ids[-1], *d.tokens] for req, d in zip(reqs, drafts)]
        # a tree in one forward (no early exit: a rejected node says nothing of its siblings)
        trees = [None if d.parents is None else [-1] + [p + 1 for p in d.parents] for d in drafts]
        plans = [self.target.verify_chunks(len(r)) if t is None else [len(r)] for r, t in zip(rows, trees)]
        if all(len(plan) == 1 for plan in plans):
            items = [BatchItem(req.target_seq, r, num_logits=len(r), parents=t, **self._state_args)
                     for req, r, t in zip(reqs, rows, trees)]
            outs = self.target.forward_batch(items)
            return [out.logits for out in outs], [self._state_of(out) for out in outs]
        parts: list[list[torch.Tensor]] = [[] for _ in reqs]
        state_parts: list[list[torch.Tensor]] = [[] for _ in reqs]
        done = [0] * len(reqs)  # rows of each request forwarded so far
        active, chunk = list(range(len(reqs))), 0
        while active:
            sizes = [plans[i][chunk] for i in active]
            items = [BatchItem(reqs[i].target_seq, rows[i][done[i] : done[i] + n], num_logits=n, parents=trees[i],
                               **self._state_args) for i, n in zip(active, sizes)]
            still = []
            for i, n, out in zip(active, sizes, self.target.forward_batch(items)):
                parts[i].append(out.logits)  # [n, vocab]: the targets of rows[i][done + 1 .. done + n]
                if self._state_args:
                    state_parts[i].append(self._state_of(out))
                chosen = out.logits if reqs[i].processor is None else reqs[i].processor.process(out.logits, done[i])
                agreed = not reqs[i].params.greedy or greedy_tokens(chosen) == rows[i][done[i] + 1 : done[i] + 1 + n]
                done[i] += n
                if chunk + 1 < len(plans[i]) and agreed:
                    still.append(i)
            active, chunk = still, chunk + 1
        logits = [p[0] if len(p) == 1 else torch.cat(p) for p in parts]
        return logits, [torch.cat(p) if p else None for p in state_parts]

    def _propose(self, reqs: list[Request]) -> list[Draft]:
        """Step 1 for a running batch: each request's budget from the policy, the drafter's drafts
        (for all of them at once: `propose_batch`), each draft's cut by the policy and by its
        request's grammar. Trees where the decoder takes them and the request processes no logits."""
        if self.proposer is None:
            return [Draft(tokens=[]) for _ in reqs]
        early_exit = [req.params.greedy for req in reqs]  # see _verify; the policy weighs the chunks it may skip
        budgets = [self.policy.budget(req.estimates.__getitem__, len(reqs), req.room, exit_, self.tree_nodes if req.processor is None else 0,
                                      self.proposer.kind_cost, self.proposer.kind_probes) for req, exit_ in zip(reqs, early_exit)]
        drafting = [i for i, b in enumerate(budgets) if b.depth > 0]
        drafts = [Draft(tokens=[]) for _ in reqs]
        if drafting:
            proposed = self.proposer.propose_batch([reqs[i].view for i in drafting], [budgets[i] for i in drafting])
            for i, draft in zip(drafting, proposed):
                req = reqs[i]
                if len(draft):
                    draft = self.policy.size(draft, req.estimates[draft.kind], budgets[i], len(reqs), early_exit[i])
                    if not len(draft):  # nothing of it pays: the drafter learns now that none of it is kept
                        self.proposer.accept(req.view, 0)
                drafts[i] = self._allowed(req, draft)
        return drafts

    def _allowed(self, req: Request, draft: Draft) -> Draft:
        """The draft cut where its request's grammar rejects a token: nothing after it could be kept.

        A deterministic draft (no probs) is cut before that token. A sampled draft keeps it, as a
        sure rejection (the masked target gives it probability 0): the next token must then come
        from the residual max(0, p - q), not from p, or the output is no longer distributed as the
        target's (tests/test_logits_processing.py checks both ways)."""
        if req.processor is None or not len(draft):
            return draft
        n = req.processor.valid_prefix(draft.tokens)
        if n == len(draft):
            return draft
        n += draft.probs is not None
        if n == 0:  # nothing left to verify: the drafter learns now that none of it was kept
            self.proposer.accept(req.view, 0)
            return Draft(tokens=[])
        return draft.first(n)

    def _accept(self, req: Request, logits: torch.Tensor, draft: Draft) -> tuple[list[int], list[int], torch.Tensor]:
        """Verify the draft on the target's logits [m, vocab] (row 0 the pending token's, row i + 1
        draft node i's; a greedy chain's m may stop short of its length + 1): the tokens the step
        emits (the accepted drafts, then the recovered or bonus token), the accepted draft nodes in
        order, and the distribution tokens were chosen from (processed logits when greedy,
        probabilities when sampling)."""
        if draft.parents is not None:
            return self._accept_tree(req, logits, draft)
        draft_tokens = draft.tokens[: logits.shape[0] - 1]
        if req.processor is not None:
            logits = req.processor.process(logits)
        if req.params.greedy:
            argmax = greedy_tokens(logits)  # [m]
            n = greedy_accept(argmax, draft_tokens)
            return argmax[: n + 1], list(range(n)), logits
        p = req.params
        # row by row: each row's distribution is the one plain decoding computes for it
        target_probs = torch.cat([logits_to_probs(row[None], p.temperature, p.top_k, p.top_p, p.min_p)
                                  for row in logits])  # [n + 1, vocab]
        draft_probs = None if draft.probs is None else draft.probs[None]  # [1, n, vocab]
        result = rejection_sample(target_probs[None], draft_probs, torch.tensor([draft_tokens], dtype=torch.int64),
                                  generators=req.view.generator)
        n = int(result.num_accepted[0])
        return result.output_tokens[0, : n + 1].tolist(), list(range(n)), target_probs

    def _accept_tree(self, req: Request, logits: torch.Tensor, draft: Draft) -> tuple[list[int], list[int], torch.Tensor]:
        """`_accept` for a token tree: the longest agreeing path (greedy), or multi-candidate
        rejection sampling. Requests with trees process no logits beyond sampling's (_propose)."""
        p = req.params
        if p.greedy:
            out = greedy_tree_verify(greedy_tokens(logits), draft.tokens, draft.parents)
            return out.tokens, out.path, logits
        dist = torch.cat([logits_to_probs(row[None], p.temperature, p.top_k, p.top_p, p.min_p) for row in logits])
        out = tree_rejection_sample(dist, draft.tokens, draft.parents, draft.probs, generator=req.view.generator)
        return out.tokens, out.path, dist

    def _emit(self, req: Request, block: list[int], raw: torch.Tensor | None = None, dist: torch.Tensor | None = None) -> list[int]:
        """Append the block up to its first stop; raw/dist: the step's rows (for logprobs)."""
        result = req.stops.check(req.output_ids, block)
        kept = block[: result.num_kept]
        req.output_ids.extend(kept)
        req.view.tokens.extend(kept)
        if req.processor is not None:
            req.processor.commit(kept)
        if req.logprobs is not None:
            num_top = req.params.logprobs or 0
            for j, token in enumerate(kept):
                if self.logprobs_mode == "raw_logprobs":
                    req.logprobs.append(row_logprobs(raw[j], token, num_top))
                elif req.params.greedy:
                    req.logprobs.append(row_logprobs(dist[j], token, num_top))
                else:
                    req.logprobs.append(row_logprobs(torch.log(dist[j]), token, num_top, log_probs=True))
        if result.finish_reason is not None:
            req.finish_reason = result.finish_reason
            req.text_end = result.text_end
        return kept

    def kv_bytes(self, positions: int) -> int:
        """Bytes of KV cache a request of this many positions fills at most: the target's, and its
        draft model's where the drafter runs one."""
        runners = [self.target] + ([self.proposer.runner] if self.proposer is not None and self.proposer.runner is not None else [])
        return positions * sum(kv_bytes_per_token(r) for r in runners)

    # -- checks -------------------------------------------------------------------------------
    def check_prompt(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise InvalidPromptError("the prompt is empty (it encodes to no tokens)")
        vocab = self.target.vocab_size
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidPromptError(f"prompt token ids out of the vocabulary [0, {vocab}): {bad[:5]}")
        bad = [t for t in params.logit_bias or {} if t >= vocab]
        if bad:
            raise InvalidSamplingParamsError(f"logit_bias token ids out of the vocabulary [0, {vocab}): {bad[:5]}")
        if params.structured_outputs is not None:
            self.grammars.grammar(params.structured_outputs)  # InvalidGrammarError now, not at admission
        need = len(prompt_ids) + params.max_tokens
        if need > self.target.max_context:
            raise ContextLengthError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = {need} "
                f"exceeds the model's context of {self.target.max_context} tokens"
            )
