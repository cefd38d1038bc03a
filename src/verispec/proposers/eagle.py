"""EAGLE drafting: a one-layer head reads the target's hidden states and drafts a chain.

The decoder asks the target for the states this drafter names (`target_states`: the residual
streams entering three layers for EAGLE-3, the final hidden state for EAGLE-1/2) on every row it
forwards, and appends those of the rows it kept to `SequenceView.states`. The head keeps its own
KV cache per request: "real" rows (the target's states) stay; draft rows are cut off at the next
`propose`, which first feeds the new real rows and then drafts.

Example, k = 3: tokens t0..t9 (t9 pending), the head's cache holds real rows 0..7. The target
states of position 8 arrived with the last step. propose: row 8 = (state 8, token t9) -> d1;
row 9 = (its own output at 8, d1) -> d2; row 10 = (output at 9, d2) -> d3. The next propose cuts
the cache back to rows 0..8 and feeds the states of the positions the target kept.

Greedy requests take each row's argmax; sampled ones draw from the request's temperature, top-k
and top-p over the head's logits (tokens outside the draft vocabulary have probability 0), and that
distribution is the q the verifier sees, so the output stays the target's.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from verispec.errors import ContextLengthError, IncompatibleDraftError, InvalidSpeculativeConfigError
from verispec.models.heads.eagle import EagleHead, default_aux_layers
from verispec.models.heads.eagle_io import load_head
from verispec.models.decoder.kv_cache import KVCache
from verispec.proposers.base import Budget, Draft, Proposer, SequenceView, register
from verispec.sampling.processors import logits_to_probs, sample_from_probs

HEADS_DIR = Path(__file__).resolve().parent.parent / "heads"  # heads trained for the bundled models


def target_identity(target) -> str:
    """What a bundled head's `verispec_target` must equal: the target's vocabulary and shape."""
    c = target.config
    return f"{target.vocab_fingerprint()}|layers={c.num_layers}|hidden={c.hidden_size}"


def bundled_head(target) -> Path:
    """The head trained for this target and shipped with verispec (heads/<model>/)."""
    identity = target_identity(target)
    for cfg in sorted(HEADS_DIR.glob("*/config.json")):
        if json.loads(cfg.read_text()).get("verispec_target") == identity:
            return cfg.parent
    raise InvalidSpeculativeConfigError(
        "method eagle3 needs draft_model=<EAGLE head folder>: verispec ships heads only for its bundled models "
        f"({', '.join(sorted(p.name for p in HEADS_DIR.glob('*/'))) or 'none yet'}); train one with "
        "`verispec train-draft`")


def has_bundled_head(target) -> bool:
    """Whether verispec ships a head for this target and its backend can serve it (eagle3 needs
    the target's hidden states: the torch backend)."""
    if not target.capabilities.hidden_states:
        return False
    try:
        bundled_head(target)
    except InvalidSpeculativeConfigError:
        return False
    return True


@dataclass
class _Seq:
    cache: KVCache
    offset: int  # the position of the head's cache row 0 (a prefix-cached prompt has no states before it)
    real: int  # rows of the cache holding the target's states; rows after them are drafts


# A tree's chain stops extending where the path's probability falls below this: a deeper
# node is at most that likely, and a verified row costs ~0.1-0.2 of a forward on the row-wise
# kernels' curve (runners/torch_runner.py's KERNEL_POINTS)
EXPAND_MIN = 0.2


@register("eagle3")
class EagleProposer(Proposer):
    proposes_trees = True  # the chain with each level's runner-up (trees need a runner that verifies them)
    draft_model_kind = "head"

    @classmethod
    def ready_for(cls, target) -> bool:
        """A head is bundled for this target and its runner returns hidden states."""
        return has_bundled_head(target)

    def __init__(self, head: EagleHead, target_states: tuple[int, ...] | str, relative_cost: float) -> None:
        self.head = head
        self.target_states = target_states  # what the decoder asks the target for: layers, or "final"
        self.relative_cost = relative_cost  # a head step over a one-token target forward, timed at creation
        self._seqs: dict[int, _Seq] = {}

    @classmethod
    def create(cls, config, target) -> "EagleProposer":
        if not target.capabilities.hidden_states:
            raise IncompatibleDraftError(
                f"method eagle3 reads the target's hidden states, which the {target.backend} backend "
                "cannot return; use --backend torch")
        path = config.draft_model or bundled_head(target)
        hc, weights = load_head(path, target.config.hidden_size, target.vocab_size)
        lm_head = None
        if hc.kind == "eagle1" and "lm_head.weight" not in weights:
            lm = target.model.lm_head
            lm_head = (lm.dequantize() if hasattr(lm, "dequantize") else lm).float()
        head = EagleHead(hc, weights, target.embed, lm_head, int8=target.weights_format == "gguf-int8")
        layers = hc.aux_layers or default_aux_layers(target.config.num_layers)
        if hc.kind == "eagle3" and max(layers) >= target.config.num_layers:
            raise IncompatibleDraftError(f"the head reads target layers {layers}; the target has {target.config.num_layers}")
        return cls(head, tuple(layers) if hc.kind == "eagle3" else "final", measure_relative_cost(head, target))

    def begin(self, seq: SequenceView) -> None:
        if seq.capacity > 1 << 20:
            raise ContextLengthError(f"{seq.capacity} positions are more than the EAGLE head's cache takes")
        self._seqs[seq.request_id] = _Seq(self.head.new_cache(seq.capacity), seq.states_start, 0)

    def _feed(self, seq: SequenceView) -> tuple[_Seq, torch.Tensor, torch.Tensor] | None:
        """The last draft's rows cut, the states the target kept since fed: (the request's state,
        the first draft's logits [1, dv] and pre-norm outputs [m, H]); None without new states."""
        st = self._seqs[seq.request_id]
        st.cache.truncate(st.real)  # the last draft's rows
        states = torch.cat(seq.states) if seq.states else None  # [m, state_width]
        seq.states.clear()
        if states is None or not states.shape[0]:
            return None
        first = st.offset + st.real  # the position of the first new state
        tokens = torch.tensor(seq.tokens[first + 1 : first + 1 + states.shape[0]], dtype=torch.int64)
        if tokens.shape[0] != states.shape[0]:
            raise RuntimeError(f"EAGLE states out of step: {states.shape[0]} states for {tokens.shape[0]} tokens")
        # [1, dv] (the last row's logits: the first draft token's), [m, H]
        logits, pre = self.head.forward(states, tokens, st.cache, fused=True, offset=st.offset, logit_rows=1)
        st.real += states.shape[0]
        return st, logits, pre

    def propose(self, seq: SequenceView, budget: Budget) -> Draft:
        """Every token costs a head step, so it drafts only on steps where a chain of its kind pays
        (elsewhere the target's states wait and are fed in one call at the next draft): that chain,
        or where the budget allows nodes, a tree as deep as the budget (`_tree`)."""
        k = budget.pays("")
        if k <= 0:
            return Draft(tokens=[])
        return self._tree(seq, budget.depth, budget.nodes) if budget.nodes else self._chain(seq, k)

    def _chain(self, seq: SequenceView, k: int) -> Draft:
        fed = self._feed(seq)
        if fed is None:
            return Draft(tokens=[])
        st, logits, pre = fed
        out: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            token = self._choose(seq, logits[-1], probs)
            out.append(token)
            if i + 1 < k:
                logits, pre = self.head.forward(pre[-1:], torch.tensor([token]), st.cache, fused=False, offset=st.offset)
        return Draft(tokens=out, probs=torch.stack(probs) if probs else None)

    def _tree(self, seq: SequenceView, max_depth: int, max_nodes: int) -> Draft:
        """The head's likeliest chain, up to max_depth deep, with each level's second choice beside
        it as a leaf (EAGLE-2's dynamic tree, kept to what needs no extra head step). Each node's
        probability is the product of the head's own probabilities along its path, so the decoder
        verifies the nodes the cost curve pays for (policy.tree_shape, with the request's measured
        calibration): a confident head drafts deep, an unsure one not at all. The chain stops
        growing where its path falls below EXPAND_MIN. The tokens are the head's argmax picks
        whatever the request's sampling: a deterministic tree (probs None), verified losslessly as
        suffix decoding's trees are."""
        fed = self._feed(seq)
        if fed is None or max_depth < 1 or max_nodes < 1:
            return Draft(tokens=[])
        st, logits, pre = fed
        tokens: list[int] = []
        parents: list[int] = []
        node_probs: list[float] = []
        path, parent = 1.0, -1  # the main chain's probability so far, its deepest node
        for depth in range(max_depth):
            top = torch.softmax(logits[-1].float(), -1).topk(2)  # the head's two likeliest at this level
            ids = self.head.to_target(top.indices).tolist()
            p1, p2 = top.values.tolist()
            for token, p in ((ids[0], p1), (ids[1], p2)):  # main child first: nodes stay best first under ties
                tokens.append(token)
                parents.append(parent)
                node_probs.append(path * p)
            parent, path = len(tokens) - 2, path * p1
            if depth + 1 == max_depth or path < EXPAND_MIN:
                break
            logits, pre = self.head.forward(pre[-1:], torch.tensor([ids[0]]), st.cache, fused=False, offset=st.offset)
        # best first (a child never beats its parent: parents stay before children), then the first max_nodes
        order = sorted(range(len(tokens)), key=lambda i: (-node_probs[i], i))[:max_nodes]
        where = {old: new for new, old in enumerate(order)}
        return Draft(tokens=[tokens[i] for i in order], parents=[-1 if parents[i] < 0 else where[parents[i]] for i in order],
                     node_probs=[node_probs[i] for i in order])

    def _choose(self, seq: SequenceView, row: torch.Tensor, probs: list[torch.Tensor]) -> int:
        """A draft token (target id) from one row of draft-vocabulary logits [dv]."""
        p = seq.params
        if p.greedy:
            return int(self.head.to_target(row.argmax()))
        full = row.new_full((self.head.config.vocab_size,), float("-inf"))
        full[self.head.target_ids] = row
        q = logits_to_probs(full[None], p.temperature, p.top_k, p.top_p)  # [1, vocab]: what we sample from
        probs.append(q[0])
        return int(sample_from_probs(q, seq.generator)[0])

    def accept(self, seq: SequenceView, num_accepted: int) -> None:
        """Nothing to do: the kept rows' states arrive through `seq.states` before the next propose."""

    def end(self, seq: SequenceView) -> None:
        self._seqs.pop(seq.request_id, None)


def measure_relative_cost(head: EagleHead, target, context: int = 64, repeats: int = 7) -> float:
    """One draft step of the head over a one-token decode of the target, timed here (medians)."""
    cache = head.new_cache(context + repeats + 1)
    width = head.config.state_width
    head.forward(torch.zeros(context, width), torch.zeros(context, dtype=torch.int64), cache, fused=True)
    pre = torch.zeros(1, head.config.hidden_size)
    head_times, target_times = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        head.forward(pre, torch.zeros(1, dtype=torch.int64), cache, fused=False)
        head_times.append(time.perf_counter() - t)
    seq = target.open(context + repeats)
    try:
        target.forward(seq, [0] * context)
        for _ in range(repeats):
            t = time.perf_counter()
            target.forward(seq, [0])
            target_times.append(time.perf_counter() - t)
    finally:
        target.close(seq)
    return statistics.median(head_times) / max(1e-9, statistics.median(target_times))
