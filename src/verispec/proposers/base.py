"""The one drafter protocol, and the registry that maps method names to drafters.

A drafter's lifecycle has four verbs (as llama.cpp's common/speculative.h): `begin` a request,
`propose` a draft within the step's `Budget`, learn how much of it was `accept`ed, `end` the
request. A new method is a new file that registers a `Proposer` subclass; the engine never
branches on method names, and never probes a drafter: what a drafter can do is declared on its
class (`proposes_trees`, `target_states`, `shared_sources`, `relative_cost`, `kind_cost`).

One drafting path (engine/decoder.py): the policy gives a budget, the drafter returns a draft (a
chain is a tree with one branch), the policy sizes it (engine/policy.py), one forward verifies it.
- Drafts carry a `kind` ("source:detail", or "" for a drafter's only kind): each kind keeps its
  own acceptance estimate, and a draft token of a kind costs `kind_cost(kind)`. A drafter whose
  tokens cost (a model) asks `budget.pays(kind)` before drafting and drafts no more; a free one
  (suffix decoding) drafts up to `budget.depth` and lets the policy cut.
- Token trees: a drafter with `proposes_trees` may return `parents` (None = a chain) with
  `node_probs` when the budget allows nodes (`budget.nodes` > 0); the policy sizes the tree by
  cost, one forward verifies it and one path is kept. A chain carrying `node_probs` is sized by
  them the same way.
- Drafters that read the target's hidden states (EAGLE) name them in `target_states` (layer ids
  whose input residual streams they read, or "final"); the decoder then hands them the states of
  every kept position through `SequenceView.states`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar

import torch

from verispec.errors import InvalidSpeculativeConfigError

if TYPE_CHECKING:
    from verispec.config import SamplingParams, SpeculativeConfig
    from verispec.runners.base import ModelRunner


@dataclass
class Draft:
    tokens: list[int]  # [n] proposed token ids in the target's vocabulary, n <= k
    probs: torch.Tensor | None = None  # [n, vocab] processed draft distribution; None = deterministic
    parents: list[int] | None = None  # tree drafts: parent node of each token, -1 = the root (the pending token)
    # Each node's estimated probability of being accepted (the product of its path's estimates);
    # a tree's nodes listed best first with every parent before its children, so any first n nodes
    # are a tree: the policy keeps the n the cost curve pays for. Trees always; a chain that carries
    # them (suffix decoding's) is sized the same way.
    node_probs: list[float] | None = None
    # Drafts of one kind share an acceptance estimate in the k policy (engine/policy.py). A drafter
    # whose drafts differ in reliability labels them (suffix decoding: long or short matches, in the
    # request's own text or in earlier responses); "" is a drafter's only kind. A kind reads
    # "source:detail" ("request:long"): a kind first drafted starts from what its source's other
    # kinds showed in the request (engine/request.py's Estimates).
    kind: str = ""
    # Nodes deeper than this were guessed past the text the drafter matched (suffix decoding's
    # drafts longer than their match); their estimates are calibrated apart (node_groups).
    past_match: int | None = None
    # A chain the drafter already stopped where the policy's `Budget.worth` said (a draft model's
    # confidence stops): the policy verifies it whole; its node_probs still calibrate its kind.
    sized: bool = False

    def __post_init__(self) -> None:
        if self.parents is not None:
            if len(self.parents) != len(self.tokens) or any(not -1 <= p < i for i, p in enumerate(self.parents)):
                raise ValueError(f"a tree draft needs one parent per token, each -1 or an earlier node: {self.parents}")
            if self.node_probs is not None and len(self.node_probs) != len(self.tokens):
                raise ValueError("a tree draft needs one node probability per token")

    def first(self, n: int) -> "Draft":
        """The draft's first n tokens (a tree's first n nodes: a tree too)."""
        cut = lambda xs: None if xs is None else xs[:n]  # noqa: E731
        return Draft(self.tokens[:n], cut(self.probs), parents=cut(self.parents), node_probs=cut(self.node_probs), kind=self.kind,
                     past_match=self.past_match, sized=self.sized)

    @property
    def depth(self) -> int:
        """Tokens on the draft's longest path: a chain's length, a tree's depth."""
        if self.parents is None:  # asked at every step's commit: a chain's depth without its nodes' list
            return len(self.tokens)
        return max(self.node_depths(), default=0)

    def node_depths(self) -> list[int]:
        """Each node's depth (1: a child of the root). Example: parents [-1, 0, 0, -1] -> [1, 2, 2, 1]."""
        if self.parents is None:
            return list(range(1, len(self.tokens) + 1))
        depths: list[int] = []
        for p in self.parents:
            depths.append(1 + (depths[p] if p >= 0 else 0))
        return depths

    def subset(self, nodes: list[int]) -> "Draft":
        """The draft of the given nodes (ascending; each one's parent among them), parents renumbered.
        Example: parents [-1, 0, -1, 2, 1], nodes [0, 1, 4] -> parents [-1, 0, 1]."""
        at = {old: new for new, old in enumerate(nodes)}
        if self.parents is None:
            if nodes != list(range(len(nodes))):
                raise ValueError(f"a chain's subset is a prefix, not {nodes}")
            parents = None
        else:
            if any(self.parents[i] >= 0 and self.parents[i] not in at for i in nodes):
                raise ValueError(f"nodes {nodes} leave out a parent of one of them")
            parents = [at[self.parents[i]] if self.parents[i] >= 0 else -1 for i in nodes]
        pick = lambda xs: None if xs is None else [xs[i] for i in nodes]  # noqa: E731
        probs = None if self.probs is None else self.probs[nodes]
        return Draft([self.tokens[i] for i in nodes], probs, parents=parents, node_probs=pick(self.node_probs), kind=self.kind,
                     past_match=self.past_match)

    def node_groups(self) -> list[str]:
        """Each node's calibration group in the k policy: "past" (deeper than `past_match`), else
        "main" (on the main path) or "branch". Example: parents [-1, 0, 0, 1], past_match 2 ->
        ["main", "main", "branch", "past"]."""
        depths = self.node_depths()
        return ["past" if self.past_match is not None and d > self.past_match else "main" if m else "branch"
                for d, m in zip(depths, self.main_path())]

    def main_path(self) -> list[bool]:
        """For each node: on the tree's main path (from the root, each node's first child, the
        likeliest: nodes are best first) or on a branch off it. A chain: all True.
        Example: parents [-1, 0, 0, -1, 3] -> [True, True, False, False, False]."""
        if self.parents is None:
            return [True] * len(self.tokens)
        main, at = [False] * len(self.tokens), -1  # at: the main path's deepest node so far
        for i, p in enumerate(self.parents):  # a node's first child comes after it, before any other child
            if p == at:
                main[i], at = True, i
        return main

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class SequenceView:
    """What a drafter may read of one request. `tokens` is prompt + output so far (the last one
    not yet seen by the target)."""

    request_id: int
    tokens: list[int]
    num_prompt_tokens: int
    params: "SamplingParams"
    generator: torch.Generator | None
    capacity: int  # positions a drafter's own cache needs at most
    extra: dict = field(default_factory=dict)
    # For drafters that name `target_states` (EAGLE): the target's states of the positions it kept
    # since the drafter last consumed them, in order, each [n, state_width]; the first pending one
    # is at position `states_start` + (states consumed so far). A prefix-cached prompt part has none.
    states: list[torch.Tensor] = field(default_factory=list)
    states_start: int = 0


