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
