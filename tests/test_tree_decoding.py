"""Token trees through the engine (issue 15): suffix decoding's trees are verified in one forward
and their accepted path kept. Greedy output is identical to plain decoding; sampled output keeps
the target's distribution (chi-square on the token a tree's root verifies, with siblings drafted
at it), and a sampler that does not renormalise after a rejected sibling is caught. Also the
policy's tree sizing and the suffix tree's construction."""

import dataclasses
import random

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from verispec import LLM, SamplingParams
from verispec.engine.policy import AcceptanceEstimate, SpeculationPolicy
from verispec.engine.decoder import SpeculativeDecoder
from verispec.errors import InvalidSpeculativeConfigError
from verispec.proposers.base import Draft, Proposer, register
from verispec.proposers.suffix.index import _grow
from verispec.sampling import tree as tree_module
from verispec.sampling.processors import logits_to_probs

from test_lossless_greedy import prompts


def test_grow_builds_best_first_trees():
    c = _grow([[5, 6], [5, 6], [5, 7], [9, 1]], depth=2, max_nodes=10, min_token_prob=0.0, match_len=2)
    # at 0.25: 9 and 9-1 (the most recent occurrence, the last row) before 5-7
    assert c.tokens == [5, 6, 9, 1, 7] and c.parents == [-1, 0, -1, 2, 0]
    assert c.probs == [0.75, 0.5, 0.25, 0.25, 0.25] and c.score == pytest.approx(2.0)
    assert _grow([[5, 6], [5, 6], [5, 7], [9, 1]], 2, 2, 0.0, 2).tokens == [5, 6]  # the best 2 nodes
    assert _grow([[5, 6], [5, 6], [5, 7], [9, 1]], 2, 10, 0.3, 2).tokens == [5, 6]  # the rest below 0.3
    tree = Draft(c.tokens, parents=c.parents, node_probs=c.probs)
    assert tree.main_path() == [True, True, False, False, False]
    assert Draft([1, 2, 3], parents=[-1, -1, 1]).main_path() == [True, False, False]
    assert tree.first(3).parents == [-1, 0, -1] and tree.first(3).node_probs == [0.75, 0.5, 0.25]
    with pytest.raises(ValueError, match="earlier node"):
        Draft([5, 6], parents=[-1, 1])


def tree_nodes(policy, node_probs, estimate, batch_size, groups=None) -> int:
    """How many of a tree's first nodes the policy verifies as a tree (no main path to prefer as a chain)."""
    return policy.tree_shape(node_probs, estimate, batch_size, groups, main=[False] * len(node_probs))[0]


def test_tree_size_weighs_nodes_against_the_cost_curve():
    policy = SpeculationPolicy(4, cost=lambda n: 1 + 0.15 * (n - 1))
    assert tree_nodes(policy, [0.9, 0.6, 0.3, 0.1], AcceptanceEstimate(), 1) == 2  # the module's example
    assert tree_nodes(policy, [0.99] * 8, AcceptanceEstimate(), 1) == 8  # sure nodes: all of them
    steep = SpeculationPolicy(4, cost=lambda n: float(n), probe_every=1000)  # every row costs a forward
    assert tree_nodes(steep, [0.9, 0.6], AcceptanceEstimate(), 1) == 0
    doubtful = AcceptanceEstimate()
    for _ in range(30):  # trees whose nodes were never accepted: calibration falls, trees shrink
        doubtful.observe_tree([0.9, 0.6, 0.3], ["main", "main", "branch"], [])
    assert doubtful.calibration < 0.05 and doubtful.calibration_of("branch") < 0.05
    siblings_fail = AcceptanceEstimate()
    for _ in range(30):  # the main path always accepted, the branch never: only branches shrink
        siblings_fail.observe_tree([0.6, 0.4], ["main", "branch"], [0])
    assert siblings_fail.calibration > 1.4 and siblings_fail.calibration_of("branch") < 0.05
    chain_only = SpeculationPolicy(4, cost=lambda n: 1 + 0.1 * (n - 1))
    assert tree_nodes(chain_only, [0.6, 0.4], siblings_fail, 1, ["main", "branch"]) == 1  # the sibling left out
    assert tree_nodes(chain_only, [0.6, 0.4], AcceptanceEstimate(), 1, ["main", "branch"]) == 2
    assert tree_nodes(SpeculationPolicy(4, cost=lambda n: 1 + 0.15 * (n - 1), probe_every=1000), [0.9, 0.6, 0.3], doubtful, 1) == 0
    assert tree_nodes(SpeculationPolicy(4, adaptive=False), [0.1] * 5, doubtful, 1) == 5
    assert tree_nodes(SpeculationPolicy(4, disable_by_batch_size=2), [0.9], AcceptanceEstimate(), 3) == 0


