"""Suffix decoding (proposers/suffix.py): the index and its drafts, the bounded store of earlier
responses, corpus seeding, options; lossless drafting through the engine is in
test_lossless_greedy.py and test_lossless_sampling_engine.py."""

import json

import pytest

from verispec import LLM, SamplingParams
from verispec.config import SpeculativeConfig
from verispec.errors import InvalidSpeculativeConfigError
from verispec.proposers.base import Budget, SequenceView
from verispec.proposers.suffix import GlobalResponses, SuffixProposer
from verispec.proposers.suffix.index import TokenIndex

THE, RESULT, IS, N42, N7, DOT, DONE = 10, 11, 12, 42, 7, 13, 14


def index_of(*docs):
    ix = TokenIndex()
    for d in docs:
        ix.extend(list(d))
        ix.close()
    return ix


def test_the_docstring_example():
    ix = index_of([1, THE, RESULT, IS, N42, DOT, DONE], [2, THE, RESULT, IS, N42, DOT, DONE], [3, THE, RESULT, IS, N7, DOT])
    c = ix.best([5, THE, RESULT, IS], k=8, max_depth=24, max_spec_factor=1.0, min_token_prob=0.1)
    assert c.tokens == [N42, DOT, DONE]
    assert c.match_len == 3
    assert c.score == pytest.approx(3 * 2 / 3)
    # a higher floor cuts the draft where its probability falls below it
    assert ix.best([5, THE, RESULT, IS], 8, 24, 1.0, min_token_prob=0.7) is None
    # longer matches earn longer drafts: factor 1/3 allows one token per 3 matched
    assert ix.best([5, THE, RESULT, IS], 8, 24, max_spec_factor=1 / 3, min_token_prob=0.1).tokens == [N42]


def test_longer_match_wins_over_a_more_frequent_short_one():
    # "b c" is followed by x three times, but "a b c" (the context's tail) by y, twice, for certain
    ix = index_of([9, 20, 21, 30], [8, 20, 21, 30], [7, 20, 21, 30], [19, 20, 21, 40, 41], [19, 20, 21, 40, 41])
    c = ix.best([19, 20, 21], k=4, max_depth=24, max_spec_factor=1.0, min_token_prob=0.1)
    assert c.tokens == [40, 41]
    assert c.score == pytest.approx(2.0)


def test_long_drafts_from_short_matches_do_not_outrank_long_matches():
    # "20 21" is followed by 60 .. 67 three times of four; the tail's 5 tokens "5 6 7 20 21" once, by 30 31.
    # At max_spec_factor 4 the 2-token match may draft 8 tokens (score 6.0 against 2.0), but candidates
    # are ranked by their tokens no deeper than their match: 1.5 against 2.0
    long_tail = [60, 61, 62, 63, 64, 65, 66, 67]
    ix = index_of([50, 20, 21, *long_tail], [51, 20, 21, *long_tail], [52, 20, 21, *long_tail], [5, 6, 7, 20, 21, 30, 31])
    c = ix.best([5, 6, 7, 20, 21], k=8, max_depth=24, max_spec_factor=4.0, min_token_prob=0.1)
    assert c.tokens == [30, 31] and c.match_len == 5 and c.rank == pytest.approx(2.0)
    only_short = ix.best([9, 20, 21], k=8, max_depth=24, max_spec_factor=4.0, min_token_prob=0.1)
    assert only_short.tokens == long_tail and only_short.score == pytest.approx(6.0) and only_short.rank == pytest.approx(1.5)
    assert ix.best([9, 20, 21], k=8, max_depth=24, max_spec_factor=1.0, min_token_prob=0.1).tokens == long_tail[:2]


def test_equal_counts_go_the_way_the_most_recent_occurrence_went():
    # "20 21" occurred twice, followed by 30 then by 31: a tie, broken by recency (text being copied,
    # or a loop, goes on as it went last), whichever token id is smaller
    for first, last in ((30, 31), (31, 30)):
        ix = index_of([1, 20, 21, first, 2], [3, 20, 21, last, 4])
        c = ix.best([9, 20, 21], k=2, max_depth=24, max_spec_factor=1.0, min_token_prob=0.1)
        assert c.tokens == [last, 4] and c.probs == [0.5, 0.5]


