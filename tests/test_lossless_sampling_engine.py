"""Sampling through the whole engine: the second output token of speculative decoding follows the
target's exact distribution (draft model with top-k/top-p, so q must be processed like p; suffix
decoding's one-hot drafts), and seeds reproduce runs exactly."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from tiny_models import write_eagle3_head

from verispec import LLM, SamplingParams
from verispec.sampling.processors import logits_to_probs

PROMPT = [1, 20, 21, 22, 20, 21]
TEMP, TOP_K, TOP_P = 0.9, 12, 0.9


def exact_second_token_distribution(llm):
    """P(t2) = sum over t1 of P(t1 | prompt) P(t2 | prompt, t1), both processed like the engine."""
    runner = llm.runner
    seq = runner.open(len(PROMPT) + 2)
    logits = runner.forward(seq, PROMPT, 1).logits
    p1 = logits_to_probs(logits, TEMP, TOP_K, TOP_P)[0]  # [vocab]
    p2 = torch.zeros_like(p1)
    for t1 in torch.nonzero(p1).flatten().tolist():
        runner.truncate(seq, len(PROMPT))
        nxt = runner.forward(seq, [t1], 1).logits
        p2 += p1[t1] * logits_to_probs(nxt, TEMP, TOP_K, TOP_P)[0]
    runner.close(seq)
    return p2.double().numpy()


# draft_model-stops: adaptive k with a cheap draft over the vocabulary's first 48 ids, so chains stop
# where the draft's confidence says (proposers/draft_model.py) and q is zero past its head
DRAFT_STOPS = {"adaptive_k": True, "draft_cost": 0.05, "draft_head_rows": 48}


@pytest.fixture(scope="module", params=["draft_model", "draft_model-stops", "suffix", "suffix-adaptive", "eagle3", "hybrid"])
def spec_llm(tiny_dir, request, tmp_path_factory):
    """A draft model (soft draft probabilities), suffix decoding (one-hot drafts from the
    request's own text, PROMPT repeats "20 21", and, unseeded, from the earlier samples), an
    EAGLE-3 head (soft probabilities over its draft vocabulary, zero outside it), or the hybrid
    (suffix's one-hot drafts where it is confident, the draft model's soft ones elsewhere).
    suffix-adaptive: suffix's chains cut by the adaptive policy from their own path probabilities."""
    spec = {"method": request.param.removesuffix("-adaptive").removesuffix("-stops"), "num_speculative_tokens": 3,
            "adaptive_k": request.param.endswith("-adaptive")}
    if request.param in ("draft_model", "draft_model-stops", "hybrid"):
        spec["draft_model"] = str(tiny_dir("llama", seed=7))
    if request.param == "draft_model-stops":
        spec.update(DRAFT_STOPS)
    if request.param == "hybrid":
        spec.update(hybrid_drafter="draft_model", hybrid_min_score=0.5)
    if request.param == "eagle3":
        spec["draft_model"] = str(eagle_head(tmp_path_factory.mktemp("head")))
    return LLM(str(tiny_dir("llama", seed=0)), speculative=spec)


def eagle_head(folder):
    """A random EAGLE-3 head for the 2-layer tiny llama (its fused layers named in the config)."""
    return write_eagle3_head(folder, seed=3, draft_vocab=48, aux_layers=[0, 1, 1], scale=0.4)


def exact_token_distribution(llm, index):
    """P(t_index) over every path of earlier output tokens, each step processed like the engine."""
    runner = llm.runner
    seq = runner.open(len(PROMPT) + index + 1)

    def walk(prefix, weight, out):
        runner.truncate(seq, len(PROMPT) + len(prefix) - 1 if prefix else 0)
        logits = runner.forward(seq, (PROMPT if not prefix else []) + prefix[-1:], 1).logits
        p = logits_to_probs(logits, TEMP, TOP_K, TOP_P)[0]
        if len(prefix) == index:
            out += weight * p.double()
            return
        for t in torch.nonzero(p).flatten().tolist():
            walk(prefix + [t], weight * float(p[t]), out)

    out = torch.zeros(runner.vocab_size, dtype=torch.float64)
    walk([], 1.0, out)
    runner.close(seq)
    return out.numpy()


def test_second_token_matches_target_distribution(spec_llm):
    pvalue = second_token_pvalue(spec_llm)
    assert pvalue > 1e-6, f"speculative sampling deviates from the target: p = {pvalue:.2e}"


def test_third_token_matches_with_confidence_stops(tiny_dir):
    """The draft model's stops act from its second draft token on: the third output token is the
    first they can touch."""
    spec = {"method": "draft_model", "draft_model": str(tiny_dir("llama", seed=7)), "num_speculative_tokens": 3, **DRAFT_STOPS}
    pvalue = second_token_pvalue(LLM(str(tiny_dir("llama", seed=0)), speculative=spec), index=2)
    assert pvalue > 1e-6, f"speculative sampling deviates from the target: p = {pvalue:.2e}"


def second_token_pvalue(spec_llm, n=2500, index=1):
    exact = exact_second_token_distribution(spec_llm) if index == 1 else exact_token_distribution(spec_llm, index)
    params = [SamplingParams(temperature=TEMP, top_k=TOP_K, top_p=TOP_P, seed=s, max_tokens=5, ignore_eos=True) for s in range(n)]
    counts = np.zeros_like(exact)
    accepted = drafted = 0
    for p in params:
        out = spec_llm.generate([PROMPT], p)[0]
        counts[out.token_ids[index]] += 1
        accepted += out.metrics.num_accepted_tokens
        drafted += out.metrics.num_draft_tokens
    assert 0 < accepted < drafted  # both the accept and the residual paths ran
    stats = getattr(spec_llm.engine.proposer, "stats", {})
    if spec_llm.engine.proposer.name == "hybrid":  # both of its drafters drafted
        assert stats["model"] > 0 and stats["request"] + stats["global"] > 0, dict(stats)
    # bins with expected count >= 10, the rest pooled into "other"
    big = exact * n >= 10
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(exact[big] * n, exact[~big].sum() * n)
    assert counts[exact == 0].sum() == 0  # never a token the processed target rules out
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue  # exp sums to n up to float error


def test_seeds_reproduce(spec_llm, tiny_dir):
    plain = LLM(str(tiny_dir("llama", seed=0)))
    for llm in (spec_llm, plain):
        a = llm.generate([PROMPT], SamplingParams(temperature=1.0, seed=123, max_tokens=24, ignore_eos=True))[0]
        b = llm.generate([PROMPT], SamplingParams(temperature=1.0, seed=123, max_tokens=24, ignore_eos=True))[0]
        c = llm.generate([PROMPT], SamplingParams(temperature=1.0, seed=124, max_tokens=24, ignore_eos=True))[0]
        assert a.token_ids == b.token_ids
        assert a.token_ids != c.token_ids



def choose_pvalue(proposer, n=6000):
    """Draw n draft tokens from one row of head logits through the drafter's own sampling step and
    test them against the q it reports (chi-square): q must be what the token was drawn from."""
    from verispec.proposers.base import SequenceView

    g = torch.Generator().manual_seed(0)
    row = torch.randn(proposer.head.config.draft_vocab_size, generator=g) * 2  # [draft vocab] logits
    params = SamplingParams(temperature=TEMP, top_k=TOP_K, top_p=TOP_P, seed=0)
    view = SequenceView(1, [1], 1, params, torch.Generator().manual_seed(1), 8)
    counts = np.zeros(proposer.head.config.vocab_size)
    q = None
    for _ in range(n):
        probs = []
        counts[proposer._choose(view, row, probs)] += 1
        q = probs[0].double().numpy()
    assert counts[q == 0].sum() == 0  # never a token q rules out
    big = q * n >= 10
    obs, exp = counts[big], q[big] * n
    if q[~big].sum() * n >= 1:  # the rare tokens pooled
        obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, q[~big].sum() * n)
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def test_eagle_q_is_what_it_sampled_from(tiny_dir, tmp_path, monkeypatch):
    """The head's reported q is the distribution its token was drawn from (temperature, top-k, top-p
    over the draft vocabulary); negative control: sampling from the processed distribution but
    reporting the raw softmax (the bug of transformers #47932) is caught."""
    import verispec.proposers.eagle as eagle

    spec = {"method": "eagle3", "num_speculative_tokens": 3, "adaptive_k": False, "draft_model": str(eagle_head(tmp_path))}
    proposer = LLM(str(tiny_dir("llama", seed=0)), speculative=spec).decoder.proposer
    assert choose_pvalue(proposer) > 1e-6

    def wrong_q(self, seq, row, probs):
        p = seq.params
        full = row.new_full((self.head.config.vocab_size,), float("-inf"))
        full[self.head.target_ids] = row
        sampled = logits_to_probs(full[None], p.temperature, p.top_k, p.top_p)
        probs.append(torch.softmax(full, -1))  # not what was sampled from
        return int(torch.multinomial(sampled[0], 1, generator=seq.generator))

    monkeypatch.setattr(eagle.EagleProposer, "_choose", wrong_q)
    assert choose_pvalue(proposer) < 1e-6


