"""GGUF files -> (ModelConfig, weights in our names, tokenizer); Hugging Face folders: hf.py.

A GGUF file loads in one of two ways:
- `load_gguf_blocks`: its blocks stay as they are in the file, memory-mapped (models/kernels/quant.py's
  QuantTensor; the row-wise kernels multiply by them). Nothing is converted: the first load costs
  reading the tokenizer and hashing the file, later ones reuse the cached config and tokenizer.
- `load_gguf`: dequantised to float32 once, the result (weights, config, tokenizer) cached on disk
  keyed by the file's SHA-256, so a second load is a memory map of safetensors (the path without
  the kernels: another dtype, VERISPEC_KERNELS=0).
"""

from __future__ import annotations

import dataclasses
import json
import math
import mmap
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from verispec.errors import UnsupportedModelError, UnsupportedWeightFormatError
from verispec.models.cache import cache_root, file_sha256, log
from verispec.models.config import FULL, SLIDING, ModelConfig, RopeConfig
from verispec.models.weights.gguf_file import GGUFFile, GGUFTensorInfo
from verispec.models.tokenizers.tokenizer import Tokenizer
from verispec.models.weights.hf import LoadedModel

CACHE_VERSION = "3"
META_CACHE_VERSION = "4"  # 4: SentencePiece vocabularies cached as the compact tokenizer (spm.json)


# ---------------------------------------------------------------------------------------------
# GGUF file

_GGUF_ARCHS = {"llama", "mistral", "qwen2", "qwen3", "gemma3"}


def load_gguf(path: Path) -> LoadedModel:
    digest = file_sha256(path)
    folder = cache_root() / f"gguf-{digest[:24]}-v{CACHE_VERSION}"
    if not (folder / "done").exists():
        shutil.rmtree(folder, ignore_errors=True)  # a partial folder left by a crashed older version
        _convert_to_cache(path, folder)
        for stale in folder.parent.glob(f"gguf-{digest[:24]}-v*"):  # conversions by older versions
            if stale != folder and not stale.name.startswith(folder.name):
                shutil.rmtree(stale, ignore_errors=True)
    config = ModelConfig.from_json((folder / "config.json").read_text())
    weights = load_file(str(folder / "weights.safetensors"))
    return LoadedModel(config, weights, Tokenizer.load(folder), str(path))