def test_no_draft_without_an_earlier_occurrence():
    ix = index_of([1, 2, 3, 4])
    assert ix.best([5, 6], 4, 24, 1.0, 0.1) is None
    assert ix.best([3, 4], 4, 24, 1.0, 0.1) is None  # at the document's end: nothing followed it
    assert ix.best([7], 4, 24, 1.0, 0.1) is None  # one token is no match


def test_the_requests_own_tail_is_not_its_own_match():
    p = SuffixProposer(max_cached_requests=0, max_spec_factor=1.0)
    view = SequenceView(1, [5, 6, 7, 8, 5, 6], 6, SamplingParams(temperature=0), None, 100)
    p.begin(view)
    assert p.propose(view, Budget(4)).tokens == [7, 8]  # from the earlier "5 6", capped by the 2-token match
    loose = SuffixProposer(max_cached_requests=0)  # the default factor 4: up to 8 tokens on a 2-token match
    loose.begin(view)
    assert loose.propose(view, Budget(8)).tokens == [7, 8, 5, 6]  # then the request's own tail: excluded
    view.tokens += [7, 8, 5, 6]
    assert p.propose(view, Budget(8)).tokens == [7, 8, 5, 6]  # the tail matches 6 tokens at position 5; then the end
    p.end(view)
    assert len(p.responses) == 0  # max_cached_requests 0: nothing kept


def test_earlier_responses_draft_for_later_requests_and_are_bounded():
    p = SuffixProposer(max_cached_requests=3)
    greedy = SamplingParams(temperature=0)
    for i in range(10):
        v = SequenceView(i, [100 + i, 1, 2], 3, greedy, None, 100)
        p.begin(v)
        v.tokens += [3, 4, 5, 6, 7, 1000 + i]
        p.end(v)
    assert len(p.responses) == 3
    live = p.responses.index
    # only the last three responses remain, and the evicted prefix was compacted away
    assert len(live) == 3 * 10  # each: the prompt's 3 tokens, the 6 of the response, the end
    assert len(live.tokens) <= 2 * len(live) + 10
    v = SequenceView(99, [50, 3, 4], 3, greedy, None, 100)
    p.begin(v)
    # 2 matched, factor 4: 5 6 7, on which the 3 cached responses agree, then 1007, 1008 or 1009
    # (a third each, above min_token_prob: the most recent response's)
    assert p.propose(v, Budget(8)).tokens == [5, 6, 7, 1009]
    assert p.stats["global"] == 1
    # a seeded sampled request does not draft from other requests' responses
    seeded = SequenceView(100, [50, 3, 4], 3, SamplingParams(temperature=1.0, seed=1), None, 100)
    p.begin(seeded)
    assert p.propose(seeded, Budget(8)).tokens == []


def test_compaction_keeps_the_drafts():
    store = GlobalResponses(max_requests=2)
    for i in range(7):
        store.add([1, 2, 3, 4 + i % 2])
    before = store.index.best([1, 2], 4, 24, 1.0, 0.1)
    store.index.compact()
    assert store.index.live_from == 0
    assert store.index.best([1, 2], 4, 24, 1.0, 0.1) == before
    assert before.tokens == [3, 4]  # the last two responses: "3" certain, then 4 or 5 at 1/2 (ties: the most recent, 4)
    assert before.score == pytest.approx(1.5)
    assert len(store.index) == 2 * 5


class _Words:
    def encode(self, text):
        return [len(w) for w in text.split()]


def test_corpus_seeding(tmp_path):
    p = SuffixProposer()
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps("a bb ccc") + "\n" + json.dumps({"text": "dddd ee"}) + "\n\n")
    assert p.seed_corpus(f, _Words()) == 2
    t = tmp_path / "c.txt"
    t.write_text("one two\nthree\n\nfour five\n")
    assert p.seed_corpus(t, _Words()) == 2
    assert len(p.responses) == 4
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"txt": 1}\n')
    with pytest.raises(InvalidSpeculativeConfigError, match="bad.jsonl:1"):
        p.seed_corpus(bad, _Words())
    with pytest.raises(InvalidSpeculativeConfigError, match="cannot read"):
        p.seed_corpus(tmp_path / "missing.txt", _Words())


