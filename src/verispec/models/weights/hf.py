"""A Hugging Face model folder (config.json, *.safetensors, tokenizer files) -> our ModelConfig,
weights in our names (q/k/v and gate/up fused) and tokenizer. `LoadedModel` is what every loader
returns (GGUF files: loaders.py)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from verispec.errors import ModelNotFoundError
from verispec.models.config import ModelConfig, config_from_hf
from verispec.models.tokenizers.tokenizer import Tokenizer


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    source: str


def _fuse(weights: dict[str, torch.Tensor], out: str, parts: list[str]) -> None:
    if all(p in weights for p in parts):
        weights[out] = torch.cat([weights.pop(p) for p in parts], dim=0).contiguous()


def hf_to_ours(config: ModelConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename and fuse a Hugging Face state dict (Llama/Qwen/Gemma 3 naming) into ours."""
    w: dict[str, torch.Tensor] = {}
    gemma = config.arch == "gemma3"
    for name, t in hf.items():
        name = name.removeprefix("model.language_model.").removeprefix("language_model.")
        name = name.removeprefix("model.")
        t = t.float() if t.is_floating_point() else t
        if name.startswith("layers."):
            i, rest = name.split(".", 2)[1:]
            rest = {
                "input_layernorm.weight": "attn_norm.weight",
                "self_attn.q_norm.weight": "q_norm.weight",
                "self_attn.k_norm.weight": "k_norm.weight",
                "self_attn.o_proj.weight": "o.weight",
                "post_attention_layernorm.weight": "post_attn_norm.weight" if gemma else "mlp_norm.weight",
                "pre_feedforward_layernorm.weight": "mlp_norm.weight",
                "post_feedforward_layernorm.weight": "post_mlp_norm.weight",
                "mlp.down_proj.weight": "down.weight",
            }.get(rest, rest)
            name = f"layers.{i}.{rest}"
        elif name == "embed_tokens.weight":
            name = "embed.weight"
        if gemma and name.endswith("norm.weight"):
            t = t + config.norm_offset
        w[name] = t
    for i in range(config.num_layers):
        p = f"layers.{i}."
        for kind in ("weight", "bias"):
            _fuse(w, p + f"qkv.{kind}", [p + f"self_attn.{x}_proj.{kind}" for x in "qkv"])
        _fuse(w, p + "gate_up.weight", [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"])
    if config.tie_embeddings:
        w.pop("lm_head.weight", None)
    return w


def load_hf_folder(path: Path) -> LoadedModel:
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise ModelNotFoundError(f"{path} has no config.json: not a Hugging Face model folder")
    config = config_from_hf(json.loads(cfg_path.read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"{path} has no *.safetensors weights")
    hf: dict[str, torch.Tensor] = {}
    for f in files:
        hf.update(load_file(str(f)))
    tokenizer = Tokenizer.from_hf_folder(path)
    if not config.eos_token_ids and tokenizer.eos_token_ids:
        config = dataclasses.replace(config, eos_token_ids=tokenizer.eos_token_ids)
    return LoadedModel(config, hf_to_ours(config, hf), tokenizer, str(path))
