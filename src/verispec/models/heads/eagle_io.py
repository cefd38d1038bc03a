"""EAGLE head checkpoints in the format vLLM, SGLang and SpecForge read and write.

A folder with `config.json` and safetensors (or the EAGLE repository's `pytorch_model.bin`):

    config.json   architectures ["LlamaForCausalLMEagle3"] (also Eagle3LlamaForCausalLM, or the
                  EAGLE repository's LlamaForCausalLM), num_hidden_layers 1, hidden_size,
                  num_attention_heads, num_key_value_heads, [head_dim], intermediate_size,
                  rms_norm_eps, rope_theta, [rope_scaling], vocab_size (the target's),
                  draft_vocab_size, [target_hidden_size],
                  [eagle_config.eagle_aux_hidden_state_layer_ids], [norm_before_residual]
    fc.weight                                [H, 3 * H_target]   (EAGLE-1/2: [H, 2H], maybe a bias)
    midlayer.input_layernorm.weight          [H]                 (EAGLE-3 only)
    midlayer.hidden_norm.weight              [H]                 (EAGLE-3 only)
    midlayer.self_attn.{q,k,v}_proj.weight   [heads * D or kv_heads * D, 2H]   (EAGLE-1/2: H)
    midlayer.self_attn.o_proj.weight         [H, heads * D]
    midlayer.post_attention_layernorm.weight [H]
    midlayer.mlp.{gate,up}_proj.weight       [I, H];  midlayer.mlp.down_proj.weight [H, I]
    norm.weight                              [H]                 (EAGLE-3 only)
    lm_head.weight                           [draft_vocab, H]    (EAGLE-1/2: the target's when absent)
    d2t [draft_vocab] int64 (target id = draft id + d2t[id]);  t2d [vocab] bool
    embed_tokens.weight                      [vocab, H]          optional: the target's when absent

Tensor names are accepted with a `model.` prefix and with `layers.0.` for `midlayer.` (vLLM's
and the EAGLE repository's spellings); verispec writes the names above.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from verispec.errors import IncompatibleDraftError, ModelNotFoundError
from verispec.models.config import RopeConfig
from verispec.models.heads.eagle import HeadConfig, default_aux_layers

EAGLE3_ARCHS = {"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def _rope(cfg: dict) -> RopeConfig:
    theta = float(cfg.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "llama3":
        return RopeConfig(theta, "llama3", float(scaling["factor"]), float(scaling.get("low_freq_factor", 1.0)),
                          float(scaling.get("high_freq_factor", 4.0)), int(scaling.get("original_max_position_embeddings", 8192)))
    if kind == "linear":
        return RopeConfig(theta, "linear", float(scaling["factor"]))
    return RopeConfig(theta)


def _normalise(name: str) -> str:
    name = name.removeprefix("model.")
    return "midlayer." + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for f in files:
            tensors.update(load_file(str(f)))
    elif (folder / "pytorch_model.bin").exists():
        tensors = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ModelNotFoundError(f"no *.safetensors or pytorch_model.bin in the draft head folder {folder}")
    return {_normalise(k): v for k, v in tensors.items()}


def load_head(path: str | Path, target_hidden_size: int, target_vocab_size: int) -> tuple[HeadConfig, dict[str, torch.Tensor]]:
    """A head's configuration and float32 weights, checked against the target's sizes."""
    folder = Path(path).expanduser()
    if folder.is_file():
        folder = folder.parent
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"no EAGLE head at {path}: expected a folder with config.json and model.safetensors")
    cfg = json.loads((folder / "config.json").read_text())
    w = read_weights(folder)
    w = {k: (v if k in ("d2t", "t2d") else v.float()) for k, v in w.items()}
    if "fc.weight" not in w:
        raise IncompatibleDraftError(f"{folder}: not an EAGLE head (no fc.weight among {sorted(w)[:8]})")
    H = int(cfg["hidden_size"])
    fc_in = w["fc.weight"].shape[1]
    kind = "eagle1" if fc_in == 2 * H and "midlayer.hidden_norm.weight" not in w else "eagle3"
    target_h = int(cfg.get("target_hidden_size") or (fc_in // 3 if kind == "eagle3" else H))
    if target_h != target_hidden_size:
        raise IncompatibleDraftError(f"the head reads target states of width {target_h}; this target's are {target_hidden_size}")
    vocab = int(cfg.get("vocab_size", target_vocab_size))
    if vocab != target_vocab_size:
        raise IncompatibleDraftError(f"the head was made for a vocabulary of {vocab} tokens; the target has {target_vocab_size}")
    heads = int(cfg["num_attention_heads"])
    aux = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    lm_rows = w["lm_head.weight"].shape[0] if "lm_head.weight" in w else vocab
    config = HeadConfig(
        kind=kind, hidden_size=H, num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
        head_dim=int(cfg.get("head_dim") or H // heads), intermediate_size=int(cfg["intermediate_size"]),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope=_rope(cfg), vocab_size=vocab,
        draft_vocab_size=int(cfg.get("draft_vocab_size") or lm_rows), target_hidden_size=target_h,
        aux_layers=tuple(int(i) for i in aux) if aux else None,
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
    )
    if lm_rows != config.draft_vocab_size:
        raise IncompatibleDraftError(f"lm_head has {lm_rows} rows but draft_vocab_size is {config.draft_vocab_size}")
    if "d2t" in w:
        w["d2t"] = w["d2t"].long()
        top = int((torch.arange(config.draft_vocab_size) + w["d2t"]).max())
        if w["d2t"].shape[0] != config.draft_vocab_size or top >= vocab:
            raise IncompatibleDraftError(f"d2t maps draft ids outside the target's vocabulary of {vocab}")
    elif config.draft_vocab_size != vocab:
        raise IncompatibleDraftError(f"a draft vocabulary of {config.draft_vocab_size} tokens needs d2t")
    return config, w


def save_head(path: str | Path, config: HeadConfig, weights: dict[str, torch.Tensor], target_num_layers: int,
              dtype: torch.dtype = torch.float16, extra: dict | None = None) -> Path:
    """Write an EAGLE-3 head (floating tensors in `dtype`, d2t int64, t2d bool) and its config.json."""
    from safetensors.torch import save_file

    c = config
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": c.hidden_size, "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim, "intermediate_size": c.intermediate_size, "hidden_act": "silu",
        "rms_norm_eps": c.rms_eps, "rope_theta": c.rope.theta, "max_position_embeddings": 8192,
        "vocab_size": c.vocab_size, "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
        "tie_word_embeddings": False, "torch_dtype": str(dtype).removeprefix("torch."),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(c.aux_layers or default_aux_layers(target_num_layers)),
                         "use_aux_hidden_state": True},
        **(extra or {}),
    }
    tensors = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous() for k, v in weights.items()
               if k != "embed_tokens.weight"}
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return folder
