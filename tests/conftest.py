import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tiny_models

from tiny_models import make_hf_model  # noqa: E402

from verispec.models import rowwise  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """Factory: a saved tiny random HF model of a kind, built once per (kind, seed, vocab)."""
    made: dict = {}

    def make(kind: str = "llama", seed: int = 0, vocab: int = 96, layers: int = 2) -> Path:
        key = (kind, seed, vocab, layers)
        if key not in made:
            folder = tmp_path_factory.mktemp(f"{kind}-{seed}-{vocab}")
            make_hf_model(kind, folder, seed=seed, vocab=vocab, layers=layers)
            made[key] = folder
        return made[key]

    return make


@pytest.fixture(scope="session", autouse=True)
def _quiet_threads():
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(params=["kernel", "mkl"])
def products(request, monkeypatch):
    """Both ways of computing decoding rows' products: the row-wise kernel (where this CPU has it)
    and MKL's (as on a CPU without AVX-512)."""
    if request.param == "mkl":
        monkeypatch.setitem(rowwise._state, "module", None)
    else:
        assert rowwise.kernel() is not None, "the row-wise kernel should build on this machine (AVX-512)"
    return request.param