def gguf_meta(path: Path) -> tuple[ModelConfig, Tokenizer, dict, str]:
    """A GGUF's config, tokenizer, table of tensors ({name: (type, shape, offset, bytes)}) and
    architecture: read once (gguf_file), then from the cache (keyed by the file's SHA-256).
    Reading the metadata once is one pass over the file's header (gguf_file); the cache then
    spares a later load that pass and the tokenizer's building."""
    digest = file_sha256(path)
    meta = cache_root() / f"gguf-{digest[:24]}-meta-v{META_CACHE_VERSION}"
    if (meta / "done").exists():
        table = json.loads((meta / "tensors.json").read_text())
        arch = table.pop("__arch__")
        return ModelConfig.from_json((meta / "config.json").read_text()), Tokenizer.load(meta), table, arch
    gf = GGUFFile(path)
    tokenizer = Tokenizer.from_gguf(gf.metadata)
    config = gguf_config(gf, tokenizer)
    freqs = next((t for t in gf.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
        config = _with_rope_freqs(config, gguf_dequantize(gf, freqs))
    arch = gf.architecture
    table = {t.name: (t.type, list(t.shape), t.offset, t.n_bytes) for t in gf.tensors}
    _save_meta(meta, config, tokenizer, path, {**table, "__arch__": arch})
    return config, tokenizer, table, arch


def load_gguf_blocks(path: Path, int8: bool = False) -> LoadedModel:
    """The GGUF's matrices as QuantTensors over a memory map of the file (nothing dequantised);
    norms and biases as float32 tensors. int8: products with int8 activations (weights_format
    "gguf-int8"), each matrix's 32-weight block rows (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) laid out as tiles (QuantTensor.tile_int8)
    as it loads, the file's pages of it dropped (_forget_pages) so that the copy is not resident twice. Config, tokenizer and the table of tensors (name, type,
    shape, offset) are cached beside the converted models, keyed by the file's SHA-256: a later
    load maps the file without reading its metadata or building its tokenizer again."""
    from verispec.models.kernels.quant import QuantTensor

    config, tokenizer, table, arch = gguf_meta(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="c")  # copy-on-write: writable views, the file untouched
    tensors = dict(table)

    def rows_of(name: str) -> tuple[np.ndarray, int, int]:
        """A tensor's rows as stored (uint8 blocks, or float32 for F32), its type and row width."""
        type_, shape, offset, nbytes = tensors.pop(name)
        n_rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        raw = mapped[offset : offset + nbytes].reshape(n_rows, -1)
        return (raw.view(np.float32) if type_ == 0 else raw), type_, int(shape[0])

    def matrix(*names: str, heads: tuple[int | None, ...] = ()) -> QuantTensor:
        from verispec.models.kernels.quant import FORMATS

        parts, types, width = [], [], 0
        for i, name in enumerate(names):
            data, type_, width = rows_of(name)
            if type_ not in FORMATS:
                import gguf

                kind = gguf.GGMLQuantizationType(type_).name if type_ in gguf.GGMLQuantizationType._value2member_map_ else f"type {type_}"
                raise UnsupportedWeightFormatError(
                    f"GGUF tensor {name} is {kind}, a format the row-wise kernels do not unpack (they do "
                    f"{', '.join(n for n, _, _ in FORMATS.values())}); load it as float32 (weights_format='float32')")
            n_head = heads[i] if i < len(heads) else None
            if n_head:  # llama.cpp's q/k row order -> ours: a permutation of whole rows of blocks
                data = np.ascontiguousarray(_reverse_permute(data, n_head))
                _, _, offset, nbytes = table[name]
                _forget_pages(mapped, offset, nbytes)
            parts.append(torch.from_numpy(data))
            types.append(type_)
        q = QuantTensor(parts, types, width)
        if int8:  # each chunk's file pages dropped once it is copied into tiles
            q.tile_int8(read=lambda i, start, end: _forget_pages(mapped, table[names[i]][2] + start, end - start))
            for name in names:  # and the pages astride two chunks, which neither chunk's range held whole
                _, _, offset, nbytes = table[name]
                _forget_pages(mapped, offset, nbytes)
        return q

    def vector(name: str) -> torch.Tensor:
        import gguf

        data, type_, _ = rows_of(name)
        values = data if type_ == 0 else gguf.quants.dequantize(data, gguf.GGMLQuantizationType(type_))
        return torch.from_numpy(np.array(values, dtype=np.float32).reshape(-1))

    w: dict = {"embed.weight": matrix("token_embd.weight"), "norm.weight": vector("output_norm.weight")}
    if "output.weight" in tensors:
        w["lm_head.weight"] = matrix("output.weight")
    qk_heads = (config.num_heads, config.num_kv_heads) if arch in ("llama", "mistral") else ()
    for i in range(config.num_layers):
        b = f"blk.{i}."
        w[f"layers.{i}.qkv.weight"] = matrix(*(b + f"attn_{x}.weight" for x in "qkv"), heads=qk_heads)
        if b + "attn_q.bias" in tensors:
            w[f"layers.{i}.qkv.bias"] = torch.cat([vector(b + f"attn_{x}.bias") for x in "qkv"])
        w[f"layers.{i}.gate_up.weight"] = matrix(b + "ffn_gate.weight", b + "ffn_up.weight")
        for src, dst in _GGUF_NAMES.items():
            if b + src in tensors:
                w[f"layers.{i}.{dst}"] = matrix(b + src) if dst in ("o.weight", "down.weight") else vector(b + src)
    tensors.pop("rope_freqs.weight", None)  # in the config (_with_rope_freqs)
    if tensors:
        raise UnsupportedModelError(f"GGUF tensors not understood: {list(tensors)[:5]}")
    return LoadedModel(config, w, tokenizer, str(path))


def _with_rope_freqs(config: ModelConfig, freqs: np.ndarray) -> ModelConfig:
    """Llama 3.1+: llama3 RoPE scaling as per-frequency divisors (the tensor rope_freqs)."""
    factors = tuple(float(x) for x in np.asarray(freqs).reshape(-1))
    if len(factors) != config.head_dim // 2:
        raise UnsupportedModelError(f"rope_freqs has {len(factors)} factors for head_dim {config.head_dim}")
    return dataclasses.replace(config, rope=dataclasses.replace(config.rope, freq_factors=factors))


def gguf_dequantize(gf: GGUFFile, t: GGUFTensorInfo, mapped: np.ndarray | None = None) -> np.ndarray:
    """The tensor as float32 in numpy's shape (owned, writable)."""
    import gguf

    try:
        kind = gguf.GGMLQuantizationType(t.type)
        return np.array(gguf.quants.dequantize(gf.tensor_data(t, mapped), kind), dtype=np.float32)
    except NotImplementedError as e:
        raise UnsupportedModelError(f"GGUF tensor type {kind.name} of {t.name} is not supported") from e


def _save_meta(folder: Path, config: ModelConfig, tokenizer: Tokenizer, path: Path, table: dict) -> None:
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "config.json").write_text(config.to_json())
        (tmp / "tensors.json").write_text(json.dumps(table))
        tokenizer.save(tmp)
        (tmp / "done").write_text(str(path))
        tmp.rename(folder)
    except OSError:  # another process finished first, or the cache is not writable
        shutil.rmtree(tmp, ignore_errors=True)


def _convert_to_cache(path: Path, folder: Path) -> None:
    """Convert into a private folder, then rename it into place: a concurrent loader never sees
    half-written files, and of two concurrent conversions the first rename wins."""
    log(f"converting {path.name} (first load; cached in {folder})")
    t0 = time.time()
    config, weights, tokenizer = convert_gguf(path)
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(weights, str(tmp / "weights.safetensors"))
    (tmp / "config.json").write_text(config.to_json())
    tokenizer.save(tmp)
    (tmp / "done").write_text(str(path))
    try:
        tmp.rename(folder)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"converted in {time.time() - t0:.1f}s")