@pytest.mark.parametrize("option, value", [
    ("suffix_decoding_max_tree_depth", 1), ("suffix_decoding_max_cached_requests", -1),
    ("suffix_decoding_max_spec_factor", 0), ("suffix_decoding_min_token_prob", 1.5),
])
def test_bad_options_are_refused(option, value):
    with pytest.raises(InvalidSpeculativeConfigError, match=option):
        SpeculativeConfig(method="suffix", **{option: value})


def test_one_engine_shares_its_responses_across_requests(tiny_dir):
    """Two generate calls on one LLM: the second request drafts from the first's response."""
    llm = LLM(str(tiny_dir("llama", seed=0)), speculative={"method": "suffix", "num_speculative_tokens": 6, "adaptive_k": False})
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    first = llm.generate([[1, 30, 31, 32]], params)[0]
    second = llm.generate([[1, 30, 31, 32]], params)[0]
    assert second.token_ids == first.token_ids
    assert second.metrics.num_accepted_tokens > 0
    assert llm.decoder.proposer.stats["global"] > 0


def test_a_draft_kind_first_seen_late_starts_from_its_sources_rate(tiny_dir):
    """Suffix drafts come in four kinds (source x match length), each with its own acceptance
    estimate; a kind first drafted after others of its source starts from their rate in this
    request, not from 0.5 (a prior worth one draft token either way); a source's first kind from
    0.5, whatever the other source's drafts did."""
    llm = LLM(str(tiny_dir("llama", seed=0)), speculative={"method": "suffix", "num_speculative_tokens": 8, "adaptive_k": True})
    dec = llm.decoder
    req = dec.start([1, 30, 31, 32], SamplingParams(temperature=0.0, max_tokens=24))
    assert req.estimates["global:short"].rate == pytest.approx(0.5)  # nothing seen: the prior
    for _ in range(6):  # drafts of another kind of the request's own text, all accepted
        req.estimates[""].observe(8, 8)
        req.estimates["request:short"].observe(8, 8)
    late = req.estimates["request:long"]
    assert late.rate == pytest.approx(req.estimates["request:short"].rate) and late.rate > 0.95
    assert late.accepted + late.rejected == pytest.approx(1.0)
    from verispec.engine.policy import SpeculationPolicy
    policy = SpeculationPolicy(8, cost=lambda n: 1 + 0.15 * (n - 1))
    assert policy.best_k(late.rate) == 8 and policy.best_k(0.5) < 4  # drafts long at once
    for _ in range(3):  # the earlier responses' drafts all failed: the other source does not inherit that
        req.estimates[""].observe(8, 0)
        req.estimates["global:short"].observe(8, 0)
    assert req.estimates["global:long"].rate < 0.2
    assert req.estimates["request:new"].rate > 0.95
    dec.finish(req)
    fresh = dec.start([1, 30, 31, 32], SamplingParams(temperature=0.0, max_tokens=24))
    for _ in range(3):
        fresh.estimates[""].observe(8, 0)
        fresh.estimates["global:short"].observe(8, 0)
    assert fresh.estimates["request:short"].rate == pytest.approx(0.5)
    dec.finish(fresh)


def test_one_token_matches_only_where_no_source_has_the_last_two():
    p = SuffixProposer(max_cached_requests=10)
    greedy = SamplingParams(temperature=0)
    earlier = SequenceView(0, [1, 2], 2, greedy, None, 100)
    p.begin(earlier)
    earlier.tokens += [40, 41, 60, 50, 51, 52]
    p.end(earlier)
    # a request whose tail is a word new to both sources (99), then 60: what followed 60 elsewhere
    new_word = SequenceView(1, [3, 99, 60], 3, greedy, None, 100)
    p.begin(new_word)
    c = p.candidate(new_word, 8)
    assert c.tokens == [50, 51, 52] and c.match_len == 1 and p.kind_of(c) == "global:one"
    # the request's own text has the last two tokens: its 2-token match, not earlier responses' 1-token one
    own = SequenceView(2, [3, 7, 60, 61, 62, 8, 7, 60], 8, greedy, None, 100)
    p.begin(own)
    c = p.candidate(own, 8)
    assert c.source == "request" and c.match_len == 2 and c.tokens[:3] == [61, 62, 8]


