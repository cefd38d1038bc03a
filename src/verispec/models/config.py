"""ModelConfig: the one description of an architecture our decoder understands.

Both loaders (Hugging Face folder, GGUF file) translate their metadata into this dataclass;
the decoder reads nothing else. Architectures differ by small named switches, not by forked
model files.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from verispec.errors import UnsupportedModelError

FULL = "full_attention"
SLIDING = "sliding_attention"


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of one kind of layer."""

    theta: float = 10000.0
    kind: str = "default"  # "default" | "linear" | "llama3"
    factor: float = 1.0
    # llama3 only
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    # GGUF (llama.cpp) stores Llama 3.1+ scaling as per-frequency divisors instead
    freq_factors: tuple[float, ...] | None = None


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # "llama" (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5, Qwen3) | "gemma3"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    max_position: int
    rope: RopeConfig = field(default_factory=RopeConfig)
    rope_local: RopeConfig | None = None  # Gemma 3 sliding-window layers
    layer_types: tuple[str, ...] = ()  # FULL / SLIDING per layer; empty = all FULL
    sliding_window: int | None = None
    qkv_bias: bool = False  # Qwen2/2.5
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over head_dim on q and k
    norm_offset: float = 0.0  # Gemma: weights are stored as w, applied as (1 + w)
    sandwich_norm: bool = False  # Gemma 3: post-attention and post-feed-forward norms
    embed_scale: float = 1.0  # Gemma: embeddings times sqrt(hidden)
    activation: str = "silu"  # "silu" | "gelu_tanh"
    attn_scale: float | None = None  # None = head_dim ** -0.5
    tie_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL,) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise UnsupportedModelError(
                f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers"
            )
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"{self.num_heads} attention heads are not a multiple of {self.num_kv_heads} KV heads"
            )

    @property
    def scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else self.head_dim**-0.5

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        raw = json.loads(text)
        raw["rope"] = _rope_from_json(raw["rope"])
        if raw.get("rope_local") is not None:
            raw["rope_local"] = _rope_from_json(raw["rope_local"])
        raw["layer_types"] = tuple(raw["layer_types"])
        raw["eos_token_ids"] = tuple(raw["eos_token_ids"])
        return cls(**raw)


def _rope_from_json(raw: dict[str, Any]) -> RopeConfig:
    if raw.get("freq_factors") is not None:
        raw = {**raw, "freq_factors": tuple(raw["freq_factors"])}
    return RopeConfig(**raw)


# ---------------------------------------------------------------------------------------------
# Hugging Face config.json -> ModelConfig

_LLAMA_LIKE = {
    "LlamaForCausalLM": dict(),
    "MistralForCausalLM": dict(),
    "Qwen2ForCausalLM": dict(qkv_bias=True),
    "Qwen3ForCausalLM": dict(qk_norm=True),
}
_GEMMA3 = {"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"}


def _rope_from_hf(params: dict[str, Any] | None, default_theta: float) -> RopeConfig:
    params = dict(params or {})
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    theta = float(params.get("rope_theta", default_theta))
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "linear":
        return RopeConfig(theta=theta, kind="linear", factor=float(params["factor"]))
    if kind == "llama3":
        return RopeConfig(
            theta=theta,
            kind="llama3",
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position=int(params["original_max_position_embeddings"]),
        )
    raise UnsupportedModelError(f"RoPE scaling type {kind!r} is not supported (default, linear, llama3 are)")


def _eos_ids(raw: Any) -> tuple[int, ...]:
    if raw is None:
        return ()
    if isinstance(raw, int):
        return (raw,)
    return tuple(int(x) for x in raw)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    """Translate a Hugging Face `config.json` dict. Raises UnsupportedModelError for others."""
    archs = cfg.get("architectures") or []
    arch_name = archs[0] if archs else cfg.get("model_type", "?")
    if cfg.get("text_config"):  # multimodal wrappers keep the decoder in text_config
        inner = dict(cfg["text_config"])
        inner.setdefault("architectures", ["Gemma3ForCausalLM"] if arch_name in _GEMMA3 else archs)
        return config_from_hf(inner)
    if arch_name in _LLAMA_LIKE:
        return _llama_from_hf(cfg, **_LLAMA_LIKE[arch_name])
    if arch_name in _GEMMA3 or cfg.get("model_type") == "gemma3_text":
        return _gemma3_from_hf(cfg)
    supported = ", ".join(sorted([*_LLAMA_LIKE, "Gemma3ForCausalLM"]))
    raise UnsupportedModelError(f"architecture {arch_name!r} is not supported; supported: {supported}")


def _common_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    return dict(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(cfg["intermediate_size"]),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position=int(cfg.get("max_position_embeddings", 4096)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
    )


def _llama_from_hf(cfg: dict[str, Any], qkv_bias: bool = False, qk_norm: bool = False) -> ModelConfig:
    common = _common_hf(cfg)
    rope_params = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    rope = _rope_from_hf(rope_params, float(cfg.get("rope_theta", 10000.0)))
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    layer_types = tuple(cfg.get("layer_types") or ())
    if window and not layer_types:
        layer_types = (SLIDING,) * common["num_layers"]
    if cfg.get("mlp_bias") or (cfg.get("attention_bias") and not qkv_bias):
        raise UnsupportedModelError("biases on the MLP or attention output are not supported")
    return ModelConfig(
        arch="llama",
        rope=rope,
        layer_types=layer_types,
        sliding_window=int(window) if window else None,
        qkv_bias=qkv_bias or bool(cfg.get("attention_bias", False)),
        qk_norm=qk_norm,
        activation=_activation(cfg.get("hidden_act", "silu")),
        **common,
    )


def _activation(name: str) -> str:
    if name in ("silu", "swish"):
        return "silu"
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return "gelu_tanh"
    raise UnsupportedModelError(f"activation {name!r} is not supported")


def _gemma3_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    common = _common_hf(cfg)
    common["tie_embeddings"] = bool(cfg.get("tie_word_embeddings", True))
    n = common["num_layers"]
    layer_types = cfg.get("layer_types")
    if not layer_types:
        pattern = int(cfg.get("sliding_window_pattern", 6))
        layer_types = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n)]
    rope_params = cfg.get("rope_parameters")
    if rope_params and FULL in rope_params:
        rope = _rope_from_hf(rope_params[FULL], 1_000_000.0)
        rope_local = _rope_from_hf(rope_params.get(SLIDING), 10_000.0)
    else:
        rope = _rope_from_hf(cfg.get("rope_scaling"), float(cfg.get("rope_theta", 1_000_000.0)))
        rope_local = RopeConfig(theta=float(cfg.get("rope_local_base_freq", 10_000.0)))
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key):
            raise UnsupportedModelError(f"Gemma 3 with {key} is not supported")
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedModelError("bidirectional attention is not supported")
    return ModelConfig(
        arch="gemma3",
        rope=rope,
        rope_local=rope_local,
        layer_types=tuple(layer_types),
        sliding_window=int(cfg.get("sliding_window") or 4096),
        qk_norm=True,
        norm_offset=1.0,
        sandwich_norm=True,
        embed_scale=math.sqrt(common["hidden_size"]),
        activation=_activation(cfg.get("hidden_activation", "gelu_pytorch_tanh")),
        attn_scale=float(cfg.get("query_pre_attn_scalar", common["head_dim"])) ** -0.5,
        **common,
    )
