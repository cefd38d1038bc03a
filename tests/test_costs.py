"""Cost curves the speculation policy weighs drafts against: built-in, timed at start-up, from a profile."""

import pytest

from verispec import LLM
from verispec.engine.costs import LLAMACPP_POINTS, backend_cost, default_cost, interpolated, monotone
from verispec.errors import ConfigError


def test_interpolated_curve_passes_through_its_points_and_is_flat_beyond():
    curve = interpolated(((1, 1.0), (2, 1.7), (4, 2.6)))
    assert curve(1) == 1.0 and curve(2) == 1.7 and curve(4) == 2.6
    assert curve(3) == pytest.approx(2.15)
    assert curve(9) == 2.6
    llamacpp = backend_cost("llamacpp")
    assert [llamacpp(n) for n, _ in LLAMACPP_POINTS] == [c for _, c in LLAMACPP_POINTS]
    assert backend_cost("torch") is default_cost
    assert llamacpp(5) > default_cost(5)  # llama.cpp's verification is steeper here than torch's


def test_measured_times_become_a_non_decreasing_relative_curve():
    curve = monotone([1, 2, 4, 8], [10.0, 9.0, 14.0, 12.0])
    assert [curve(n) for n in (1, 2, 4, 8)] == [1.0, 1.0, 1.4, 1.4]
    assert curve(3) == 1.0 and curve(6) == 1.4  # the nearest measured n answers


def test_auto_times_the_loaded_model(tiny_dir):
    llm = LLM(str(tiny_dir("llama")), speculative={"method": "prompt_lookup", "num_speculative_tokens": 3,
                                                  "cost_profile": "auto"})
    cost = llm.decoder.policy.cost
    assert cost is not default_cost
    curve = [cost(n) for n in range(1, 5)]
    assert curve[0] == 1.0 and curve == sorted(curve)
    assert llm.runner.open_sequences == 0  # the timing sequence is closed again
    # and the engine still decodes losslessly on it
    plain = LLM(str(tiny_dir("llama")))
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    from verispec import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    assert llm.generate([prompt], params)[0].token_ids == plain.generate([prompt], params)[0].token_ids


def test_plain_decoding_times_nothing_and_bad_profiles_are_config_errors(tiny_dir, tmp_path):
    llm = LLM(str(tiny_dir("llama")), speculative={"method": None, "cost_profile": "auto"})
    assert llm.decoder.policy.cost is default_cost
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read the cost profile"):
        LLM(str(tiny_dir("llama")), speculative={"method": "prompt_lookup", "cost_profile": str(bad)})
