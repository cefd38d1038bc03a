"""Tiny random Hugging Face models, built inside the tests (no hub, no downloads)."""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
import torch
from tokenizers import models, pre_tokenizers

VOCAB = 96

KINDS = ("llama", "qwen2", "qwen3", "gemma3")


def hf_config(kind: str, vocab: int = VOCAB, layers: int = 2):
    import transformers as tf

    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if kind == "llama":
        return tf.LlamaConfig(**common, rope_theta=10000.0, tie_word_embeddings=False)
    if kind == "llama3":
        return tf.LlamaConfig(
            **common,
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        )
    if kind == "qwen2":
        return tf.Qwen2Config(**common, tie_word_embeddings=True)
    if kind == "qwen3":
        return tf.Qwen3Config(**common, head_dim=32, tie_word_embeddings=False)
    if kind == "gemma3":
        common["num_hidden_layers"] = max(layers, 3)
        return tf.Gemma3TextConfig(
            **common,
            head_dim=32,
            sliding_window=8,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"]
            + ["sliding_attention"] * (common["num_hidden_layers"] - 3),
            query_pre_attn_scalar=24,
        )
    raise ValueError(kind)


def make_hf_model(kind: str, folder: Path, seed: int = 0, vocab: int = VOCAB, layers: int = 2, tokenizer: str = "word"):
    """Save a random model of `kind` with a word-level tokenizer (or a byte-level BPE one,
    tokenizer="bytes", vocab >= 259) to `folder`; return the HF model."""
    import transformers as tf

    torch.manual_seed(seed)
    config = hf_config(kind, vocab, layers)
    cls = tf.Gemma3ForCausalLM if kind == "gemma3" else tf.AutoModelForCausalLM
    model = cls.from_config(config) if cls is tf.AutoModelForCausalLM else cls(config)
    model = model.float().eval()
    with torch.no_grad():  # random init is tiny; widen it so logits are not near-uniform ties
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3) if kind == "gemma3" else p.uniform_(0.7, 1.3)
            else:
                p.normal_(0.0, 0.15)
    model.save_pretrained(folder, safe_serialization=True)
    (save_byte_tokenizer if tokenizer == "bytes" else save_word_tokenizer)(folder, vocab)
    return model


def save_byte_tokenizer(folder: Path, vocab: int) -> None:
    """A byte-level BPE tokenizer (as GPT-2's, SmolLM2's): 3 special tokens, the 256 bytes, then
    merges up to `vocab` tokens (JSON punctuation first, then letter pairs), so grammars see
    tokens of one byte and of several."""
    from tokenizers import decoders

    ids = {"<pad>": 0, "<s>": 1, "</s>": 2}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        ids[ch] = len(ids)
    merges = [("{", '"'), ('"', ":"), ('":', "Ġ"), (",", "Ġ"), ("Ġ", '"'), ("t", "r"), ("tr", "u"), ("tru", "e")]
    letters = "abcdefghijklmnopqrstuvwxyz"
    merges += [(a, b) for a in letters for b in letters]
    for a, b in merges:
        if len(ids) >= vocab:
            break
        if a + b not in ids:
            ids[a + b] = len(ids)
    kept = [(a, b) for a, b in merges if a + b in ids]
    tok = tokenizers.Tokenizer(models.BPE(ids, kept))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(
        bos_token="<s>", eos_token="</s>",
        chat_template="{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                      "{% if add_generation_prompt %}<assistant>{% endif %}")))


def save_word_tokenizer(folder: Path, vocab: int = VOCAB) -> None:
    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(3, vocab)]
    tok = tokenizers.Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            dict(
                bos_token="<s>",
                eos_token="</s>",
                chat_template="{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                "{% if add_generation_prompt %}w3 {% endif %}",
            )
        )
    )


def write_eagle3_head(folder: Path, hidden: int = 64, target_vocab: int = VOCAB, draft_vocab: int = 40, seed: int = 0,
                      aux_layers: list[int] | None = None, vllm_names: bool = False, heads: int = 4, kv_heads: int = 2,
                      scale: float = 0.2, dtype: torch.dtype = torch.float16) -> Path:
    """An EAGLE-3 head written the way the published checkpoints are (names and shapes from the
    SpecForge / vLLM format, independently of verispec's own writer): random weights, float16
    (or `dtype`)."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    head_dim = hidden // heads
    inter = 2 * hidden

    def r(*shape):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    layer = "model.layers.0." if vllm_names else "midlayer."
    tensors = {
        "fc.weight": r(hidden, 3 * hidden),
        layer + "input_layernorm.weight": torch.ones(hidden).to(dtype),
        layer + "hidden_norm.weight": torch.ones(hidden).to(dtype),
        layer + "self_attn.q_proj.weight": r(heads * head_dim, 2 * hidden),
        layer + "self_attn.k_proj.weight": r(kv_heads * head_dim, 2 * hidden),
        layer + "self_attn.v_proj.weight": r(kv_heads * head_dim, 2 * hidden),
        layer + "self_attn.o_proj.weight": r(hidden, heads * head_dim),
        layer + "post_attention_layernorm.weight": torch.ones(hidden).to(dtype),
        layer + "mlp.gate_proj.weight": r(inter, hidden),
        layer + "mlp.up_proj.weight": r(inter, hidden),
        layer + "mlp.down_proj.weight": r(hidden, inter),
        "norm.weight": torch.ones(hidden).to(dtype),
        "lm_head.weight": r(draft_vocab, hidden),
    }
    ids = torch.randperm(target_vocab, generator=g)[:draft_vocab].sort().values  # target ids of the draft vocabulary
    tensors["d2t"] = ids - torch.arange(draft_vocab)
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
              "hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "intermediate_size": inter, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": target_vocab,
              "draft_vocab_size": draft_vocab, "hidden_act": "silu", "torch_dtype": str(dtype).removeprefix("torch.")}
    if aux_layers is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_layers}
    (folder / "config.json").write_text(json.dumps(config))
    return folder
