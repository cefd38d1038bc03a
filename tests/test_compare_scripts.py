"""scripts/compare_tokens.py and scripts/compare_speed.py (a refactor's before/after checks) on
synthetic bench results: identical runs pass, a planted token difference or slowdown fails."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(folder: Path, speeds: dict[str, float], tokens: dict[str, list[int]]) -> Path:
    records = [{"method": m, "question_id": q, "new_tokens": len(tokens[m]), "token_ids": tokens[m],
                "tokens_per_s": speeds[m] * (1 + q / 10), "matches_plain": tokens[m] == tokens["plain"] or None,
                "first_mismatch": None} for m in speeds for q in (1, 2)]
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"records": records}))
    return folder


SPEEDS = {"plain": 100.0, "suffix": 150.0}
TOKENS = {"plain": [1, 2, 3], "suffix": [1, 2, 3]}


def test_identical_runs_pass_and_a_changed_token_fails(tmp_path, capsys):
    tokens = _load("compare_tokens")
    _run(tmp_path / "before" / "m", SPEEDS, TOKENS)
    _run(tmp_path / "after" / "m", SPEEDS, TOKENS)
    assert tokens.main([str(tmp_path / "before"), str(tmp_path / "after")]) == 0
    _run(tmp_path / "changed" / "m", SPEEDS, {"plain": [1, 2, 3], "suffix": [1, 9, 3]})
    assert tokens.main([str(tmp_path / "before"), str(tmp_path / "changed")]) == 1
    assert "differs at new token 1" in capsys.readouterr().out


def test_speed_ratios_within_tolerance_pass_and_a_slowdown_fails(tmp_path, capsys):
    speed = _load("compare_speed")
    runs = [_run(tmp_path / name, SPEEDS, TOKENS) for name in ("b1", "a1", "b2", "a2")]
    assert speed.ratios(runs[0]) == {"suffix": 1.5}  # per question: 150 (1 + q/10) / 100 (1 + q/10)
    assert speed.main(["--before", str(runs[0]), str(runs[2]), "--after", str(runs[1]), str(runs[3])]) == 0
    slow = _run(tmp_path / "slow", {"plain": 100.0, "suffix": 140.0}, TOKENS)
    assert speed.main(["--before", str(runs[0]), "--after", str(slow)]) == 1
    assert "outside tolerance" in capsys.readouterr().out
