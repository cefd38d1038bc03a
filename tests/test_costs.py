"""Cost curves the speculation policy weighs drafts against: built-in, timed at start-up, from a profile."""


import pytest

from verispec import LLM, SamplingParams
from verispec.config import SpeculativeConfig
from verispec.engine.assembly import build_policy
from verispec.runners.costs import default_cost, interpolated, measured_cost, monotone
from verispec.runners.llamacpp import LLAMACPP_POINTS, llamacpp_cost
from verispec.errors import ConfigError


def test_interpolated_curve_passes_through_its_points_and_extends_its_last_slope():
    curve = interpolated(((1, 1.0), (2, 1.7), (4, 2.6)))
    assert curve(1) == 1.0 and curve(2) == 1.7 and curve(4) == 2.6
    assert curve(3) == pytest.approx(2.15)
    assert curve(6) == pytest.approx(3.5)  # 0.45 per token beyond 4, as between 2 and 4


def test_backend_curves_and_llamacpp_decodes_split_at_invariant_rows():
    assert llamacpp_cost(32)(8) == pytest.approx(3.8)
    llamacpp = llamacpp_cost(32)
    assert [llamacpp(n) for n, _ in LLAMACPP_POINTS] == pytest.approx([c for _, c in LLAMACPP_POINTS])
    assert llamacpp(5) > default_cost(5)  # llama.cpp's verification is steeper here than torch's
    split = llamacpp_cost(3)
    assert split(3) == pytest.approx(llamacpp(3))
    assert split(5) == pytest.approx(llamacpp(3) + llamacpp(2))  # a decode of 3 rows, then one of 2
    assert split(9) == pytest.approx(3 * llamacpp(3))


def test_measured_times_become_a_non_decreasing_relative_curve():
    curve = monotone([1, 2, 4, 8], [10.0, 9.0, 14.0, 12.0])
    assert [curve(n) for n in (1, 2, 4, 8)] == [1.0, 1.0, 1.4, 1.4]
    assert curve(3) == 1.0 and curve(6) == 1.4  # the nearest measured n answers


class CountingRunner:
    """A runner whose forward over n tokens 'costs' 10 + 5 n ms (slept), recording what it is asked."""

    max_context, vocab_size, backend = 4096, 100, "fake"

    def __init__(self):
        self.sizes, self.opened, self.closed, self.length = [], 0, 0, 0

    def open(self, capacity):
        self.opened += 1
        return 0

    def close(self, seq):
        self.closed += 1

    def forward(self, seq, tokens, num_logits=1):
        import time

        self.sizes.append(len(tokens))
        self.length += len(tokens)
        time.sleep((10 + 5 * len(tokens)) / 1000)

    def truncate(self, seq, length):
        self.length = length

    def builtin_cost(self):
        return default_cost

    def verify_chunks(self, n):
        return [n]


def test_auto_times_every_draft_length_it_may_choose_and_cleans_up():
    runner = CountingRunner()
    cost = measured_cost(runner, max_n=5, context=16, repeats=2)
    assert runner.sizes[0] == 16  # the context, once
    timed = runner.sizes[1:]
    assert sorted(set(timed)) == [1, 2, 3, 4, 5] and all(timed.count(n) == 3 for n in set(timed))  # warm-up + 2
    assert runner.opened == runner.closed == 1 and runner.length == 16
    assert cost(1) == 1.0
    # 10 + 5 n ms: cost(n) = (10 + 5 n) / 15 (sleeps overshoot a little; the curve stays near it)
    assert cost(5) == pytest.approx(35 / 15, rel=0.25) and cost(3) == pytest.approx(25 / 15, rel=0.25)
    assert [cost(n) for n in range(1, 6)] == sorted(cost(n) for n in range(1, 6))
    policy = build_policy(SpeculativeConfig(method="prompt_lookup", num_speculative_tokens=4, cost_profile="auto"), 0.0, CountingRunner())
    assert policy.cost(5) > 1.5  # the measured curve, not the torch default (1.6 at 5, but 1.15 at 2)
    assert policy.cost(2) == pytest.approx(20 / 15, rel=0.25)


def test_auto_on_a_real_engine_stays_lossless(tiny_dir):
    llm = LLM(str(tiny_dir("llama")), speculative={"method": "prompt_lookup", "num_speculative_tokens": 3,
                                                  "cost_profile": "auto"})
    assert llm.decoder.policy.cost is not default_cost and llm.decoder.policy.cost(1) == 1.0
    assert llm.runner.open_sequences == 0  # the timing sequence is closed again
    plain = LLM(str(tiny_dir("llama")))
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    assert llm.generate([prompt], params)[0].token_ids == plain.generate([prompt], params)[0].token_ids


def test_plain_decoding_times_nothing_and_bad_profiles_are_config_errors(tiny_dir, tmp_path):
    runner = CountingRunner()
    policy = build_policy(SpeculativeConfig(method=None, cost_profile="auto"), 0.0, runner)
    assert runner.sizes == [] and policy.max_k == 0
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read the cost profile"):
        LLM(str(tiny_dir("llama")), speculative={"method": "prompt_lookup", "cost_profile": str(bad)})


def test_measured_curve_is_timed_once_per_machine_and_model_then_read(tiny_dir, tmp_path, monkeypatch):
    """The default cost_profile "measured": the first engine times the curve, later ones (another
    process, another day) read it from the cache; another kernel variant or model is timed apart."""
    from verispec.runners import costs
    from verispec.models.kernels import rowwise

    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    timed = []
    real = costs.measured_points
    monkeypatch.setattr(costs, "measured_points", lambda runner, n: timed.append(runner.cost_identity()) or real(runner, n))
    spec = {"method": "prompt_lookup", "num_speculative_tokens": 4}
    first = LLM(str(tiny_dir("llama")), speculative=spec)
    assert SpeculativeConfig().cost_profile == "measured" and len(timed) == 1
    second = LLM(str(tiny_dir("llama")), speculative=spec)
    assert len(timed) == 1  # read from the cache
    assert [first.decoder.policy.cost(n) for n in range(1, 12)] == [second.decoder.policy.cost(n) for n in range(1, 12)]
    assert "cost-curves.json" in {p.name for p in tmp_path.iterdir()}
    monkeypatch.setitem(rowwise._state, "module", rowwise.load_variant("scalar"))
    LLM(str(tiny_dir("llama")), speculative=spec)
    assert len(timed) == 2 and "kernel=scalar" in timed[-1]
    LLM(str(tiny_dir("qwen2")), speculative=spec)
    LLM(str(tiny_dir("llama")), speculative=dict(spec, cost_profile="builtin"))
    LLM(str(tiny_dir("llama")))  # plain decoding needs no curve
    assert len(timed) == 3


def test_memo_files_keep_only_their_newest_entries(tmp_path, monkeypatch):
    """A memo file (cost curves, file hashes) keeps the MEMO_ENTRIES newest keys, so test runs
    over temporary models do not grow it without bound; an evicted key is computed again."""
    import json

    from verispec.models import cache as loaders

    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(loaders, "MEMO_ENTRIES", 3)
    calls = []
    for key in "abcde":
        assert loaders.memoised("m.json", key, lambda k=key: calls.append(k) or k.upper()) == key.upper()
    assert list(json.loads((tmp_path / "m.json").read_text())) == ["c", "d", "e"]
    assert loaders.memoised("m.json", "e", lambda: "new") == "E"  # kept: read, not computed
    assert loaders.memoised("m.json", "a", lambda: "again") == "again"  # evicted: computed again
    assert calls == list("abcde")