def stopped_draft_pvalue(proposer, n=3000):
    """Draw n two-token drafts from one context through the draft model's sampling step, keeping
    the second token where its confidence (path probability over the first's) reaches 0.6 of the
    largest probability of its position (for the commonest first token: known from a first pass);
    among the drafts whose first token is the commonest one, the second tokens kept must follow the
    q reported for them (chi-square): whether a token is kept may depend on the tokens before it,
    never on itself."""
    from verispec.proposers.base import Budget, SequenceView

    params = SamplingParams(temperature=TEMP, top_k=TOP_K, top_p=TOP_P, seed=0)

    def draw(count, worth):
        drafts = []
        for i in range(count):
            view = SequenceView(i, list(PROMPT), len(PROMPT), params, torch.Generator().manual_seed(i), len(PROMPT) + 4)
            proposer.begin(view)
            drafts.append(proposer.propose(view, Budget(2, 0, lambda kind: 2, worth)))
            proposer.end(view)
        return drafts

    drafts = draw(300, lambda kind, probs: True)
    first = np.bincount([d.tokens[0] for d in drafts]).argmax()
    threshold = 0.6 * float(next(d for d in drafts if d.tokens[0] == first).probs[1].max())
    drafts = draw(n, lambda kind, probs: probs[-1] / probs[-2] >= threshold)
    kept = [d for d in drafts if d.tokens[0] == first and len(d) == 2]
    assert len(kept) >= 200, f"too few second tokens kept ({len(kept)}) to test"
    q = kept[0].probs[1].double().numpy()  # the same context, so the same q for all of them
    counts = np.bincount([d.tokens[1] for d in kept], minlength=q.size).astype(float)
    assert counts[q == 0].sum() == 0
    big = q * len(kept) >= 10
    obs, exp = counts[big], q[big] * len(kept)
    if q[~big].sum() * len(kept) >= 1:  # the rare tokens pooled
        obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, q[~big].sum() * len(kept))
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def test_draft_model_stops_never_select_a_token_on_itself(tiny_dir, monkeypatch):
    """The draft model's confidence stops read each position's distribution before its token is
    drawn; negative control: a stop that reads the drawn token's own probability keeps likely
    tokens and drops unlikely ones, and is caught."""
    import verispec.proposers.draft_model as draft_model

    spec = {"method": "draft_model", "draft_model": str(tiny_dir("llama", seed=0)), "num_speculative_tokens": 3, **DRAFT_STOPS}
    proposer = LLM(str(tiny_dir("llama", seed=0)), speculative=spec).decoder.proposer
    assert stopped_draft_pvalue(proposer) > 1e-6
    monkeypatch.setattr(draft_model, "confidence", lambda q, token: float(q[token]))
    assert stopped_draft_pvalue(proposer) < 1e-6
