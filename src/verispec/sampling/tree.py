"""Verify a token tree against the target: which path to keep, and the token after it.

A pure function over tensors for one request (trees differ per request), the tree counterpart of
rejection.py's chains. A draft tree has n nodes: node i holds draft token tokens[i] and hangs
below parents[i] (-1: below the root, the pending token). The target scored the root and every
node in one forward, each attending only to its ancestors: row 0 of target_* is the root's
distribution (what follows the pending token), row i + 1 node i's.

Terms, as in rejection.py:
- *accepted* nodes: the path from the root the verifier keeps, one child per level;
- *recovered* token: where none of the current node's children is accepted, a token drawn from
  what is left of the current distribution after every child was tried;
- *bonus* token: where the path reaches a leaf, a token drawn from the leaf's distribution.

Sampling (multi-candidate rejection sampling: SpecInfer, Miao et al. 2024; recursive rejection
sampling, Jeon et al. 2024). At the current node, p = its target distribution; its children are
tried in order. Child j with draft distribution q_j (one-hot at its token for a deterministic
drafter) is accepted with probability min(1, p(x_j) / q_j(x_j)); if it is rejected, p becomes
normalise(max(0, p - q_j)) before the next child is tried. The token emitted at each step is
then distributed exactly as the target's (for one-hot drafts this is sampling without
replacement: a rejected sibling's token is removed from p and the rest renormalised). Children
with soft drafts must be independent draws from q_j.

Worked example, one-hot drafts: root children [5, 9], p = {5: 0.2, 9: 0.5, 7: 0.3}. Try 5:
accept with probability 0.2. If rejected, p = {9: 0.625, 7: 0.375}; try 9: accept with
probability 0.625, else the recovered token is 7. Overall: 5 w.p. 0.2, 9 w.p. 0.8 * 0.625 = 0.5,
7 w.p. 0.3: the target's distribution.

Greedy (`greedy_tree_verify`): follow the child whose token is the target's argmax at the
current node, while there is one; then emit the argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TreeVerifyOutput:
    path: list[int]  # accepted node indices, root to leaf (empty: no draft kept)
    tokens: list[int]  # the accepted nodes' tokens, then the recovered or bonus token


def children_of(parents: list[int]) -> list[list[int]]:
    """children[r + 1] = the nodes below node r (r = -1: the root), in node order."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i}: parent {p} must be -1 (the root) or an earlier node")
        kids[p + 1].append(i)
    return kids


def greedy_tree_verify(
    target_argmax: list[int] | torch.Tensor,  # [n+1]: the target's argmax at the root and at each node
    tokens: list[int],  # [n] draft tokens
    parents: list[int],  # [n] parent of each node, -1 = the root
) -> TreeVerifyOutput:
    """The longest path whose tokens are each the target's argmax after their parent."""
    kids = children_of(parents)
    argmax = target_argmax.tolist() if isinstance(target_argmax, torch.Tensor) else target_argmax
    path: list[int] = []
    row = 0  # the current node's row: 0 = root, i + 1 = node i
    while True:
        nxt = next((c for c in kids[row] if tokens[c] == argmax[row]), None)
        if nxt is None:
            return TreeVerifyOutput(path, [tokens[i] for i in path] + [argmax[row]])
        path.append(nxt)
        row = nxt + 1


def tree_rejection_sample(
    target_probs: torch.Tensor,  # [n+1, vocab] processed target distributions, root then nodes
    tokens: list[int],  # [n] draft tokens
    parents: list[int],  # [n] parent of each node, -1 = the root
    draft_probs: torch.Tensor | None = None,  # [n, vocab] each node's draft distribution; None: one-hot
    generator: torch.Generator | None = None,
) -> TreeVerifyOutput:
    """Keep a path by multi-candidate rejection sampling, then draw the recovered or bonus token.
    Per tried child one acceptance uniform is drawn, in tree order; then the final token."""
    n = len(tokens)
    if target_probs.dim() != 2 or target_probs.shape[0] != n + 1:
        raise ValueError(f"target_probs must be [n+1, vocab] = [{n + 1}, vocab], got {tuple(target_probs.shape)}")
    if draft_probs is not None and tuple(draft_probs.shape) != (n, target_probs.shape[1]):
        raise ValueError(f"draft_probs must be [n, vocab] = [{n}, {target_probs.shape[1]}], got {tuple(draft_probs.shape)}")
    kids = children_of(parents)
    path: list[int] = []
    row = 0
    while True:
        p = target_probs[row].double()
        moved = False
        for c in kids[row]:
            x = tokens[c]
            q = _draft(draft_probs, c, x, p)
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            if u * float(q[x]) < float(p[x]):  # accept with probability min(1, p(x) / q(x))
                path.append(c)
                row = c + 1
                moved = True
                break
            p = _residual(p, q)
        if not moved:
            token = int(torch.multinomial(p.float(), 1, generator=generator))
            return TreeVerifyOutput(path, [tokens[i] for i in path] + [token])


def _draft(draft_probs: torch.Tensor | None, node: int, token: int, like: torch.Tensor) -> torch.Tensor:
    if draft_probs is not None:
        return draft_probs[node].double()
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalise(max(0, p - q)); p itself where nothing is left (p <= q everywhere: p == q, where
    rejection cannot happen but round-off could get here)."""
    r = (p - q).clamp_min(0.0)
    mass = float(r.sum())
    return r / mass if mass > 0 else p