def test_tree_shape_verifies_a_main_path_that_pays_as_a_chain():
    """A tree whose best first nodes are all on its main path is verified as a chain (which may
    stop early); a tree whose branch pays stays a tree; probes and a fixed k as before."""
    policy = SpeculationPolicy(4, cost=lambda n: 1 + 0.15 * (n - 1), probe_every=2)
    fresh = AcceptanceEstimate()
    assert policy.tree_shape([0.9, 0.6, 0.3], fresh, 1, ["main", "main", "branch"], [True, True, False]) == (2, True)  # the docstring's example
    assert policy.tree_shape([0.9, 0.8, 0.7], fresh, 1, ["main", "branch", "branch"], [True, False, False]) == (3, False)  # the siblings pay
    assert policy.tree_shape([0.9, 0.8, 0.7], fresh, 1) == (3, True)  # no main path given: a chain
    # early exit: rows 4.. in a second chunk, which runs only if the first three drafts pass
    chunked = SpeculationPolicy(4, cost=lambda n: [1.0, 1.05, 1.1, 2.1, 2.15][n - 1], chunks=lambda n: [min(n, 3)] + ([n - 3] if n > 3 else []))
    q = [0.95, 0.9, 0.3, 0.25]
    assert chunked._path_cost(q, early_exit=True) == pytest.approx(1.1 + 0.3 * 1.05)  # rows 4-5 run if drafts 1-3 pass
    assert chunked._path_cost(q, early_exit=False) == 2.15
    failing = AcceptanceEstimate()
    for _ in range(30):
        failing.observe_tree([0.9, 0.6], ["main", "main"], [])
    assert [policy.tree_shape([0.9, 0.6], failing, 1) for _ in range(2)] == [(0, True), (1, True)]  # a probe: one node
    assert SpeculationPolicy(4, adaptive=False).tree_shape([0.1] * 5, failing, 1) == (5, False)
    assert SpeculationPolicy(4, disable_by_batch_size=2).tree_shape([0.9], fresh, 3) == (0, False)


def test_a_tree_of_main_path_nodes_only_is_always_a_chain():
    """The tree's and the chain's expected tokens are summed alike, so a best tree that lies on the
    main path ties its chain exactly and goes to the chain (summed apart, 1,300 of these 20,000
    drafts were verified as trees by a last-bit difference)."""
    random.seed(1)
    policy = SpeculationPolicy(8, cost=lambda n: 1 + 0.137 * (n - 1) ** 1.1)
    for _ in range(20000):
        nodes = sorted((random.random() for _ in range(random.randint(1, 8))), reverse=True)
        k, as_chain = policy.tree_shape(nodes, AcceptanceEstimate(), 1)
        assert as_chain or k == 0, nodes


def test_nodes_past_the_match_are_calibrated_apart():
    """Nodes a drafter guessed past its match (Draft.past_match) have a calibration of their own:
    where they fail and the matched nodes do not, the tree keeps the matched nodes at full weight
    and drops the guessed ones (one calibration for all would have cut both)."""
    tree = Draft([1, 2, 3, 4], parents=[-1, 0, 1, 2], node_probs=[0.9, 0.9, 0.8, 0.8], past_match=2)
    assert tree.node_groups() == ["main", "main", "past", "past"]
    assert Draft([1, 2, 3, 4], parents=[-1, 0, 0, 1], past_match=2).node_groups() == ["main", "main", "branch", "past"]
    estimate = AcceptanceEstimate()
    for _ in range(30):  # the two matched nodes accepted, the guessed ones never
        estimate.observe_tree(tree.node_probs, tree.node_groups(), [0, 1])
    assert estimate.calibration_of("main") > 1.0 and estimate.calibration_of("past") < 0.05
    policy = SpeculationPolicy(4, cost=lambda n: 1 + 0.15 * (n - 1))
    assert policy.tree_shape(tree.node_probs, estimate, 1, tree.node_groups(), tree.main_path()) == (2, True)
    pooled = AcceptanceEstimate()
    for _ in range(30):  # the same trees with every node in one group: 2 of 3.4 accepted
        pooled.observe_tree(tree.node_probs, ["main"] * 4, [0, 1])
    assert pooled.calibration == pytest.approx(2 / 3.4, rel=0.05)
    assert policy.tree_shape(tree.node_probs, pooled, 1) == (4, True)  # the guessed nodes look as good as the rest