def _forget_pages(mapped: np.memmap, offset: int, nbytes: int) -> None:
    """Drop the mapped pages of bytes [offset, offset + nbytes) of the file from this process
    (MADV_DONTNEED; only pages wholly inside the range): a tensor read once into a copy (q and k,
    permuted) would otherwise stay resident twice, as the file's pages and as the copy. The
    mapping is private and never written there, so nothing is lost; a later read would fetch the
    bytes from the file again."""
    page = mmap.PAGESIZE
    start = -(-offset // page) * page
    end = (offset + nbytes) // page * page
    raw = getattr(mapped, "_mmap", None)
    if raw is not None and end > start and hasattr(mmap, "MADV_DONTNEED"):
        mapped_from = mapped.offset - mapped.offset % mmap.ALLOCATIONGRANULARITY  # the file position of raw[0]
        raw.madvise(mmap.MADV_DONTNEED, start - mapped_from, end - start)


def _reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (its RoPE pairs adjacent dims; ours pairs halves)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_config(gf: GGUFFile, tokenizer: Tokenizer) -> ModelConfig:
    arch = gf.architecture
    if arch not in _GGUF_ARCHS:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported; supported: {', '.join(sorted(_GGUF_ARCHS))}"
        )
    g = lambda key, default=None: gf.get(f"{arch}.{key}", default)  # noqa: E731
    hidden = int(g("embedding_length"))
    heads = int(g("attention.head_count"))
    head_dim = int(g("attention.key_length", hidden // heads))
    n_layers = int(g("block_count"))
    names = {t.name for t in gf.tensors}
    vocab = int(g("vocab_size", 0) or tokenizer.vocab_size)
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=int(g("attention.head_count_kv", heads)),
        head_dim=head_dim,
        intermediate_size=int(g("feed_forward_length")),
        rms_eps=float(g("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position=int(g("context_length", 4096)),
        tie_embeddings="output.weight" not in names,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_ids=tokenizer.eos_token_ids,
    )
    scaling = g("rope.scaling.type")
    if scaling and scaling not in ("none", "linear"):
        raise UnsupportedModelError(f"GGUF RoPE scaling {scaling!r} is not supported")
    rope = RopeConfig(
        theta=float(g("rope.freq_base", 10000.0)),
        kind="linear" if scaling == "linear" else "default",
        factor=float(g("rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0,
    )
    if arch == "gemma3":
        # llama.cpp fixes the pattern (every 6th layer global) and the local RoPE base.
        layer_types = tuple(FULL if (i + 1) % 6 == 0 else SLIDING for i in range(n_layers))
        return ModelConfig(
            arch="gemma3",
            rope=rope,
            rope_local=RopeConfig(theta=10000.0),
            layer_types=layer_types,
            sliding_window=int(g("attention.sliding_window", 512)),
            qk_norm=True,
            norm_offset=1.0,
            sandwich_norm=True,
            embed_scale=math.sqrt(hidden),
            activation="gelu_tanh",
            # llama.cpp: query_pre_attn_scalar is hidden / heads for the 27B model, head_dim otherwise
            attn_scale=(hidden // heads if n_layers == 62 else head_dim) ** -0.5,
            **common,
        )
    window = g("attention.sliding_window")
    return ModelConfig(
        arch="llama",
        rope=rope,
        layer_types=(SLIDING,) * n_layers if window else (),
        sliding_window=int(window) if window else None,
        qkv_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        **common,
    )


_GGUF_NAMES = {
    "attn_norm.weight": "attn_norm.weight",
    "attn_q_norm.weight": "q_norm.weight",
    "attn_k_norm.weight": "k_norm.weight",
    "attn_output.weight": "o.weight",
    "post_attention_norm.weight": "post_attn_norm.weight",
    "ffn_norm.weight": "mlp_norm.weight",
    "post_ffw_norm.weight": "post_mlp_norm.weight",
    "ffn_down.weight": "down.weight",
}


def load_gguf_meta(path: Path) -> tuple[ModelConfig, Tokenizer]:
    """A GGUF's configuration and our tokenizer, without touching its weights (other backends);
    cached after the first read (gguf_meta)."""
    config, tokenizer, _, _ = gguf_meta(Path(path))
    return config, tokenizer


def convert_gguf(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    gf = GGUFFile(path)
    tokenizer = Tokenizer.from_gguf(gf.metadata)
    config = gguf_config(gf, tokenizer)
    permute = gf.architecture in ("llama", "mistral")
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    raw: dict[str, np.ndarray] = {}
    from tqdm import tqdm

    for t in tqdm(gf.tensors, desc=f"dequantising {path.name}", unit="tensor", file=sys.stderr, leave=False):
        raw[t.name] = gguf_dequantize(gf, t, mapped)
    w: dict[str, torch.Tensor] = {
        "embed.weight": torch.from_numpy(raw.pop("token_embd.weight")),
        "norm.weight": torch.from_numpy(raw.pop("output_norm.weight")),
    }
    if "output.weight" in raw:
        w["lm_head.weight"] = torch.from_numpy(raw.pop("output.weight"))
    for i in range(config.num_layers):
        b = f"blk.{i}."
        q, k, v = (raw.pop(b + f"attn_{x}.weight") for x in "qkv")
        if permute:
            q, k = _reverse_permute(q, config.num_heads), _reverse_permute(k, config.num_kv_heads)
        w[f"layers.{i}.qkv.weight"] = torch.from_numpy(np.concatenate([q, k, v]))
        if b + "attn_q.bias" in raw:
            w[f"layers.{i}.qkv.bias"] = torch.from_numpy(
                np.concatenate([raw.pop(b + f"attn_{x}.bias") for x in "qkv"])
            )
        w[f"layers.{i}.gate_up.weight"] = torch.from_numpy(
            np.concatenate([raw.pop(b + "ffn_gate.weight"), raw.pop(b + "ffn_up.weight")])
        )
        for src, dst in _GGUF_NAMES.items():
            if b + src in raw:
                w[f"layers.{i}.{dst}"] = torch.from_numpy(raw.pop(b + src))
    if "rope_freqs.weight" in raw:
        config = _with_rope_freqs(config, raw.pop("rope_freqs.weight"))
    leftovers = list(raw)
    if leftovers:
        raise UnsupportedModelError(f"GGUF tensors not understood: {leftovers[:5]}")
    return config, {k: v.contiguous() for k, v in w.items()}, tokenizer
