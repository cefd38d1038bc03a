"""Smoke test of `verispec bench` and `--profile` on a tiny random model (seconds, not minutes)."""

import json

import pytest

from verispec.bench.profile import CostProfile
from verispec.bench.run import SUBTASKS
from verispec.cli import main

TURNS = {
    "multi_turn": ["w5 w6 w7 w5 w6", "w8 w9 w8 w9"],
    "translation": ["w10 w11 w12"],
    "summarization": ["w13 w14 w15 w13 w14 w15 w13"],
    "qa": ["w16 w17"],
    "math_reasoning": ["w18 w19 w20 w18"],
    "rag": ["w21 w22 w23 w24 w21 w22 w23"],
}


@pytest.fixture()
def questions(tmp_path):
    path = tmp_path / "question.jsonl"
    rows = [
        {"question_id": i, "category": "writing" if sub == "multi_turn" else sub, "turns": turns}
        for i, (sub, turns) in enumerate(TURNS.items())
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_bench_runs_every_method_and_writes_the_report(tiny_dir, questions, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["bench", "--model", str(tiny_dir("llama")), "--questions", str(questions), "--limit", "1",
                 "--max-tokens", "12", "--methods", "plain,prompt_lookup,hf,hf_prompt_lookup,llamacpp,plain@llamacpp", "--out", str(out)])
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    methods = {"plain", "prompt_lookup", "hf", "hf_prompt_lookup"}
    assert {r["method"] for r in data["records"]} == methods
    assert len(data["records"]) == len(TURNS) * len(methods)
    assert "llamacpp" in data["skipped"]  # not a GGUF target: skipped with a reason, not a crash
    assert "GGUF" in data["skipped"]["plain@llamacpp"]
    assert data["mismatches"] == []
    for r in data["records"]:
        assert r["new_tokens"] > 0 and r["wall_time"] > 0 and r["target_forwards"] >= 1
        if r["method"] == "plain":
            assert r["new_tokens"] == r["target_forwards"]  # plain: one token per forward
        if r["method"] == "prompt_lookup":
            assert r["matches_plain"] is True
    multi = [r for r in data["records"] if r["subtask"] == "multi_turn" and r["method"] == "plain"][0]
    assert multi["new_tokens"] > 12  # both turns were generated
    report = (out / "report.md").read_text()
    assert report.startswith(f"# Questions from {questions.name}: ")  # the title names the question set read
    for sub in SUBTASKS:
        assert sub in report
    assert "| plain |" in report and "overall speedup" in report and " / hf: " in report and " / hf_prompt_lookup: " in report
    for png in ("speedup.png", "acceptance.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"# Questions from {questions.name}: " in capsys.readouterr().out  # the report, printed


def test_profile_measures_the_cost_curve(tiny_dir, tmp_path, capsys):
    out = tmp_path / "prof"
    assert main(["bench", "--profile", "--model", str(tiny_dir("llama")), "--out", str(out)]) == 0
    profile = CostProfile.load(out / "cost_profile-torch.json")
    assert profile.ks == list(range(1, 33)) and profile.contexts == [128]
    assert all(ms > 0 for ms in profile.ms["128"])
    assert profile.cost(4, 100) == profile.ms["128"][3]
    assert profile.bandwidth_gbs > 0 and profile.weight_bytes > 0 and profile.linear_floor_ms > 0
    assert 0 < profile.linear_floor_ms < profile.forward_best_ms  # the linear layers are part of the forward
    assert 0 < profile.bound_ms < profile.cost(1, 128)  # nothing beats reading the weights once
    from verispec.models.weights.registry import load_model

    c = load_model(str(tiny_dir("llama"))).config  # float32 keys and values of every layer, 512 positions
    assert profile.kv_bytes_512 == c.num_layers * c.num_kv_heads * c.head_dim * 2 * 512 * 4
    assert profile.bound_kv_ms == pytest.approx(profile.bound_ms * (1 + profile.kv_bytes_512 / profile.weight_bytes))
    printed = capsys.readouterr().out
    assert "forward cost" in printed and "fraction of bound" in printed
    assert f"{profile.forward_best_ms:.1f} / {profile.linear_floor_ms:.1f} = " in printed
    assert f"{profile.forward_best_ms:.1f} / {profile.bound_kv_ms:.1f} = " in printed
    # the engine reads it back to choose k
    from verispec import LLM
    from verispec.runners.costs import default_cost

    llm = LLM(str(tiny_dir("llama")), speculative={"method": "prompt_lookup", "cost_profile": str(out / "cost_profile-torch.json")})
    cost = llm.decoder.policy.cost
    assert cost is not default_cost and cost(1) == 1.0
    curve = [cost(n) for n in range(1, 33)]
    assert curve == sorted(curve)  # made non-decreasing: a measured dip is not something to bet on
    assert cost(32) == max(1.0, *(profile.cost(n, 128) / profile.cost(1, 128) for n in range(1, 33)))


def test_per_position_counts_add_up_across_turns_and_reports_redraw(tiny_dir, questions, tmp_path):
    from verispec.bench.run import add_counts

    assert add_counts([1, 2], [3]) == [4, 2] and add_counts([], [1, 1]) == [1, 1]
    out = tmp_path / "o"
    assert main(["bench", "--model", str(tiny_dir("llama")), "--questions", str(questions), "--limit", "1",
                 "--max-tokens", "12", "--methods", "plain,prompt_lookup", "--k", "3", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    for r in data["records"]:
        assert len(r["accepted_per_position"]) <= 3
        assert sum(r["accepted_per_position"]) == sum(r["accepted_lengths"])
    first = (out / "report.md").read_text()
    (out / "report.md").unlink()
    assert main(["bench", "--report", str(out / "results.json")]) == 0
    assert (out / "report.md").read_text() == first


def test_a_crashing_peer_is_reported_failed_and_the_run_completes(tiny_dir, questions, tmp_path, monkeypatch, capsys):
    """Peers run in child processes: one whose child segfaults (made to, through the bench's fault
    hook) is reported as failed with the signal, in the results, the printed report and stderr,
    while every other method runs every question and the report is written. hf_prompt_lookup dies
    in its warm-up run, hf in its fourth run (question 1, after question 0's record: left out too)."""
    from verispec.bench.peers import CRASH_ENV

    monkeypatch.setenv(CRASH_ENV, "hf_prompt_lookup,hf@4")
    out = tmp_path / "out"
    code = main(["bench", "--model", str(tiny_dir("llama")), "--questions", str(questions), "--limit", "1",
                 "--max-tokens", "12", "--methods", "plain,prompt_lookup,hf,hf_prompt_lookup", "--out", str(out)])
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    assert data["failed"] == {
        "hf_prompt_lookup": "crashed: signal 11 (SIGSEGV) in the warm-up run",
        "hf": "crashed: signal 11 (SIGSEGV) on question 1 (translation)",
    }
    assert {r["method"] for r in data["records"]} == {"plain", "prompt_lookup"}
    assert len(data["records"]) == len(TURNS) * 2 and data["mismatches"] == []
    assert all(r["matches_plain"] for r in data["records"] if r["method"] == "prompt_lookup")
    report = (out / "report.md").read_text()
    assert "| hf | " in report and "failed: crashed: signal 11 (SIGSEGV) on question 1" in report
    assert "- hf_prompt_lookup: crashed: signal 11 (SIGSEGV) in the warm-up run" in report
    for png in ("speedup.png", "acceptance.png"):
        assert (out / png).exists()
    captured = capsys.readouterr()
    assert "failed: crashed: signal 11 (SIGSEGV)" in captured.out  # the printed report
    assert "FAILED hf: crashed: signal 11 (SIGSEGV)" in captured.err
    (out / "report.md").unlink()  # results.json keeps the failures: the redrawn report has them
    assert main(["bench", "--report", str(out / "results.json")]) == 0
    assert (out / "report.md").read_text() == report


def test_a_peer_that_does_not_answer_in_time_is_killed_and_failed(tiny_dir, monkeypatch):
    """A peer's child that does not answer within the timeout (here: while loading) is killed and
    its failure says so; one that dies while loading reports the signal."""
    from verispec.bench.peers import CRASH_ENV, IsolatedPeer, PeerFailed

    peer = IsolatedPeer("hf", str(tiny_dir("llama")), [0], timeout=0.05)
    with pytest.raises(PeerFailed, match=r"no answer within 0.05 s while loading \(killed\)"):
        peer.wait_ready()
    assert peer._proc.poll() is not None  # killed
    peer.close()
    monkeypatch.setenv(CRASH_ENV, "hf@load")
    peer = IsolatedPeer("hf", str(tiny_dir("llama")), [0])
    with pytest.raises(PeerFailed, match=r"^crashed: signal 11 \(SIGSEGV\) while loading$"):
        peer.wait_ready()
    peer.close()


def test_kv_bytes_read_counts_a_sliding_layer_up_to_its_window():
    from types import SimpleNamespace

    from verispec.runners.costs import kv_bytes_read
    from verispec.models.config import FULL, SLIDING

    c = SimpleNamespace(layer_types=(SLIDING, FULL, SLIDING), sliding_window=100, num_kv_heads=2, head_dim=8)
    per_position = c.num_kv_heads * c.head_dim * 2 * 4
    assert kv_bytes_read(c, 512, 4) == (100 + 512 + 100) * per_position
    assert kv_bytes_read(c, 50, 4) == 3 * 50 * per_position
    assert kv_bytes_read(c, 512, 34 / 32) == int((100 + 512 + 100) * per_position / 4 * 34 / 32)


def test_prefix_caching_serves_later_turns_from_the_cache_and_changes_no_token(tiny_dir, tmp_path):
    """--prefix-caching: every method of ours keeps its own cache, so a multi-turn question's second
    turn takes (at least) the first turn's prompt from it; the tokens stay those of plain decoding
    without a cache (control: the same run without the flag, where nothing is cached)."""
    questions = tmp_path / "question.jsonl"
    first = " ".join(f"w{5 + i % 7}" for i in range(40))  # 40 words: two 16-token blocks at least
    rows = [{"question_id": 0, "category": "writing", "turns": [first, "w8 w9 w8 w9"]},
            {"question_id": 1, "category": "qa", "turns": ["w16 w17"]}]
    questions.write_text("\n".join(json.dumps(r) for r in rows))
    runs = {}
    for flag in ([], ["--prefix-caching"]):
        out = tmp_path / ("pc" if flag else "none")
        assert main(["bench", "--model", str(tiny_dir("llama")), "--questions", str(questions), "--limit", "1",
                     "--max-tokens", "24", "--methods", "plain,prompt_lookup,suffix", "--out", str(out), *flag]) == 0
        runs[bool(flag)] = json.loads((out / "results.json").read_text())
    cached, fresh = runs[True], runs[False]
    assert cached["config"]["prefix_caching"] and not fresh["config"]["prefix_caching"]
    assert cached["mismatches"] == [] and fresh["mismatches"] == []
    tokens = lambda data: {(r["question_id"], r["method"]): r["new_tokens"] for r in data["records"]}
    assert tokens(cached) == tokens(fresh)
    assert all(r["cached_prompt_tokens"] == 0 for r in fresh["records"])
    for r in cached["records"]:
        if r["subtask"] == "multi_turn":  # turn 2 starts with turn 1's prompt and answer: 16-token blocks of them
            assert r["cached_prompt_tokens"] >= 32, r
    assert "prefix caching" in (tmp_path / "pc" / "report.md").read_text()