@dataclass(slots=True)
class Budget:
    """What the policy lets a drafter propose at one step (engine/policy.py's `budget`).

    Example: depth 6, nodes 0, pays("request:long") == 4: a chain of at most 6 tokens; a drafter
    whose tokens cost drafts 4 of the kind it is about to draft, a free one drafts up to 6 and the
    policy keeps what its kind's estimate or its probabilities pay for."""

    depth: int  # the longest draft (a tree: its deepest path) the step may verify; 0: no draft
    nodes: int = 0  # a tree's most nodes; 0: chains only (trees off, or the request processes logits)
    pays: Callable[[str], int] = lambda kind: 0  # draft tokens of this kind that pay now (at most depth)
    # worth(kind, path_probs): whether a chain's last node, drafted with these path probabilities
    # (the drafter's own: each node's chance that it and every node before it are accepted), still
    # adds to the step's tokens per unit of cost: a drafter whose tokens cost stops drafting there
    worth: Callable[[str, list[float]], bool] = lambda kind, probs: True

    @classmethod
    def chain(cls, k: int, worth: Callable[[str, list[float]], bool] | None = None) -> "Budget":
        """A chain of up to k tokens, whatever the kind (a drafter driving another), with the
        driver's `worth` where it has one."""
        return cls(k, 0, lambda kind: k, worth or (lambda kind, probs: True))


