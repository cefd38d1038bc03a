import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tiny_models

from tiny_models import make_hf_model  # noqa: E402

from verispec.models.kernels import rowwise  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """Factory: a saved tiny random HF model of a kind, built once per (kind, seed, vocab)."""
    made: dict = {}

    def make(kind: str = "llama", seed: int = 0, vocab: int = 96, layers: int = 2, tokenizer: str = "word") -> Path:
        key = (kind, seed, vocab, layers, tokenizer)
        if key not in made:
            folder = tmp_path_factory.mktemp(f"{kind}-{seed}-{vocab}")
            make_hf_model(kind, folder, seed=seed, vocab=vocab, layers=layers, tokenizer=tokenizer)
            made[key] = folder
        return made[key]

    return make


@pytest.fixture(scope="session", autouse=True)
def _quiet_threads():
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# The ways decoding rows' products can be computed here: every row-wise kernel variant this CPU
# runs (models/rowwise.py; "scalar" everywhere) and MKL's products ("mkl", as with VERISPEC_KERNELS=0).
PRODUCTS = [*rowwise.supported_variants(), "mkl"]
# the same without the plain C++ reference where a vector variant exists (tests on the real models)
FAST_PRODUCTS = [v for v in PRODUCTS if v != "scalar" or len(PRODUCTS) == 2]


def _use_products(param, monkeypatch):
    monkeypatch.setitem(rowwise._state, "module", None if param == "mkl" else rowwise.load_variant(param))
    return param


@pytest.fixture(params=PRODUCTS)
def products(request, monkeypatch):
    """Each kernel variant this CPU runs, then MKL's products; models built in the test use it."""
    return _use_products(request.param, monkeypatch)


@pytest.fixture(params=FAST_PRODUCTS)
def fast_products(request, monkeypatch):
    """As `products`, without the slow scalar reference where a vector variant exists."""
    return _use_products(request.param, monkeypatch)