def test_draft_subsets_renumber_parents():
    tree = Draft([1, 2, 3, 4, 5], parents=[-1, 0, -1, 2, 1], node_probs=[0.5, 0.4, 0.3, 0.2, 0.1], kind="request:short")
    assert tree.node_depths() == [1, 2, 1, 2, 3] and tree.depth == 3
    sub = tree.subset([0, 1, 4])
    assert (sub.tokens, sub.parents, sub.node_probs, sub.kind) == ([1, 2, 5], [-1, 0, 1], [0.5, 0.4, 0.1], "request:short")
    with pytest.raises(ValueError, match="parent"):
        tree.subset([0, 3])
    assert Draft([7, 8]).node_depths() == [1, 2]


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def family(request, tiny_dir):
    target = tiny_dir(request.param, seed=0)
    ps = prompts(12)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    ref = [o.token_ids for o in LLM(str(target)).generate(ps, params)]
    return target, ps, params, ref


@pytest.mark.parametrize("k, nodes, adaptive", [(4, 8, False), (8, 16, False), (8, 16, True)])
def test_greedy_trees_identical_to_plain(family, k, nodes, adaptive, monkeypatch):
    target, ps, params, ref = family
    llm = LLM(str(target), speculative={"method": "suffix", "num_speculative_tokens": k, "tree_max_nodes": nodes,
                                        "adaptive_k": adaptive})
    trees = []  # the trees verified (after the policy's sizing)
    real = SpeculativeDecoder._accept_tree
    monkeypatch.setattr(SpeculativeDecoder, "_accept_tree", lambda self, req, logits, draft: trees.append(draft) or real(self, req, logits, draft))
    chains = []  # main paths verified as chains
    verify = SpeculativeDecoder._verify
    monkeypatch.setattr(SpeculativeDecoder, "_verify", lambda self, reqs, drafts: chains.extend(
        d for d in drafts if d.parents is None and d.node_probs is not None) or verify(self, reqs, drafts))
    outs = llm.generate(ps, params)
    assert [o.token_ids for o in outs] == ref
    branched = [t for t in trees if not all(t.main_path())]
    assert branched, "no tree with a branch was verified: the test would not exercise trees"
    assert max(len(t.tokens) for t in trees) <= nodes
    if adaptive:  # steps whose best tree is its main path verify it as a chain (SpeculationPolicy.tree_shape)
        assert chains, "no main path was verified as a chain"
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outs)
    assert 0 < accepted < drafted
    for o in outs:
        m = o.metrics
        assert len(o.token_ids) == 1 + (m.num_target_forwards - 1) + m.num_accepted_tokens


def test_greedy_tree_logprobs_identical_to_plain(family, monkeypatch):
    """Logprobs through token trees: each emitted token's row is its accepted path's, bit for bit."""
    target, ps, _, _ = family
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=3)
    flat = lambda outs: [[(lp.token_id, lp.logprob, lp.rank, lp.top) for lp in o.outputs[0].logprobs] for o in outs]  # noqa: E731
    ref = LLM(str(target)).generate(ps, params)
    llm = LLM(str(target), speculative={"method": "suffix", "num_speculative_tokens": 8, "tree_max_nodes": 16, "adaptive_k": False})
    kept = []  # accepted path lengths of the trees verified
    real = SpeculativeDecoder._accept_tree  # (tokens emitted: the accepted path and one more, path, distribution)
    monkeypatch.setattr(SpeculativeDecoder, "_accept_tree", lambda self, *a: kept.append(len((x := real(self, *a))[0])) or x)
    outs = llm.generate(ps, params)
    assert max(kept) > 2, "no tree kept a path of two drafts: the test would not exercise their rows"
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert flat(outs) == flat(ref)


def test_requests_that_process_logits_keep_chains(family):
    target, ps, _, _ = family
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, presence_penalty=0.5)
    ref = [o.token_ids for o in LLM(str(target)).generate(ps[:4], params)]
    llm = LLM(str(target), speculative={"method": "suffix", "num_speculative_tokens": 4, "tree_max_nodes": 8})
    assert [o.token_ids for o in llm.generate(ps[:4], params)] == ref


