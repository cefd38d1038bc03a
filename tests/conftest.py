import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tiny_models

from tiny_models import make_hf_model  # noqa: E402


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
