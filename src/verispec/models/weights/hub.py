"""Models named by their Hugging Face Hub id, resolved through `huggingface_hub` (its cache, its
offline mode), as a user's machine resolves them.

    Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:q4_k_m   the repository's one .gguf file of that quant
    HuggingFaceTB/SmolLM2-135M-Instruct            the repository's files (a Hugging Face folder)

Only the files asked for are downloaded (`allow_patterns`); with `HF_HUB_OFFLINE=1`, or once they
are in the hub cache, nothing goes over the network. A quant's name matches case-insensitively
(q4_k_m finds Q4_K_M).
"""

from __future__ import annotations

import re
from pathlib import Path

from verispec.errors import ModelNotFoundError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]+)?$")
FOLDER_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]  # a Hugging Face folder's config, weights, tokenizer


def is_hub_id(name: str) -> bool:
    """`org/repo` or `org/repo:quant`, and not a path that exists here."""
    return bool(HUB_ID.match(name)) and not Path(name).expanduser().exists()


def resolve_hub(name: str) -> Path:
    """The local path of a hub model: its GGUF file for `org/repo:quant`, its snapshot folder for
    `org/repo`; ModelNotFoundError saying why where it cannot be had."""
    repo, _, quant = name.partition(":")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError as e:
        raise ModelNotFoundError(f"{name}: hub models need the package huggingface_hub: pip install huggingface_hub") from e
    patterns = [f"*{q}*.gguf" for q in dict.fromkeys((quant, quant.lower(), quant.upper()))] if quant else FOLDER_FILES
    try:
        folder = Path(snapshot_download(repo, allow_patterns=patterns))
    except LocalEntryNotFoundError as e:
        raise ModelNotFoundError(
            f"{name}: not in the Hugging Face cache and the hub cannot be reached (offline: HF_HUB_OFFLINE is set, "
            f"or no network); download it where the hub is reachable, or give a local .gguf file or folder ({e})"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise ModelNotFoundError(f"{name}: the hub could not give its files: {e}") from None
    if not quant:
        if not (folder / "config.json").is_file():
            raise ModelNotFoundError(f"{name}: the repository has no config.json: name a GGUF quant as {repo}:<quant>")
        return folder
    found = sorted({p for pattern in patterns for p in folder.rglob(pattern)})
    if not found:
        raise ModelNotFoundError(f"{name}: no .gguf file of quant {quant!r} in {repo} (cached at {folder})")
    if len(found) > 1:
        raise ModelNotFoundError(f"{name}: several .gguf files match quant {quant!r}: "
                                 f"{', '.join(p.name for p in found)}; give the file's path instead")
    return found[0]
