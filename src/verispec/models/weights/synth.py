"""Synthetic Llama-architecture GGUF files with random weights, at sizes we cannot download.

    python -m verispec.models.weights.synth out.gguf --size 1b --quant q4_k_m

A random model's acceptance means nothing; its forward costs are real, so these files measure
tokens/s and memory against llama.cpp on the same bytes (scripts/quant_scale.py). The blocks are
written directly (random quants, random but sane float16 scales), never through float32, so a 3B
file streams out in seconds without 12 GB of floats. Mixes:
    q8_0    every matrix Q8_0
    q4_k_m  llama.cpp's Q4_K_M recipe: Q4_K, with Q6_K for attn_v, ffn_down (alternate layers
            from the first) and the output head; Q8_0 token embedding
    q4_0 / q4_1 / q5_0 / q6_k   every matrix in that format (tests)
The tokenizer is SentencePiece-style ("llama"): <unk>, <s>, </s>, the 256 byte tokens, then
"▁w<i>" words, enough to load and to decode ids.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verispec.models.kernels.quant import FORMATS

TYPES = {name: t for t, (name, _, _) in FORMATS.items()}  # "Q4_K" -> 12


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int = 0  # 0: hidden / heads

    @property
    def params(self) -> int:
        hd = self.head_dim or self.hidden // self.heads
        attn = self.hidden * hd * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp) + 2 * self.vocab * self.hidden


# Llama 3.2 1B and 3B shapes (untied head), with a 32,000-word vocabulary
SIZES = {
    "tiny": Shape(hidden=256, layers=2, heads=4, kv_heads=2, intermediate=512, vocab=512),
    "1b": Shape(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=32000, head_dim=64),
    "3b": Shape(hidden=3072, layers=28, heads=24, kv_heads=8, intermediate=8192, vocab=32000, head_dim=128),
}


def mix_types(mix: str, role: str, layer: int, layers: int) -> str:
    """The format of one matrix (role: attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up,
    ffn_down, output, token_embd) in a mix."""
    if mix == "q4_k_m":
        if role == "token_embd":
            return "Q8_0"
        if role == "output":
            return "Q6_K"
        if role in ("attn_v", "ffn_down") and (layer < layers // 8 or layer >= 7 * layers // 8 or layer % 2 == 0):
            return "Q6_K"
        return "Q4_K"
    return {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "q6_k": "Q6_K", "q4_k": "Q4_K"}[mix]


def random_blocks(rng: np.random.Generator, fmt: str, rows: int, cols: int, scale: float) -> np.ndarray:
    """rows x cols weights of format fmt as uint8 [rows, row bytes]: random quants, float16 scales
    around `scale` / (the format's largest quant) so weights have a standard deviation near `scale`."""
    t = TYPES[fmt]
    _, elems, nbytes = FORMATS[t]
    nb = cols // elems
    raw = rng.integers(0, 256, size=(rows, nb, nbytes), dtype=np.uint8)

    def f16(values: np.ndarray) -> np.ndarray:
        return values.astype(np.float16).view(np.uint8).reshape(rows, nb, -1)

    d = lambda div: rng.uniform(0.5, 1.5, size=(rows, nb)) * scale / div  # noqa: E731
    if fmt == "Q8_0":
        raw[:, :, 0:2] = f16(d(64))
    elif fmt in ("Q4_0", "Q5_0"):
        raw[:, :, 0:2] = f16(d(8 if fmt == "Q4_0" else 16))
    elif fmt in ("Q4_1", "Q5_1"):
        raw[:, :, 0:2] = f16(d(8 if fmt == "Q4_1" else 16))
        raw[:, :, 2:4] = f16(-d(1))
    elif fmt in ("Q4_K", "Q5_K"):
        raw[:, :, 0:2] = f16(d(8 * 32 if fmt == "Q4_K" else 16 * 32))  # times 6-bit sub-block scales ~32
        raw[:, :, 2:4] = f16(d(32))
    elif fmt == "Q6_K":
        raw[:, :, 208:210] = f16(d(32 * 64))  # times int8 sub-block scales ~64
    return raw.reshape(rows, nb * nbytes)


def write(path: Path, shape: Shape, mix: str, seed: int = 0, progress: bool = True) -> Path:
    import gguf

    rng = np.random.default_rng(seed)
    hd = shape.head_dim or shape.hidden // shape.heads
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(None, "llama")
    w.add_name(f"verispec synthetic {shape.params / 1e9:.2f}B {mix}")
    w.add_context_length(4096)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.intermediate)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(shape.vocab)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581w{i}" for i in range(shape.vocab - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(shape.vocab - 259)])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (shape.vocab - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def matrix(name: str, role: str, layer: int, rows: int, cols: int) -> None:
        fmt = mix_types(mix, role, layer, shape.layers)
        data = random_blocks(rng, fmt, rows, cols, scale=cols**-0.5)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType(TYPES[fmt]))

    ones = np.ones(shape.hidden, dtype=np.float32)
    matrix("token_embd.weight", "token_embd", 0, shape.vocab, shape.hidden)
    for i in range(shape.layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones)
        matrix(b + "attn_q.weight", "attn_q", i, shape.heads * hd, shape.hidden)
        matrix(b + "attn_k.weight", "attn_k", i, shape.kv_heads * hd, shape.hidden)
        matrix(b + "attn_v.weight", "attn_v", i, shape.kv_heads * hd, shape.hidden)
        matrix(b + "attn_output.weight", "attn_output", i, shape.hidden, shape.heads * hd)
        w.add_tensor(b + "ffn_norm.weight", ones)
        matrix(b + "ffn_gate.weight", "ffn_gate", i, shape.intermediate, shape.hidden)
        matrix(b + "ffn_up.weight", "ffn_up", i, shape.intermediate, shape.hidden)
        matrix(b + "ffn_down.weight", "ffn_down", i, shape.hidden, shape.intermediate)
        if progress:
            print(f"\r[verispec] writing {path.name}: layer {i + 1}/{shape.layers}", end="", file=sys.stderr, flush=True)
    w.add_tensor("output_norm.weight", ones)
    matrix("output.weight", "output", 0, shape.vocab, shape.hidden)
    w.write_header_to_file(path=tmp)
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    tmp.replace(path)
    if progress:
        print(f"\r[verispec] wrote {path} ({path.stat().st_size / 2**30:.2f} GiB)", file=sys.stderr)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verispec.models.weights.synth", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", choices=sorted(SIZES), default="1b")
    ap.add_argument("--quant", choices=["q8_0", "q4_k_m", "q4_0", "q4_1", "q5_0", "q6_k", "q4_k"], default="q4_k_m")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    write(args.out, SIZES[args.size], args.quant, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
