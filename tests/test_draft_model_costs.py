"""The draft model on its cheapest arithmetic: int8 activations and a head over the vocabulary's
first ids (the same logits those rows get from the whole head), confidence stops sized by the
policy, drafts for a running batch in one forward, and the output still plain decoding's."""

from __future__ import annotations

import pytest
import torch

from verispec import LLM, SamplingParams
from verispec.engine.policy import AcceptanceEstimate, SpeculationPolicy
from verispec.models.kernels import rowwise
from verispec.models.weights.synth import SIZES, write
from verispec.proposers.base import Budget, SequenceView

needs_kernels = pytest.mark.skipif(rowwise.kernel() is None, reason="the row-wise kernels do not build here")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """Two tiny GGUF models (vocabulary 512, Q4_K_M): a target and a draft of the same file."""
    folder = tmp_path_factory.mktemp("synth-draft")
    return write(folder / "tiny-q4_k_m.gguf", SIZES["tiny"], "q4_k_m", seed=3, progress=False)


@needs_kernels
@pytest.mark.parametrize("int8", [False, True])
def test_first_rows_share_the_blocks_and_give_those_rows(synthetic, int8):
    from verispec.models.weights.registry import load_model

    head = load_model(str(synthetic), blocks=True, int8=int8).weights["embed.weight"]
    full = head.dequantize()
    for n in (1, 16, 100, 512):
        part = head.first_rows(n)
        rows = part.shape[0]
        assert n <= rows < n + 16 and (rows == n or int8)  # tiles are cut at whole tiles only
        assert torch.equal(part.dequantize(), full[:rows])
        assert all(p.untyped_storage().data_ptr() == q.untyped_storage().data_ptr() for p, q in zip(part.parts, head.parts))
    x = torch.randn(3, head.shape[1])
    k = rowwise.kernel()
    assert torch.equal(k.weight_mm(x, head.first_rows(200).arg), k.weight_mm(x, head.arg)[:, : head.first_rows(200).shape[0]])


@needs_kernels
def test_the_drafter_takes_int8_and_the_first_ids_of_the_head(synthetic):
    from verispec.runners.registry import RunnerConfig, build_runner

    target = build_runner("torch", RunnerConfig(str(synthetic)))
    assert target.weights_format == "gguf" and target.batch_invariant
    whole = target.build_drafter(str(synthetic))
    cut = target.build_drafter(str(synthetic), head_rows=200)
    assert (whole.weights_format, whole.batch_invariant, whole.head_rows) == ("gguf-int8", False, 512)
    assert cut.weights_format == "gguf-int8" and 200 <= cut.head_rows < 216
    assert cut.cost_identity() != whole.cost_identity()  # a cheaper forward is timed apart
    prompt = list(range(5, 40))
    a = whole.forward(whole.open(64), prompt).logits
    b = cut.forward(cut.open(64), prompt).logits
    assert b.shape == (1, cut.head_rows) and torch.equal(b, a[:, : cut.head_rows])


def test_worth_weighs_a_node_against_the_chain_before_it():
    """The docstring's example: 2.7 tokens for 2.0 before the third node, which adds 0.5 of cost."""
    policy = SpeculationPolicy(8, cost=lambda n: 1 + 0.15 * (n - 1), draft_cost=0.3)
    est = AcceptanceEstimate()
    assert policy.worth([0.9, 0.8], est)
    assert not policy.worth([0.9, 0.8, 0.5], est)
    assert policy.worth([0.9, 0.8, 0.7], est)
    est.tree_sums["main"] = [1.0, 2.0]  # the drafter has underrated itself twofold: 0.5 counts as 1
    assert policy.worth([0.9, 0.8, 0.5], est)
    assert SpeculationPolicy(8, adaptive=False).worth([0.01, 0.0001], est)  # fixed k drafts to the end


@needs_kernels
@pytest.mark.parametrize("head_rows", [0, 200])
def test_greedy_output_is_plain_decoding_with_confidence_stops_and_a_batch(synthetic, head_rows):
    path = str(synthetic)
    prompts = [list(range(3, 40)) * 2, [5, 6, 7, 8] * 5, list(range(100, 160))]
    params = SamplingParams(max_tokens=40, temperature=0.0)
    plain = [o.outputs[0].token_ids for o in LLM(path).generate(prompts, params)]
    llm = LLM(path, speculative={"method": "draft_model", "draft_model": path, "num_speculative_tokens": 6,
                                 "adaptive_k": True, "draft_cost": 0.1, "draft_head_rows": head_rows})
    outs = llm.generate(prompts, params)  # the three run together: one draft forward per position for all
    assert [o.outputs[0].token_ids for o in outs] == plain
    drafted = sum(o.outputs[0].metrics.num_draft_tokens for o in outs)
    assert drafted > 0


