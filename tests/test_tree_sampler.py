"""The token-tree verifier (sampling/tree.py): a greedy table, the chain as a degenerate tree, and
chi-square tests that multi-candidate rejection sampling emits the target's distribution, with
broken variants that must fail (the recipe of ../shared/NOTES.md, extended to siblings)."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from verispec.sampling import tree
from verispec.sampling.rejection import greedy_accept
from verispec.sampling.tree import children_of, greedy_tree_verify, tree_rejection_sample

V = 16
N = 30_000
#         node: 0  1  2  3  4  5
TOKENS = [3, 5, 9, 1, 2, 7]  # root children 3, 5, 9 (nodes 0-2); below node 0: 1, 2; below node 1: 7
PARENTS = [-1, -1, -1, 0, 0, 1]


def dist(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(V, generator=g) ** 3 + 0.01  # uneven, every token >= ~0.2%
    return p / p.sum()


def target_rows() -> torch.Tensor:  # [n+1, V]; the root favours node 0's token (3), so its branch is tested too
    rows = torch.stack([dist(s) for s in range(len(TOKENS) + 1)])
    rows[0, 3] += 0.6
    return rows / rows.sum(-1, keepdim=True)


def test_greedy_table():
    # argmax at the root, node 0 .. node 5
    cases = [
        ([3, 2, 0, 0, 0, 0, 0], [0, 4], [3, 2, 0]),  # root -> node 0 (3), node 0 -> node 4 (2), then node 4's argmax
        ([5, 0, 7, 0, 0, 0, 4], [1, 5], [5, 7, 4]),  # the second sibling's branch to its leaf, then the bonus
        ([9, 0, 0, 8, 0, 0, 0], [2], [9, 8]),  # a leaf at depth 1: its argmax is the bonus
        ([4, 0, 0, 0, 0, 0, 0], [], [4]),  # no child agrees: the root's argmax
    ]
    for argmax, path, tokens in cases:
        out = greedy_tree_verify(torch.tensor(argmax), TOKENS, PARENTS)
        assert (out.path, out.tokens) == (path, tokens)


def test_a_chain_is_the_degenerate_tree():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        k = int(torch.randint(1, 6, (1,), generator=g))
        drafts = torch.randint(0, 4, (k,), generator=g).tolist()
        argmax = torch.randint(0, 4, (k + 1,), generator=g)
        n = greedy_accept(argmax.tolist(), drafts)
        out = greedy_tree_verify(argmax, drafts, list(range(-1, k - 1)))
        assert len(out.path) == n
        assert out.tokens == argmax.tolist()[: n + 1]


def test_bad_trees_are_refused():
    with pytest.raises(ValueError, match="parent"):
        children_of([-1, 2, 0])
    with pytest.raises(ValueError, match="target_probs"):
        tree_rejection_sample(torch.rand(3, V), TOKENS, PARENTS)


def emitted(draws: int, soft: bool = False, seed: int = 0):
    """Counts of the first emitted token, and of the second given the first was node 0's token."""
    probs = target_rows()
    q_root = dist(100)
    g = torch.Generator().manual_seed(seed)
    first = np.zeros(V)
    second = np.zeros(V)
    for _ in range(draws):
        tokens, draft = TOKENS, None
        if soft:  # the root's three children drawn independently from q_root (repeats allowed)
            picks = torch.multinomial(q_root, 3, replacement=True, generator=g).tolist()
            tokens = picks + TOKENS[3:]
            draft = torch.stack([q_root] * 3 + [torch.nn.functional.one_hot(torch.tensor(t), V).float() for t in TOKENS[3:]])
        out = tree_rejection_sample(probs, tokens, PARENTS, draft, generator=g)
        first[out.tokens[0]] += 1
        if out.path[:1] == [0] and len(out.tokens) > 1:
            second[out.tokens[1]] += 1
    return first, second


def p_value(counts: np.ndarray, p: torch.Tensor) -> float:
    p = p.double().numpy()
    expected = p / p.sum() * counts.sum()
    return chisquare(counts, expected).pvalue


@pytest.mark.parametrize("soft", [False, True], ids=["one-hot", "soft"])
def test_emits_the_target_distribution(soft):
    first, second = emitted(N, soft)
    probs = target_rows()
    assert p_value(first, probs[0]) > 1e-6
    if not soft:  # the path through node 0 continues from node 0's distribution
        assert second.sum() > 1000
        assert p_value(second, probs[1]) > 1e-6


@pytest.mark.parametrize("broken", ["siblings_without_renormalising", "residual_unnormalised", "never_remove_sibling"])
def test_broken_samplers_fail(monkeypatch, broken):
    if broken == "siblings_without_renormalising":  # later siblings tried against the untouched p
        monkeypatch.setattr(tree, "_residual", lambda p, q: p)
    elif broken == "residual_unnormalised":  # the rejected sibling removed, the rest not rescaled
        monkeypatch.setattr(tree, "_residual", lambda p, q: (p - q).clamp_min(0.0))
    else:  # the rejected sibling's mass halved instead of removed
        monkeypatch.setattr(tree, "_residual", lambda p, q: (p - q / 2 * p).clamp_min(0.0) / (p - q / 2 * p).clamp_min(0.0).sum())
    first, _ = emitted(N)
    assert p_value(first, target_rows()[0]) < 1e-6