def test_walking_only_levels_that_can_beat_a_rank_finds_the_same_best():
    import random

    rng = random.Random(0)
    for trial in range(200):
        ix = index_of(*[[rng.randrange(6) for _ in range(rng.randrange(3, 30))] for _ in range(rng.randrange(1, 6))])
        tail = [rng.randrange(6) for _ in range(rng.randrange(2, 8))]
        for nodes in (0, 8):
            full = ix.best(tail, 8, 24, 4.0, 0.1, max_nodes=nodes)
            for beat in (-1.0, 0.5, 1.0, 2.0, 3.5):
                pruned = ix.best(tail, 8, 24, 4.0, 0.1, max_nodes=nodes, beat=beat)
                if full is not None and full.rank > beat:
                    assert pruned == full
                else:  # nothing above beat: whatever is returned cannot outrank it
                    assert pruned is None or pruned.rank <= beat + 1e-9


def test_chains_are_sized_by_their_own_path_probabilities(tiny_dir, monkeypatch):
    """With the adaptive policy a suffix chain carries its tokens' path probabilities and is cut
    where they stop paying (policy.tree_shape), not at its kind's rate; verification teaches the
    kind's calibration; the output stays plain decoding's."""
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.proposers.base import Draft
    target = str(tiny_dir("llama", seed=0))
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    prompt = [1] + [30, 31, 32, 33, 34, 35] * 4
    ref = LLM(target).generate([prompt], params)[0].token_ids
    llm = LLM(target, speculative={"method": "suffix", "num_speculative_tokens": 8, "adaptive_k": True})
    verified = []
    verify = SpeculativeDecoder._verify
    monkeypatch.setattr(SpeculativeDecoder, "_verify", lambda self, reqs, drafts: verified.extend(drafts) or verify(self, reqs, drafts))
    assert llm.generate([prompt], params)[0].token_ids == ref
    chains = [d for d in verified if len(d)]
    assert chains and all(d.parents is None and d.node_probs is not None and len(d.node_probs) == len(d) for d in chains)
    # a draft whose later tokens are unlikely is cut before them, whatever its kind's rate
    dec = llm.decoder
    req = dec.start(prompt, params)
    sure_then_doubtful = Draft([30, 31, 32, 33, 34], node_probs=[1.0, 1.0, 0.05, 0.04, 0.03], kind="request:short", past_match=8)
    monkeypatch.setattr(dec.proposer, "propose", lambda seq, k: sure_then_doubtful)
    for _ in range(6):  # the kind's rate says: draft all 8
        req.estimates["request:short"].observe(8, 8)
    assert len(dec._propose([req])[0]) == 2
    dec.finish(req)


def test_few_occurrences_gathered_in_python_as_many_are_with_numpy(monkeypatch):
    import random

    import verispec.proposers.suffix.index as suffix

    rng = random.Random(1)
    for trial in range(150):
        vocab = rng.choice((3, 6, 20))
        ix = index_of(*[[rng.randrange(vocab) for _ in range(rng.randrange(3, 60))] for _ in range(rng.randrange(1, 8))])
        ix.extend([rng.randrange(vocab) for _ in range(rng.randrange(0, 20))])  # an open document: continuations run off the end
        if trial % 3 == 0:
            ix.live_from = rng.randrange(0, len(ix.tokens))  # evicted positions never match
        tail = [rng.randrange(vocab) for _ in range(rng.randrange(2, 12))]
        for k, max_depth, exclude_from, one_token in ((8, 24, None, False), (3, 5, len(ix.tokens) - 2, False), (6, 24, None, True)):
            span = ix._span(tail, k, exclude_from, one_token)
            if span is None:
                continue
            monkeypatch.setattr(suffix, "FEW_OCCURRENCES", 10**6)
            python = ix._gather(*span, tail, k, max_depth)
            monkeypatch.setattr(suffix, "FEW_OCCURRENCES", 0)
            assert ix._gather(*span, tail, k, max_depth) == python, (trial, k)


