"""How many tokens to draft for a request at this step: speculation that backs off where it does
not pay.

A step that verifies k draft tokens costs the target a forward over k + 1 tokens, `cost(k + 1)`
in units of a one-token forward (runners/costs.py: the backend's built-in curve, a profile, or
timed at start-up), plus k draft tokens at `draft_cost` + `DRAFT_OVERHEAD` each (the drafter's own
estimate, `Proposer.relative_cost`: 0 for prompt lookup, the draft model's weight bytes over the
target's for draft_model; fixed, not timed, so with a fixed cost curve a seeded request's k
choices -- and with them its sampled tokens -- are reproducible). With a per-token acceptance
rate a, the step yields on average

    E(k) = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)

tokens (the accepted drafts plus the recovered or bonus token). The policy picks the k in
0..max_k that maximises E(k) / (cost(k + 1) + k * draft_cost); k = 0 is plain decoding, rate 1.

The acceptance rate is estimated per request from its own drafts: each draft of n tokens with m
accepted adds m successes and, if m < n, one failure (the geometric model's estimate), with
older drafts decayed so the estimate follows the text. A request whose drafts stopped paying is
probed with a one-token draft after `probe_every` steps, then twice as long after each probe
that fails (up to `max_probe_every`), so it can come back at little cost. Where even a high
acceptance (`PROBE_RATE`) would gain less than `MIN_PROBE_GAIN` over plain decoding (`gain`: a steep
verification curve, such as llama.cpp's, where verifying one draft costs about two one-token
forwards: docs/design/k-policy.md), it does not probe at all: each probe costs more than a token,
for a gain that could only be small.

One path for every drafter and step (engine/decoder.py's `_propose`): `budget` gives the drafter
the longest draft that could pay and, per kind of draft, the k its own estimate and draft cost pay
for (`Budget.pays`); the drafter drafts; `size` keeps what pays of it (a chain cut to its kind's k,
or, where its tokens carry probabilities, the nodes those pay for).

Choosing k from past acceptance only (never from the current draft's sampled tokens) keeps
verification lossless: the output distribution does not depend on k. A deterministic draft
(suffix decoding's, trees' nodes) may be cut by its own estimates: they follow from the context
alone, not from a draw that the cut would then select on.

Example: a = 0.8, cost(n) = 1 + 0.15 (n - 1), draft_cost 0: E(4) = 3.36 for cost 1.6 (2.1 tokens
per unit), E(2) = 2.44 for cost 1.3 (1.88): k = 4 wins. At a = 0.1 every k > 0 loses to plain.

Token trees (`tree_shape`), and the chains of a drafter that gives each token's probability
(`node_probs`: suffix decoding, alone or in the hybrid), are sized the same way from the
drafter's own estimates: a tree drafter gives each node the probability that it is accepted (its
path's estimate), nodes best first, so the first n nodes are the best tree of n. A tree of n nodes
yields 1 + sum of its nodes' probabilities on average (each node counts when the accepted path
passes through it), for cost(n + 1) + n draft costs; the policy keeps the n with the most tokens
per unit of cost. The drafter's probabilities are scaled by the request's calibration (per draft
kind): accepted tokens over the probabilities' sum, decayed over past trees as the rate above,
apart for each group of nodes whose estimates are calibrated differently (Draft.node_groups): the
main path (each node's likeliest child from the root), the branches off it, and the nodes a
drafter guessed past the text it matched (suffix decoding's nodes deeper than the match, whose
estimates overshoot their acceptance far more than those within it: docs/design/trees.md).
Example: node probabilities [0.9, 0.6, 0.3, 0.1], calibration 1, the cost above with
DRAFT_OVERHEAD per node: n = 2 yields 2.5 for 1.4 (1.79 per unit), n = 3 yields 2.8 for 1.6
(1.75): 2 nodes. Where the best first nodes all lie on the main path, it is verified as a chain
(`tree_shape`).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Callable

from verispec.proposers.base import Budget, Draft
from verispec.runners.costs import default_cost

PRIOR_ACCEPTED = 0.5  # a new request starts at a = 0.5, a prior worth one draft token
PRIOR_REJECTED = 0.5
DECAY = 0.9  # weight of past drafts kept per new draft
# Each draft token also costs bookkeeping outside the forward (building the batch, the verifier,
# the drafter's call), even where a 2-token forward costs what a 1-token one does; chosen from
# drafts that always fail (docs/design/k-policy.md, "Where the constants come from").
DRAFT_OVERHEAD = 0.05
# No probing where drafting at this acceptance (above what prompt lookup reaches on its best
# Spec-Bench subtasks: docs/design/k-policy.md) would gain less than this over plain decoding.
PROBE_RATE = 0.95
MIN_PROBE_GAIN = 1.1


def expected_tokens(a: float, k: int) -> float:
    """Mean tokens a step with k drafts yields at per-token acceptance a (bonus token included)."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass
