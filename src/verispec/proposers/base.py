"""The one drafter protocol, and the registry that maps method names to drafters.

A drafter's lifecycle has four verbs (as llama.cpp's common/speculative.h): `begin` a request,
`propose` a draft, learn how much of it was `accept`ed, `end` the request. A new method is a new
file that registers a class; the engine never branches on method names.

Beyond chains:
- token trees: a drafter that can branch (`proposes_trees`) also has `propose_tree`, whose Draft
  has `parents` (None = a chain; a chain is the degenerate tree) and `node_probs`; the decoder
  sizes the tree by cost (engine/policy.py), verifies it in one forward and keeps one path;
- drafters that read the target's hidden states (EAGLE): a `target_states` attribute (layer ids
  whose input residual streams it reads, or "final" for the last hidden state); the decoder then
  hands it the states of every kept position through `SequenceView.states`;
- drafters with another tokenizer: they get token ids *and* the target's tokenizer through
  the view, and return target-vocabulary token ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar, Protocol

import torch

from verispec.errors import InvalidSpeculativeConfigError

if TYPE_CHECKING:
    from verispec.config import SamplingParams, SpeculativeConfig
    from verispec.engine.runner import ModelRunner


@dataclass
class Draft:
    tokens: list[int]  # [n] proposed token ids in the target's vocabulary, n <= k
    probs: torch.Tensor | None = None  # [n, vocab] processed draft distribution; None = deterministic
    parents: list[int] | None = None  # tree drafts: parent node of each token, -1 = the root (the pending token)
    # Each node's estimated probability of being accepted (the product of its path's estimates);
    # a tree's nodes listed best first with every parent before its children, so any first n nodes
    # are a tree: the decoder keeps the n the cost curve pays for. Trees always; chains from a
    # drafter with `sizes_by_node_probs`, which the decoder sizes the same way.
    node_probs: list[float] | None = None
    # Drafts of one kind share an acceptance estimate in the k policy (engine/policy.py). A drafter
    # whose drafts differ in reliability labels them (suffix decoding: long or short matches, in the
    # request's own text or in earlier responses) and sets `labels_drafts`: it is then asked for up
    # to the policy's largest k, and its draft cut to the k its kind's estimate pays for. A kind
    # reads "source:detail" ("request:long"): a kind first drafted starts from what its source's
    # other kinds showed in the request (SpeculativeDecoder._estimate).
    kind: str | None = None
    # Nodes deeper than this were guessed past the text the drafter matched (suffix decoding's
    # drafts longer than their match); their estimates are calibrated apart (node_groups).
    past_match: int | None = None

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
                     past_match=self.past_match)

    @property
    def depth(self) -> int:
        """Tokens on the draft's longest path: a chain's length, a tree's depth."""
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
    # For drafters that label their drafts: the k the policy pays for a draft of a kind at this
    # step (asked once per kind and step), so a drafter whose tokens cost can draft no more.
    k_for: Callable[[str], int] | None = None


class Proposer(Protocol):
    name: ClassVar[str]
    relative_cost: float  # cost of drafting one token, in one-token target forwards (for the k policy)
    labels_drafts: ClassVar[bool]  # its drafts carry a `kind` (optional: False where absent)
    # optional `kind_cost(kind) -> float`: a labelling drafter whose kinds cost differently (hybrid)
    proposes_trees: ClassVar[bool]  # it has propose_tree (optional: False where absent)
    # optional `sizes_by_node_probs`: a labelling drafter whose chains carry node_probs; the adaptive
    # policy then sizes each chain that carries them by them (calibrated per kind), not by its kind's rate
    # optional `shared_sources`: sources of a labelling drafter's kinds that every request draws from
    # (suffix decoding's earlier responses): the decoder keeps one acceptance estimate per such kind
    # for all requests (never drafted for a seeded sampled request, whose k choices must not depend
    # on other requests)

    def begin(self, seq: SequenceView) -> None:
        """A new request; `seq.tokens` is its prompt."""

    def propose(self, seq: SequenceView, k: int) -> Draft:
        """Up to k tokens continuing `seq.tokens` (fewer, even none, is allowed)."""

    def propose_tree(self, seq: SequenceView, max_depth: int, max_nodes: int) -> Draft:
        """(Drafters with `proposes_trees`.) A tree of up to max_nodes tokens, none deeper than
        max_depth, with `parents` and `node_probs` both set (see Draft; a chain is a tree whose
        parents are -1, 0, 1, ...), or an empty Draft. A draft lacking either is not verified."""

    def accept(self, seq: SequenceView, num_accepted: int) -> None:
        """The target kept the first `num_accepted` tokens of the last draft (of a tree: the
        accepted path's length)."""

    def end(self, seq: SequenceView) -> None:
        """The request finished: free what it holds."""


ProposerFactory = Callable[["SpeculativeConfig", "ModelRunner"], Proposer]
PROPOSERS: dict[str, ProposerFactory] = {}


def register(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        cls.name = name
        PROPOSERS[name] = cls.create  # type: ignore[attr-defined]
        return cls

    return wrap


def create_proposer(config: "SpeculativeConfig", target: "ModelRunner") -> Proposer:
    import verispec.proposers  # noqa: F401  (registers the built-in drafters)

    factory = PROPOSERS.get(config.method or "")
    if factory is None:
        raise InvalidSpeculativeConfigError(
            f"unknown speculative method {config.method!r}; known: {', '.join(sorted(PROPOSERS))}"
        )
    return factory(config, target)