def test_trees_need_a_branching_drafter_and_a_backend_that_verifies_them(tiny_dir):
    with pytest.raises(InvalidSpeculativeConfigError, match="proposes token trees"):
        LLM(str(tiny_dir("llama", seed=0)), speculative={"method": "prompt_lookup", "tree_max_nodes": 8})
    llm = LLM(str(tiny_dir("llama", seed=0)), speculative={"method": "suffix"})
    runner, proposer = llm.runner, llm.engine.proposer
    runner.capabilities = dataclasses.replace(runner.capabilities, trees=False)  # as the llama.cpp backend's
    with pytest.raises(InvalidSpeculativeConfigError, match="does not verify token trees"):
        SpeculativeDecoder(runner, proposer, 4, tree_nodes=8)
    with pytest.raises(InvalidSpeculativeConfigError, match="tree_max_nodes must be in 0..32"):
        LLM(str(tiny_dir("llama", seed=0)), speculative={"method": "suffix", "tree_max_nodes": 33})


# -- sampling ------------------------------------------------------------------------------------
PROMPT = [1, 20, 21, 22, 20, 21]
TEMP = 0.5
SIBLINGS: list[int] = []  # the root's children: the target's likeliest tokens (set by the fixture)


@register("test_fixed_tree")
class FixedTree(Proposer):
    """A test drafter: at every step a tree whose root children are SIBLINGS (each with two
    children of its own), one-hot, so the token after the pending one is verified against several
    candidates at once."""

    proposes_trees = True

    @classmethod
    def create(cls, config, target):
        return cls()

    def propose(self, seq, budget):
        if not budget.nodes:
            return Draft(tokens=[])
        max_depth, max_nodes = budget.depth, budget.nodes
        tokens, parents = list(SIBLINGS), [-1] * len(SIBLINGS)
        if max_depth > 1:
            for i, t in enumerate(SIBLINGS):
                tokens += [SIBLINGS[(i + 1) % len(SIBLINGS)], SIBLINGS[(i + 2) % len(SIBLINGS)]]
                parents += [i, i]
        tokens, parents = tokens[:max_nodes], parents[:max_nodes]
        return Draft(tokens, parents=parents, node_probs=[1.0] * len(tokens))

    def accept(self, seq, n):
        pass

    def end(self, seq):
        pass


def exact_second_token_distribution(runner):
    """P(t2) = sum over t1 of P(t1 | prompt) P(t2 | prompt, t1): the target's own, exactly."""
    seq = runner.open(len(PROMPT) + 2)
    p1 = logits_to_probs(runner.forward(seq, PROMPT, 1).logits, TEMP)[0].double()
    p2 = torch.zeros_like(p1)
    for t1 in range(p1.shape[0]):
        runner.truncate(seq, len(PROMPT))
        p2 += p1[t1] * logits_to_probs(runner.forward(seq, [t1], 1).logits, TEMP)[0].double()
    runner.close(seq)
    return p2.numpy()


@pytest.fixture(scope="module")
def tree_llm(tiny_dir):
    llm = LLM(str(tiny_dir("llama", seed=0)), speculative={"method": "test_fixed_tree", "num_speculative_tokens": 2,
                                                          "tree_max_nodes": 9, "adaptive_k": False})
    p2 = exact_second_token_distribution(llm.runner)
    SIBLINGS[:] = np.argsort(-p2)[:3].tolist()  # three likely tokens: acceptance and rejection both happen
    return llm, p2


def second_token_pvalue(llm, exact, n):
    counts = np.zeros_like(exact)
    accepted = drafted = 0
    for s in range(n):
        out = llm.generate([PROMPT], SamplingParams(temperature=TEMP, seed=s, max_tokens=3, ignore_eos=True))[0]
        counts[out.token_ids[1]] += 1
        accepted += out.metrics.num_accepted_tokens
        drafted += out.metrics.num_draft_tokens
    assert 0 < accepted < drafted
    big = exact * n >= 10
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(exact[big] * n, exact[~big].sum() * n)
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def test_sampled_trees_keep_the_target_distribution(tree_llm):
    llm, exact = tree_llm
    assert second_token_pvalue(llm, exact, 3000) > 1e-6


def test_a_sampler_that_does_not_renormalise_siblings_is_caught(tree_llm, monkeypatch):
    """Negative control: after a rejected sibling, try the next against the same p (its token's
    mass not removed): the rejected token's probability leaks to the later siblings."""
    llm, exact = tree_llm
    monkeypatch.setattr(tree_module, "_residual", lambda p, q: p)
    assert second_token_pvalue(llm, exact, 3000) < 1e-6