@needs_kernels
def test_a_batch_drafts_what_each_request_drafts_alone(synthetic):
    path = str(synthetic)
    spec = {"method": "draft_model", "draft_model": path, "num_speculative_tokens": 5, "adaptive_k": False, "draft_head_rows": 0}
    proposer, single = (LLM(path, speculative=spec).decoder.proposer for _ in range(2))
    params = SamplingParams(max_tokens=16, temperature=0.0)
    prompts = [list(range(3, 30)), [7, 8, 9] * 6, list(range(200, 260))]
    views = [SequenceView(100 + i, list(p), len(p), params, None, len(p) + 16) for i, p in enumerate(prompts)]
    for v in views:
        proposer.begin(v)
        single.begin(v)
    together = proposer.propose_batch(views, [Budget.chain(5)] * 3)
    alone = [single.propose(v, Budget.chain(5)) for v in views]
    assert [d.tokens for d in together] == [d.tokens for d in alone]
    assert all(len(d) == 5 and d.node_probs is not None and len(d.node_probs) == 5 for d in together)
    assert all(d.node_probs == sorted(d.node_probs, reverse=True) for d in together)  # path probabilities
    for v in views:
        proposer.end(v)
    assert proposer.runner.open_sequences == 0
    assert [d.node_probs for d in together] == [d.node_probs for d in alone]


def test_draft_cost_and_head_rows_are_checked():
    from verispec.config import SpeculativeConfig
    from verispec.errors import InvalidSpeculativeConfigError

    for bad in ({"draft_cost": -1.0}, {"draft_cost": "cheap"}, {"draft_head_rows": -5}, {"draft_head_rows": 1.5}):
        with pytest.raises(InvalidSpeculativeConfigError, match=next(iter(bad))):
            SpeculativeConfig(method="draft_model", draft_model="x", **bad)


@needs_kernels
def test_a_draft_window_bounds_the_catch_up_and_changes_no_token(synthetic):
    path = str(synthetic)
    prompts = [list(range(3, 80)), list(range(100, 170))]
    params = SamplingParams(max_tokens=30, temperature=0.0)
    plain = [o.outputs[0].token_ids for o in LLM(path).generate(prompts, params)]
    spec = {"method": "draft_model", "draft_model": path, "num_speculative_tokens": 4, "adaptive_k": False, "draft_window": 16}
    llm = LLM(path, speculative=spec)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == plain
    proposer = llm.decoder.proposer
    view = SequenceView(7, list(prompts[0]), len(prompts[0]), params, None, len(prompts[0]) + 30)
    proposer.begin(view)
    draft = proposer.propose(view, Budget.chain(4))
    sid = proposer._seqs[7]
    assert proposer.runner.length(sid) == 16 + len(draft) - 1  # the prompt's last 16 tokens, then the drafts fed
    proposer.accept(view, 2)
    assert proposer.runner.length(sid) == 16 + 2
    view.tokens += draft.tokens[:2] + [5]
    assert proposer._catch_up(view) == [5]
    view.tokens += list(range(200, 240))  # lagging by more than the window: afresh from the last 16
    assert proposer._catch_up(view) == view.tokens[-16:] and proposer.runner.length(sid) == 0
    proposer.end(view)


def test_a_kind_whose_probes_cost_a_catch_up_is_never_probed():
    """Once drafting stops paying, the policy probes a free drafter's kind now and then, but never
    a draft model's (a probe there costs a catch-up on every token missed)."""
    policy = SpeculationPolicy(4, cost=lambda n: 1 + 0.3 * (n - 1), draft_cost=0.3, probe_every=4)
    for probes, expect in ((True, True), (False, False)):
        est = AcceptanceEstimate(accepted=0.0, rejected=5.0)
        ks = [policy.budget(lambda kind: est, 1, 100, False, kind_probes=lambda kind: probes).pays("") for _ in range(40)]
        assert (max(ks) > 0) == expect, (probes, ks)
    from verispec.proposers.draft_model import DraftModelProposer
    from verispec.proposers.prompt_lookup import PromptLookupProposer

    assert not DraftModelProposer.kind_probes(None, "") and PromptLookupProposer.kind_probes(None, "")
