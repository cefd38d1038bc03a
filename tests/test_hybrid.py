"""The hybrid drafter (issue 15): suffix decoding where its draft is confident, a model drafter
(an EAGLE-3 head or a draft model) elsewhere. Greedy output is plain decoding's, both drafters
draft, and the model drafter catches up on the steps it sat out."""

import pytest

from tiny_models import write_eagle3_head

from verispec import LLM, SamplingParams
from verispec.errors import InvalidSpeculativeConfigError

from test_lossless_greedy import prompts


@pytest.fixture(scope="module")
def reference(tiny_dir):
    target = tiny_dir("llama", seed=0)
    ps = prompts(12)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    return target, ps, params, [o.token_ids for o in LLM(str(target)).generate(ps, params)]


@pytest.mark.parametrize("drafter", ["draft_model", "eagle3"])
def test_greedy_hybrid_identical_to_plain(reference, drafter, tiny_dir, tmp_path):
    target, ps, params, ref = reference
    model = (str(tiny_dir("llama", seed=7)) if drafter == "draft_model"
             else str(write_eagle3_head(tmp_path / "head", seed=3, draft_vocab=48, aux_layers=[0, 1, 1], scale=0.4)))
    llm = LLM(str(target), speculative={"method": "hybrid", "hybrid_drafter": drafter, "draft_model": model,
                                        "num_speculative_tokens": 4, "hybrid_min_score": 1.0, "adaptive_k": False})
    outs = llm.generate(ps, params)
    assert [o.token_ids for o in outs] == ref
    stats = llm.engine.proposer.stats
    assert stats["model"] > 0 and stats["request"] + stats["global"] > 0, dict(stats)  # both drafted
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0


def test_model_drafts_that_cannot_pay_are_left_out(reference, tiny_dir, monkeypatch):
    """A draft model as large as the target costs a forward a token (priced so here: timed, the
    two tiny models' forwards differ by noise): even at a high acceptance it could not pay, so the
    policy never gives the model's kind a k (not even a probe), while suffix's free drafts go on."""
    target, ps, params, ref = reference
    llm = LLM(str(target), speculative={"method": "hybrid", "hybrid_drafter": "draft_model", "num_speculative_tokens": 4,
                                        "draft_model": str(tiny_dir("llama", seed=7)), "draft_cost": 1.0})
    hybrid = llm.engine.proposer
    assert hybrid.kind_cost("model") == pytest.approx(1.0) and hybrid.kind_cost("request:long") == 0
    asked = []
    real = hybrid.model.propose_batch
    monkeypatch.setattr(hybrid.model, "propose_batch", lambda seqs, budgets: asked.extend(budgets) or real(seqs, budgets))
    assert [o.token_ids for o in llm.generate(ps, params)] == ref
    assert asked == []
    assert hybrid.stats["request"] + hybrid.stats["global"] > 0, dict(hybrid.stats)


def test_a_threshold_no_draft_reaches_leaves_it_to_the_model(reference, tiny_dir):
    target, ps, params, ref = reference
    llm = LLM(str(target), speculative={"method": "hybrid", "hybrid_drafter": "draft_model", "adaptive_k": False,
                                        "draft_model": str(tiny_dir("llama", seed=7)), "hybrid_min_score": 64})
    assert [o.token_ids for o in llm.generate(ps[:4], params)] == ref[:4]
    stats = llm.engine.proposer.stats
    assert stats["model"] > 0 and stats["request"] + stats["global"] == 0


def test_hybrid_options_are_checked(tiny_dir):
    target = str(tiny_dir("llama", seed=0))
    with pytest.raises(InvalidSpeculativeConfigError, match="hybrid_drafter must be one of"):
        LLM(target, speculative={"method": "hybrid", "hybrid_drafter": "prompt_lookup"})
    with pytest.raises(InvalidSpeculativeConfigError, match="needs draft_model"):
        LLM(target, speculative={"method": "hybrid", "hybrid_drafter": "draft_model"})
    with pytest.raises(InvalidSpeculativeConfigError, match="hybrid_min_score"):
        LLM(target, speculative={"method": "hybrid", "hybrid_min_score": -1})


def test_suffix_drafts_are_sized_by_their_path_probabilities_the_models_by_its_rate(reference, tiny_dir, monkeypatch):
    """As suffix decoding's alone, the adaptive policy cuts the hybrid's suffix chains where their
    tokens' calibrated path probabilities stop paying (policy.tree_shape), not at their kind's
    rate; a model draft that carries no such probabilities (and is not sized by its drafter) gets
    its kind's k."""
    from verispec.proposers.base import Draft
    target, ps, params, ref = reference
    llm = LLM(str(target), speculative={"method": "hybrid", "hybrid_drafter": "draft_model", "num_speculative_tokens": 8,
                                        "draft_model": str(tiny_dir("llama", seed=7)), "hybrid_min_score": 0.5})
    assert [o.token_ids for o in llm.generate(ps, params)] == ref
    dec, hybrid = llm.decoder, llm.decoder.proposer
    monkeypatch.setattr(hybrid.model, "relative_cost", 0.0)  # model tokens free: only the rate decides
    drafts = {
        "suffix": Draft([30, 31, 32, 33, 34], node_probs=[1.0, 1.0, 0.05, 0.04, 0.03], kind="request:short", past_match=8),
        "model": Draft([40, 41, 42, 43, 44, 45, 46, 47], kind="model"),
    }
    for source, rate in (("suffix", 8), ("model", 8), ("model", 0)):
        req = dec.start([1] + [30, 31, 32, 33, 34, 35] * 4, params)
        budgets = []
        monkeypatch.setattr(hybrid, "propose_batch", lambda seqs, bs, d=drafts[source]: budgets.extend(bs) or [d])
        for _ in range(6):  # each kind's rate: all 8 accepted (or none)
            req.estimates[drafts[source].kind].observe(8, rate)
        got = dec._propose([req])[0]
        if source == "suffix":
            assert len(got) == 2  # its doubtful tail cut, whatever its kind's rate
        else:  # the first k of the model's draft, k from its kind's rate: several, or none (a probe's one at most)
            assert got.tokens == drafts["model"].tokens[: len(got)] and got.node_probs is None
            assert len(got) == budgets[-1].pays("model") and (len(got) > 1) == (rate > 0), (len(got), rate)
        dec.finish(req)