def test_drafts_searched_in_cpp_are_the_python_ones(monkeypatch):
    """proposers/suffix/search.cpp finds the chain or tree TokenIndex.best's Python walk and growth find: the
    same tokens, path probabilities to the bit, parents and match length, on random indices
    (evicted positions, open documents, one-token levels, ranks to beat, short and long spec
    factors, trees of 1 to 16 nodes)."""
    import random

    from verispec.proposers.suffix import native as search

    native = search.module()
    if native is None:
        pytest.skip("suffix decoding's C++ search could not be built here (no compiler or ninja)")
    rng = random.Random(7)
    drafted = trees = 0
    for trial in range(400):
        vocab = rng.choice((2, 3, 6, 20))
        ix = index_of(*[[rng.randrange(vocab) for _ in range(rng.randrange(3, 80))] for _ in range(rng.randrange(1, 10))])
        ix.extend([rng.randrange(vocab) for _ in range(rng.randrange(0, 20))])
        if trial % 3 == 0:
            ix.live_from = rng.randrange(0, len(ix.tokens))
        tail = [rng.randrange(vocab) for _ in range(rng.randrange(2, 30))]
        args = dict(k=rng.choice((1, 3, 8)), max_depth=rng.choice((2, 5, 24)), max_spec_factor=rng.choice((0.5, 1.0, 2.0, 3.3)),
                    min_token_prob=rng.choice((0.0, 0.1, 0.3)), exclude_from=rng.choice((None, len(ix.tokens) - 1)),
                    one_token=rng.random() < 0.3, beat=rng.choice((-1.0, -1.0, 0.5, 1.5)),
                    max_nodes=rng.choice((0, 0, 1, 4, 16)))
        monkeypatch.setattr(search, "loaded", lambda: None)
        python = ix.best(tail, **args)
        monkeypatch.setattr(search, "loaded", lambda: native)
        cpp = ix.best(tail, **args)
        if python is None:
            assert cpp is None, (trial, args)
            continue
        drafted += 1
        assert (cpp.tokens, cpp.probs, cpp.parents, cpp.match_len) == \
            (python.tokens, python.probs, python.parents, python.match_len), (trial, args)
        trees += python.parents is not None and len(set(python.parents)) < len(python.parents)  # a node with two children
    assert drafted > 100 and trees > 20  # most trials draft: the comparison covers the walk, not only "no draft"


def test_kinds_from_earlier_responses_share_one_estimate_across_requests(tiny_dir):
    """How well the earlier responses predict is the store's: a later request starts from what the
    engine's earlier requests learnt of those kinds, while its own text's kinds start afresh."""
    llm = LLM(str(tiny_dir("llama", seed=0)), speculative={"method": "suffix", "num_speculative_tokens": 8, "adaptive_k": True})
    dec = llm.decoder
    first = dec.start([1, 30, 31, 32], SamplingParams(temperature=0.0, max_tokens=24))
    for _ in range(5):
        first.estimates["global:short"].observe(8, 0)
        first.estimates["request:short"].observe(8, 0)
    dec.finish(first)
    second = dec.start([1, 30, 31, 32], SamplingParams(temperature=0.0, max_tokens=24))
    assert second.estimates["global:short"].rate < 0.2  # the engine's, learnt by the first request
    assert second.estimates["request:short"].rate == pytest.approx(0.5)  # its own: the prior
    second.estimates["global:short"].observe(8, 8)
    dec.finish(second)
    third = dec.start([1, 30, 31, 32], SamplingParams(temperature=0.0, max_tokens=24))
    assert third.estimates["global:short"] is second.estimates["global:short"]
    dec.finish(third)
