"""scripts/readme_table.py: the README's performance table from synthetic results files.

Each run's figures are chosen so that every cell can be computed by hand: a question's tok/s is
new_tokens / wall_time, a method's tok/s the mean over questions, a speedup the ratio of means.
"""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "readme_table.py"


@pytest.fixture(scope="module")
def table():
    spec = importlib.util.spec_from_file_location("readme_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(q: int, method: str, tokens: int, wall: float, matches=None) -> dict:
    return {"question_id": q, "subtask": "qa", "method": method, "new_tokens": tokens, "wall_time": wall,
            "ttft": 0.01, "target_forwards": tokens, "accepted_lengths": [], "accepted_per_position": [],
            "process_peak_rss_mb": 1.0, "matches_plain": matches, "first_mismatch": None}


def _write_run(folder: Path, model: str, created: str, speeds: dict[str, tuple[float, float]],
               questions=None, readme: str | None = None) -> None:
    """speeds: method -> (tok/s on question 1, on question 2), each question 100 new tokens."""
    folder.mkdir(parents=True)
    records = []
    for method, (s1, s2) in speeds.items():
        spec = method.partition("@")[0] not in ("plain", "llamacpp", "hf")
        records += [_record(1, method, 100, 100 / s1, True if spec else None),
                    _record(2, method, 100, 100 / s2, False if method == "prompt_lookup" else True if spec else None)]
    config = {"model": model, "methods": list(speeds), "categories": None, "limit": 1, "max_tokens": 64,
              "temperature": 0.0, "k": 8, "questions": questions, "adaptive_k": True, "prefix_caching": False}
    data = {"config": config, "skipped": {}, "failed": {}, "mismatches": [], "records": records, "created": created}
    (folder / "results.json").write_text(json.dumps(data))
    if readme:
        (folder / "README.md").write_text(readme)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    root = tmp_path / "docs" / "results"
    # an older Spec-Bench run of model-a: not the latest, so none of its figures may appear
    _write_run(root / "old-a", "model-a", "2030-01-01 10:00:00", {"plain": (1.0, 1.0), "suffix": (9.0, 9.0)})
    # the latest Spec-Bench run of model-a, its commit and CPU in its README
    _write_run(root / "new-a", "model-a", "2030-01-02 10:00:00",
               {"plain": (100.0, 50.0), "prompt_lookup": (120.0, 60.0), "suffix": (200.0, 100.0),
                "plain@torch:gguf-int8": (200.0, 100.0), "suffix@torch:gguf-int8": (300.0, 300.0),
                "llamacpp": (40.0, 20.0)},
               readme="Code of abc1234 (notes), 09:00-10:00 UTC, shared 2-core Intel Xeon\n(AVX-512, AMX). More.")
    # a later run of model-a on another workload: not Spec-Bench, left out
    _write_run(root / "rep-a", "model-a", "2030-01-03 10:00:00", {"plain": (1.0, 1.0), "suffix": (5.0, 5.0)},
               questions="repetitive")
    # a multi-model run's layout: <run>/<model>/results.json, the commit in the run's README
    _write_run(root / "multi" / "model-b", "/models/model-b", "2030-01-01 12:00:00",
               {"plain": (10.0, 30.0), "hf": (5.0, 5.0)})
    (root / "multi" / "README.md").write_text("code of 1234567")
    return root


def test_the_table_holds_each_models_latest_spec_bench_run(table, results):
    readme_dir = results.parent.parent
    block = table.render(results, readme_dir)
    rows = [line for line in block.splitlines() if line.startswith("| model-")]
    assert rows == [
        "| model-a | verispec, torch backend, default weights (exact) | 75.0 | `suffix` | 150.0 | 2.00x | 2/2 |",
        "| model-a | verispec, torch backend, `gguf-int8` (int8 activations) | 150.0 | `suffix@torch:gguf-int8` "
        "| 300.0 | 2.00x | 2/2 |",
        "| model-a | llama-cpp-python `Llama.generate` (a Python loop, not native llama.cpp speed) | 30.0 | - | - | - | - |",
        "| model-b | verispec, torch backend, default weights (exact) | 20.0 | - | - | - | - |",
        "| model-b | Hugging Face transformers `generate` | 5.0 | - | - | - | - |",
    ]
    captions = [line for line in block.splitlines() if line.startswith("- **")]
    assert captions == [
        "- **model-a**: run of 2030-01-02, code of abc1234, shared 2-core Intel Xeon (AVX-512, AMX); 2 questions "
        "(1 per subtask), up to 64 new tokens per turn, greedy, k up to 8, chosen per step; "
        "[report](docs/results/new-a/report.md)",
        "- **model-b**: run of 2030-01-01, code of 1234567, CPU not recorded; 2 questions (1 per subtask), up to 64 "
        "new tokens per turn, greedy, k up to 8, chosen per step; [report](docs/results/multi/model-b/report.md)",
    ]
    assert "[docs/results/](docs/results/README.md)" in block
    assert block == table.render(results, readme_dir)  # deterministic


def test_check_fails_on_a_stale_block_and_passes_once_rewritten(table, results):
    readme = results.parent.parent / "README.md"
    readme.write_text(f"# Title\n\n{table.START}\n| stale | table |\n{table.END}\n\nAfter.\n")
    args = ["--readme", str(readme), "--results", str(results)]
    assert table.main([*args, "--check"]) == 1
    assert table.main(args) == 0
    text = readme.read_text()
    assert "stale" not in text and text.startswith("# Title\n\n") and text.endswith(f"{table.END}\n\nAfter.\n")
    assert "| model-a | verispec, torch backend, default weights (exact) | 75.0 |" in text
    assert table.main([*args, "--check"]) == 0