class AcceptanceEstimate:
    """One request's running acceptance estimate (decayed successes and failures)."""

    accepted: float = PRIOR_ACCEPTED
    rejected: float = PRIOR_REJECTED
    steps_without_draft: int = 0
    probe_interval: int = 0  # steps between probes while drafting does not pay (doubles per probe)

    # token trees: decayed sums of the verified nodes' probabilities and of the nodes accepted, per
    # group of nodes (Draft.node_groups: "main", the main path -- each node's likeliest child from
    # the root --, "branch", the nodes off it, "past", the nodes a drafter guessed past the text
    # it matched); prior: calibration 1 for each
    tree_sums: dict[str, list[float]] = field(default_factory=dict)  # group -> [predicted, realised]

    @property
    def rate(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def calibration_of(self, group: str) -> float:
        """Accepted nodes of a group per unit of the drafter's estimated probability for them."""
        predicted, realised = self.tree_sums.get(group, (1.0, 1.0))
        return realised / predicted

    @property
    def calibration(self) -> float:
        """The main path's calibration."""
        return self.calibration_of("main")

    def observe(self, num_draft: int, num_accepted: int) -> None:
        self.accepted = DECAY * self.accepted + num_accepted
        self.rejected = DECAY * self.rejected + (1.0 if num_accepted < num_draft else 0.0)

    def observe_tree(self, node_probs: list[float], groups: list[str], path: list[int]) -> None:
        """A verified tree: its nodes' probabilities, their groups, the accepted path (node indices)."""
        on_path = set(path)
        for group in set(groups) | set(self.tree_sums):
            sums = self.tree_sums.setdefault(group, [1.0, 1.0])
            sums[0] = DECAY * sums[0] + sum(p for p, g in zip(node_probs, groups) if g == group)
            sums[1] = DECAY * sums[1] + sum(1 for i, g in enumerate(groups) if g == group and i in on_path)


class SpeculationPolicy:
    def __init__(
        self,
        max_k: int,
        adaptive: bool = True,
        disable_by_batch_size: int | None = None,
        cost: Callable[[int], float] = default_cost,
        probe_every: int = 8,
        probe_k: int = 1,
        max_probe_every: int = 64,
        draft_cost: float = 0.0,
        chunks: Callable[[int], list[int]] | None = None,
    ) -> None:
        """`chunks`: the runner's `verify_chunks`, for the expected cost of verification that stops
        at the first rejected draft (None: every verification costs cost(k + 1))."""
        self.max_k = max_k
        self.adaptive = adaptive
        self.disable_by_batch_size = disable_by_batch_size
        self.cost = cost
        self.probe_every = probe_every
        self.max_probe_every = max_probe_every
        self.probe_k = min(probe_k, max_k)
        self.draft_cost = draft_cost
        self.chunks = chunks
        # `cost` and `chunks` are fixed once the policy is built: each row count's chunks and their
        # costs are kept, and so are the rates at the acceptances asked for every step (a = 1 for
        # the most a drafter may propose, PROBE_RATE) -- the policy runs several times a step
        self._cost = functools.lru_cache(maxsize=None)(cost)  # each row count's cost, computed once
        self._chunk_costs: dict[int, list[tuple[float, int]]] = {}
        self._rates: dict[tuple, tuple[float, ...]] = {}
        self._mosts: dict[tuple[bool, bool], int] = {}  # `_most`'s

    def step_cost(self, n: int, a: float, early_exit: bool) -> float:
        """Expected cost of verifying n rows. With `early_exit` (greedy, on a runner that verifies
        in chunks: `verify_chunks`) a chunk that starts at row r runs only if the r drafts before
        it were all accepted, probability a^r. Example: 9 rows in chunks [3, 3, 3] at a = 0.8 cost
        cost(3) * (1 + 0.8^3 + 0.8^6) = 1.77 cost(3) instead of 3 cost(3)."""
        if not early_exit or self.chunks is None:
            return self._cost(n)
        return sum(c * a**start for c, start in self._chunk_parts(n))

    def _chunk_parts(self, n: int) -> list[tuple[float, int]]:
        """n rows' chunks (`chunks`) as [(the chunk's cost, the row it starts at)]."""
        parts = self._chunk_costs.get(n)
        if parts is None:
            assert self.chunks is not None
            starts = itertools.accumulate(self.chunks(n), initial=0)
            parts = self._chunk_costs[n] = [(self._cost(size), start) for size, start in zip(self.chunks(n), starts)]
        return parts

    def rates(self, a: float, early_exit: bool = False, draft_cost: float | None = None) -> tuple[float, ...]:
        """Expected tokens per unit of cost for k = 0..max_k drafts at acceptance a (`draft_cost`:
        a draft token's cost where it is not the drafter's usual, as a hybrid's model drafts)."""
        per_draft = (self.draft_cost if draft_cost is None else draft_cost) + DRAFT_OVERHEAD
        key = (a, early_exit, per_draft, self.max_k)
        if key in self._rates:
            return self._rates[key]
        rates = tuple(expected_tokens(a, k) / (self.step_cost(k + 1, a, early_exit) + k * per_draft) for k in range(self.max_k + 1))
        if a in (1.0, PROBE_RATE):  # the acceptances asked for every step (others change with each draft)
            self._rates[key] = rates
        return rates

    def best_k(self, a: float, early_exit: bool = False, draft_cost: float | None = None) -> int:
        """The k in 0..max_k with the most expected tokens per unit of cost."""
        rates = self.rates(a, early_exit, draft_cost)
        return max(range(len(rates)), key=rates.__getitem__)

    def gain(self, a: float, early_exit: bool = False, draft_cost: float | None = None) -> float:
        """The best k's tokens per unit of cost over plain decoding's, at acceptance a.
        Example, at a = 0.95, max_k = 4 and the module's cost(n) = 1 + 0.15 (n - 1): k = 4 yields
        4.52 tokens for 1.6 + 4 DRAFT_OVERHEAD = 1.8, a gain of 2.5; on a curve where each row
        costs nearly a forward the gain stays near 1."""
        rates = self.rates(a, early_exit, draft_cost)
        return max(rates) / rates[0]

    def choose(self, estimate: AcceptanceEstimate, batch_size: int, early_exit: bool = False,
               draft_cost: float | None = None, probe: bool = True) -> int:
        if self.max_k == 0:
            return 0
        if self.disable_by_batch_size is not None and batch_size > self.disable_by_batch_size:
            return 0
        if not self.adaptive:
            return self.max_k
        k = self.best_k(estimate.rate, early_exit, draft_cost)
        if k == 0 and not probe:  # a drafter whose probes cost a catch-up: no probing
            return 0
        return self._paying(k, estimate, early_exit, draft_cost)

    def budget(self, estimate_of: Callable[[str], AcceptanceEstimate], batch_size: int, room: int,
               early_exit: bool, nodes: int = 0, kind_cost: Callable[[str], float] | None = None,
               kind_probes: Callable[[str], bool] | None = None) -> Budget:
        """What a drafter may propose for one request at this step (proposers/base.py's Budget).

        A chain is as long as the policy's longest paying draft (k at acceptance 1) and `room`
        (tokens the request can still emit); a tree (`nodes` > 0) as deep as max_k, its nodes sized
        after drafting (`size`). `pays(kind)` is the k a draft of that kind pays for now, from the
        kind's own estimate (`estimate_of`) and draft cost (`kind_cost`; None: `draft_cost`), asked
        once per kind and step (choose() counts steps for probing). A kind whose probes cost more
        than their tokens (`kind_probes` False: a draft model's catch-up on the tokens it missed) is
        never probed: once it stops paying, the request decodes without it."""
        if nodes:
            depth, nodes = min(self.max_k, room), min(nodes, room)
        else:
            depth = min(self._most(batch_size, early_exit), room)
        depth = max(depth, 0)
        chosen: dict[str, int] = {}

        def pays(kind: str) -> int:
            if kind not in chosen:
                cost = None if kind_cost is None else kind_cost(kind)
                probe = kind_probes is None or kind_probes(kind)
                chosen[kind] = min(self.choose(estimate_of(kind), batch_size, early_exit, cost, probe), depth)
            return chosen[kind]

        def worth(kind: str, path_probs: list[float]) -> bool:
            return self.worth(path_probs, estimate_of(kind), None if kind_cost is None else kind_cost(kind))

        return Budget(depth, nodes if depth > 0 else 0, pays, worth)

    def worth(self, path_probs: list[float], estimate: AcceptanceEstimate, draft_cost: float | None = None) -> bool:
        """Whether a chain's last node still raises its step's tokens per unit of cost: its
        calibrated path probability q (its chance of being kept: the drafter's estimate scaled by
        the kind's main-path calibration) against the rate of the chain before it times what the
        node adds to the cost (a draft token, its overhead, one more row to verify). Non-adaptive
        policies draft to the end. Example: the module's cost, draft_cost 0.3, calibration 1, path
        [0.9, 0.8, 0.5]: before the third node 2.7 tokens for 1.3 + 0.7 = 2.0 (rate 1.35); the third
        adds 0.15 + 0.35: worth it if q >= 0.675, and 0.5 is not."""
        if not self.adaptive or not path_probs:
            return True
        per_draft = (self.draft_cost if draft_cost is None else draft_cost) + DRAFT_OVERHEAD
        q = self._calibrated(path_probs, estimate, None)
        n = len(q)
        rate = (1.0 + sum(q[:-1])) / (self._cost(n) + (n - 1) * per_draft)
        return q[-1] >= rate * (self._cost(n + 1) - self._cost(n) + per_draft)

    def _most(self, batch_size: int, early_exit: bool) -> int:
        """The k that pays at acceptance 1 (`choose` on a fresh estimate: no probe is ever due), kept
        per batch-size verdict and early exit: the policy's curve is fixed once built."""
        key = (self.disable_by_batch_size is not None and batch_size > self.disable_by_batch_size, early_exit)
        most = self._mosts.get(key)
        if most is None:
            most = self._mosts[key] = self.choose(AcceptanceEstimate(1.0, 0.0), batch_size, early_exit)
        return most

    def size(self, draft: Draft, estimate: AcceptanceEstimate, budget: Budget, batch_size: int,
             early_exit: bool) -> Draft:
        """What of a drafter's draft to verify. A chain the drafter sized itself (`Draft.sized`,
        stopped where `worth` said) is verified whole. A draft whose tokens carry probabilities
        (`node_probs`: trees, suffix decoding's chains) keeps the nodes those pay for (`tree_shape`,
        calibrated by its kind's `estimate`): a tree's first n nodes, or the first n of its main
        path as a chain; any other chain is cut to the k its kind pays for. A tree without
        probabilities is not verified. Example: a chain with node_probs [0.9, 0.6, 0.3, 0.1] on
        the cost of the module's example keeps 2 tokens."""
        if not len(draft) or draft.sized:
            return draft
        if draft.node_probs is None:
            if draft.parents is not None:
                return Draft(tokens=[])
            return draft.first(min(budget.pays(draft.kind), len(draft)))
        main = draft.main_path()
        n, as_chain = self.tree_shape(draft.node_probs, estimate, batch_size, draft.node_groups(), main, early_exit=early_exit)
        if n <= 0:
            return Draft(tokens=[])
        if as_chain and draft.parents is not None:  # the main path's first n nodes (node_probs kept for the calibration)
            path = draft.subset([i for i, m in enumerate(main) if m][:n])
            return Draft(path.tokens, node_probs=path.node_probs, kind=path.kind, past_match=path.past_match)
        return draft.first(n)

    def tree_shape(self, node_probs: list[float], estimate: AcceptanceEstimate, batch_size: int,
                   groups: list[str] | None = None, main: list[bool] | None = None,
                   early_exit: bool = False) -> tuple[int, bool]:
        """What to verify of a tree draft: (n, False) its first n nodes as a tree, or (n, True) the
        first n nodes of its main path (`main`, Draft.main_path; None: every node) as a chain,
        whichever yields more tokens per unit of cost (ties: the chain). A chain verified greedily
        on a runner that verifies in chunks (`early_exit`) stops at the chunk of its first rejected
        draft, where a tree's rows are all forwarded (a rejected node says nothing of its
        siblings); and a tree whose best first nodes are all on its main path is a chain. Each
        node's probability is scaled by its group's calibration (`groups`, Draft.node_groups).
        Example: nodes [0.9, 0.6, 0.3] (the third a branch), calibration 1, cost(n) = 1 + 0.15
        (n - 1): the tree of 2 is the best (2.5 tokens for 1.4) and the chain of 2 is the same
        draft: (2, True)."""
        if not node_probs or (self.disable_by_batch_size is not None and batch_size > self.disable_by_batch_size):
            return 0, False
        if not self.adaptive:
            return len(node_probs), False
        groups = groups or ["main"] * len(node_probs)
        n, tree_rate = self._best_tree(node_probs, estimate, groups)
        on_path = [i for i in range(len(node_probs)) if main is None or main[i]]
        j, chain_rate = self._best_chain([node_probs[i] for i in on_path], estimate, [groups[i] for i in on_path], early_exit)
        if j > 0 and (chain_rate >= tree_rate or n == 0):
            return self._paying(j, estimate, False), True
        k = self._paying(n, estimate, False)
        return k, n == 0  # a probe (k = probe_k): the main path's first nodes

    def _best_tree(self, node_probs: list[float], estimate: AcceptanceEstimate, groups: list[str] | None) -> tuple[int, float]:
        """The number of first nodes with the most expected tokens per unit of cost (0: none pays), and that rate."""
        per_node = self.draft_cost + DRAFT_OVERHEAD
        best_n, best, expected = 0, 1.0 / self._cost(1), 1.0
        for n, q in enumerate(self._calibrated(node_probs, estimate, groups), 1):
            expected += q
            rate = expected / (self._cost(n + 1) + n * per_node)
            if rate > best:
                best_n, best = n, rate
        return best_n, best

    def _best_chain(self, path_probs: list[float], estimate: AcceptanceEstimate, groups: list[str],
                    early_exit: bool) -> tuple[int, float]:
        """The same for a chain of the main path's first nodes."""
        per_node = self.draft_cost + DRAFT_OVERHEAD
        q = self._calibrated(path_probs, estimate, groups)
        best_j, best, expected = 0, 1.0 / self._cost(1), 1.0
        for j in range(1, len(q) + 1):
            expected += q[j - 1]  # summed as _best_tree sums: the same nodes tie exactly (ties go to the chain)
            rate = expected / (self._path_cost(q[:j], early_exit) + j * per_node)
            if rate > best:
                best_j, best = j, rate
        return best_j, best

    @staticmethod
    def _calibrated(node_probs: list[float], estimate: AcceptanceEstimate, groups: list[str] | None) -> list[float]:
        """Each node's probability of acceptance: the drafter's, scaled by its group's calibration (at most 1)."""
        groups = groups or ["main"] * len(node_probs)
        scale = {g: estimate.calibration_of(g) for g in set(groups)}
        return [min(1.0, scale[g] * p) for p, g in zip(node_probs, groups)]

    def _path_cost(self, q: list[float], early_exit: bool) -> float:
        """Expected cost of verifying a chain whose nodes are accepted with path probabilities q
        (each: that it and every node before it are accepted): `step_cost`, with each chunk
        weighed by the chance it runs from q instead of a^r."""
        if not early_exit or self.chunks is None:
            return self._cost(len(q) + 1)
        return sum(c * (q[start - 1] if start else 1.0) for c, start in self._chunk_parts(len(q) + 1))

    def _paying(self, k: int, estimate: AcceptanceEstimate, early_exit: bool, draft_cost: float | None = None) -> int:
        """k where drafting pays (probing starts afresh should it stop paying); else 0, or a
        probe of probe_k tokens once its interval has passed (see the module)."""
        if k > 0:
            estimate.steps_without_draft = 0
            estimate.probe_interval = self.probe_every
            return k
        if self.gain(PROBE_RATE, early_exit, draft_cost) < MIN_PROBE_GAIN:  # drafting could gain little here: no probe
            return 0
        estimate.steps_without_draft += 1
        interval = estimate.probe_interval or self.probe_every
        if estimate.steps_without_draft >= interval:  # probe, and wait twice as long for the next one
            estimate.steps_without_draft = 0
            estimate.probe_interval = min(2 * interval, self.max_probe_every)
            return self.probe_k
        return 0