class Proposer:
    """The base of every drafter: its declared capabilities (class attributes), and the verbs.

    A subclass sets what it can do on its class; the defaults declare a chain drafter whose drafts
    are free, of one kind (""), and read nothing of the target but its tokens."""

    name: ClassVar[str] = ""
    relative_cost: float = 0.0  # a draft token's cost in one-token target forwards (the k policy's)
    proposes_trees: ClassVar[bool] = False  # may return token trees when the budget allows nodes
    # the target's states it reads: layer ids (residual streams entering them) or "final"; None: none
    target_states: tuple[int, ...] | str | None = None
    # sources of its kinds that every request draws from (suffix decoding's earlier responses): the
    # decoder keeps one acceptance estimate per such kind for all requests (never drafted for a
    # seeded sampled request, whose k choices must not depend on other requests)
    shared_sources: ClassVar[frozenset[str]] = frozenset()
    runner: "ModelRunner | None" = None  # its own model's runner, if it has one (cache statistics)
    # what SpeculativeConfig.draft_model names for it: "" nothing, "model" a model sharing the
    # target's vocabulary (required), "head" an EAGLE head folder (default: the bundled head),
    # "drafter" the model or head of another drafter it drives (the hybrid's hybrid_drafter)
    draft_model_kind: ClassVar[str] = ""
    # named option sets of its SpeculativeConfig that the bench runs as methods "<name>_<variant>"
    variants: ClassVar[dict[str, dict]] = {}

    @property
    def memory_bytes(self) -> int:
        """Memory its state shared by all requests holds (suffix decoding's earlier responses)."""
        return 0

    @property
    def cached_tokens(self) -> int:
        """Tokens in that shared state."""
        return 0

    @classmethod
    def ready_for(cls, target: "ModelRunner") -> bool:
        """Whether it drafts for `target` with nothing given beside the target (no draft model, no
        head folder): what the demo offers by default."""
        return cls.draft_model_kind == ""

    def kind_cost(self, kind: str) -> float:
        """A draft token's cost for drafts of `kind` (a hybrid's kinds cost differently)."""
        return self.relative_cost

    def kind_probes(self, kind: str) -> bool:
        """Whether the policy may probe drafts of `kind` after they stopped paying: not where a
        probe costs a catch-up (a draft model feeding its cache the tokens it missed meanwhile)."""
        return True

    def begin(self, seq: SequenceView) -> None:
        """A new request; `seq.tokens` is its prompt."""

    def propose(self, seq: SequenceView, budget: Budget) -> Draft:
        """A draft continuing `seq.tokens` within `budget` (fewer tokens, even none, is allowed): a
        chain, or with `proposes_trees` and `budget.nodes` > 0 a tree with `parents` and
        `node_probs` both set (a tree lacking node_probs is not verified)."""
        raise NotImplementedError

    def propose_batch(self, seqs: list[SequenceView], budgets: list[Budget]) -> list[Draft]:
        """`propose` for every request of a running batch at once (a draft model drafts for all of
        them in one forward per draft position); by default one request after another."""
        return [self.propose(seq, budget) for seq, budget in zip(seqs, budgets)]

    def accept(self, seq: SequenceView, num_accepted: int) -> None:
        """The target kept the first `num_accepted` tokens of the last draft (of a tree: the
        accepted path's length)."""

    def end(self, seq: SequenceView) -> None:
        """The request finished: free what it holds."""


PROPOSERS: dict[str, type[Proposer]] = {}  # method name -> drafter class (its `create` builds one)


def register(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        cls.name = name
        PROPOSERS[name] = cls
        return cls

    return wrap


def create_proposer(config: "SpeculativeConfig", target: "ModelRunner") -> Proposer:
    """The drafter `config.method` names (importing verispec.proposers registers the built-in ones)."""
    cls = PROPOSERS.get(config.method or "")
    if cls is None:
        raise InvalidSpeculativeConfigError(
            f"unknown speculative method {config.method!r}; known: {', '.join(sorted(PROPOSERS))}"
        )
    if cls.draft_model_kind == "model" and not config.draft_model:
        raise InvalidSpeculativeConfigError(f"method {config.method} needs draft_model=<name or path>")
    return cls.create(config, target)  # type: ignore[attr-defined]
