"""EAGLE draft heads: one decoder layer that reads the target's own hidden states.

Two layouts, as vLLM, SGLang and SpecForge load them (the file format: models/heads/eagle_io.py):

EAGLE-3 (`kind="eagle3"`): the target's residual streams entering three of its layers
(`aux_layers`, by default 2, L // 2 and L - 3) are concatenated, low, mid, high, and `fc` maps
them to the head's width. One row of the head at position p reads the state of position p and the
embedding of token p + 1, and predicts token p + 2:

    e = input_layernorm(embed(token[p + 1]))                          [T, H]
    s = fc(aux[p])  (or, from the second draft step on, the head's own pre-norm output)
    r, s = s, hidden_norm(s)        (norm_before_residual: s = hidden_norm(s); r = s)
    x = attention([e, s]) + r       q, k, v read 2H; RoPE at position p    [T, H]
    pre = mlp(post_attention_layernorm(x)) + x                        [T, H]  fed back as the next state
    logits = lm_head(norm(pre))                                       [T, draft_vocab]
    target id = draft id + d2t[draft id]

EAGLE-1/2 (`kind="eagle1"`): fc maps [embed(token[p + 1]), h[p]] (2H, h the target's final-norm
hidden state) to H; the layer has no input norm and reads H; no final norm; the target's LM head
gives logits over the whole vocabulary.

Everything here runs in float32 on any torch device. The attention differs between inference
(a KV cache, `EagleHead.forward`) and training (the training-time test's mask, train/trainer.py),
so both share the pieces before and after it (`embed_and_state`, `qkv`, `after_attention`).
On the CPU with the row-wise kernels, the inference head's drafting steps (a few rows) multiply
by its matrices as stored (float16 or bfloat16 where the float32 values are exactly that: half the
bytes, the same values), q/k/v and gate/up each in one call (`kernel_project`); longer runs (a
prompt's states) keep torch's products, except where every product is int8 tiles (a gguf-int8
target's head: up to TILED_KERNEL_ROWS rows), and training always does. Drafts never change the
output, only which tokens are proposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from verispec.models.kernels import rowwise
from verispec.models.config import RopeConfig
from verispec.models.decoder.kv_cache import KVCache
from verispec.models.kernels.quant import BF16, F16, FORMATS, INT8, TILE_ROWS
from verispec.models.decoder.transformer import STACK_PROMPT_ROWS, RopeTable

KERNEL_ROWS = 16  # drafting steps and short updates: the kernel's products; more rows: torch's
# ... except a head whose every product is int8 tiles (a gguf-int8 target's): up to as many rows as
# the target's own tiled prompts (its catch-up over skipped states, a prompt's at the first draft),
# where the int8 products beat torch's, whereas float16 ones lose past 16 rows (docs/design/eagle.md)
TILED_KERNEL_ROWS = STACK_PROMPT_ROWS
FUSED = {  # products made in one call: the kernel's Weight stacks the parts
    "qkv": ("midlayer.self_attn.q_proj", "midlayer.self_attn.k_proj", "midlayer.self_attn.v_proj"),
    "gate_up": ("midlayer.mlp.gate_proj", "midlayer.mlp.up_proj"),
}


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose input residual streams EAGLE-3 fuses (vLLM's and SpecForge's choice)."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class HeadConfig:
    kind: str  # "eagle3" | "eagle1"
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    rope: RopeConfig
    vocab_size: int  # the target's
    draft_vocab_size: int  # = vocab_size for EAGLE-1/2 and for heads without a reduced vocabulary
    target_hidden_size: int
    aux_layers: tuple[int, ...] | None = None  # None: default_aux_layers of the target
    norm_before_residual: bool = False

    @property
    def state_width(self) -> int:
        """Width of the target's states the head reads: 3 fused streams, or the last hidden state."""
        return 3 * self.target_hidden_size if self.kind == "eagle3" else self.target_hidden_size


def rms(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), None if w is None else w.to(x.dtype), eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on [..., T, heads, D] with cos, sin [T, D] (sin's first half negated: RopeTable)."""
    return x * cos[:, None, :] + torch.roll(x, x.shape[-1] // 2, -1) * sin[:, None, :]


class EagleHead:
    """A head's weights (published names, float32) and its forward."""

    def __init__(self, config: HeadConfig, weights: dict[str, torch.Tensor], embed, lm_head: torch.Tensor | None = None,
                 int8: bool = False) -> None:
        """`embed`: token ids [T] -> the target's embeddings [T, H] (used when the checkpoint has
        none); `lm_head`: the target's [vocab, H] (EAGLE-1/2 heads without their own); `int8`: the
        kernel's products over the matrices rounded to Q8_0 with int8 activations (a target on
        gguf-int8 drafts in its arithmetic; other drafts, verified losslessly all the same)."""
        self.config = config
        self.w = weights
        self._embed = embed
        self.lm_head = weights.get("lm_head.weight", lm_head)
        if self.lm_head is None:
            raise ValueError("the head has no lm_head.weight and no target LM head was given")
        self.rope = RopeTable(config.rope, config.head_dim)
        d2t = weights.get("d2t")
        self.target_ids = torch.arange(config.draft_vocab_size) + (d2t if d2t is not None else 0)  # [draft_vocab]
        self.kernel = rowwise.kernel() if self.lm_head.device.type == "cpu" else None
        self.products = kernel_weights(self, int8) if self.kernel is not None else {}
        tiled = self.products and all(t >= INT8 for (_, types), _ in self.products.values() for t in types)
        self.kernel_rows = TILED_KERNEL_ROWS if tiled else KERNEL_ROWS  # more rows: torch's products

    def kernel_project(self, x: torch.Tensor, key: str) -> torch.Tensor | None:
        """x [..., in] times the stacked matrices `key` (FUSED, or one weight's name prefix / "lm_head")
        through the kernel: [..., out], or None where the torch products apply (too many rows, no kernel)."""
        weight = self.products.get(key)
        rows = x.numel() // x.shape[-1]
        if weight is None or rows > self.kernel_rows:
            return None
        y = self.kernel.weight_mm(x.reshape(rows, x.shape[-1]).float().contiguous(), weight[0])
        if weight[1] is not None:
            y = y + weight[1]
        return y.view(*x.shape[:-1], y.shape[-1])

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        if "embed_tokens.weight" in self.w:
            return F.embedding(tokens, self.w["embed_tokens.weight"])
        return self._embed(tokens)

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.target_ids[draft_ids]

    def new_cache(self, capacity: int) -> KVCache:
        c = self.config
        return KVCache(1, c.num_kv_heads, c.head_dim, capacity, torch.float32)

    @torch.inference_mode()
    def forward(self, states: torch.Tensor, tokens: torch.Tensor, cache: KVCache, fused: bool,
                offset: int = 0, logit_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows at positions offset + cache.length.. : states [T, state_width] (the target's, `fused`) or
        [T, H] (the head's own pre-norm outputs), tokens [T] (token p + 1 of each row p).
        Returns logits [T, draft_vocab] (`logit_rows`: of the last that many rows only; the LM head
        over the draft vocabulary is ~45% of the head's weights, so a prompt fed whole costs
        about half as much when only its last row's logits are wanted) and the pre-norm outputs
        [T, H]; the cache advances by T."""
        c = self.config
        T, start = tokens.shape[0], cache.length
        x, residual = embed_and_state(self, states, self.embed(tokens), fused)
        q, k, v = qkv(self, x, *self.rope.get(offset + start, offset + start + T))  # [T, heads, D], [T, kv, D] x 2
        cache.write(0, start, k.transpose(0, 1), v.transpose(0, 1))
        cache.advance(T)
        keys, values = cache.view(0, 0, start + T)  # [kv, S, D]
        mask = None
        if T > 1:
            k_pos, q_pos = torch.arange(start + T)[None, :], torch.arange(start, start + T)[:, None]
            mask = torch.zeros(T, start + T).masked_fill_(k_pos > q_pos, float("-inf"))
        attn = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys[None], values[None], attn_mask=mask, scale=c.head_dim ** -0.5,
            enable_gqa=c.num_heads != c.num_kv_heads,
        )[0].transpose(0, 1).reshape(T, c.num_heads * c.head_dim)  # [T, heads * D]
        pre = after_attention(self, attn, residual)
        return logits(self, pre if logit_rows is None else pre[-logit_rows:]), pre


def _part(w: torch.Tensor, int8: bool = False) -> tuple[torch.Tensor, int]:
    """A float32 matrix as a kernel Weight part: its float16 or bfloat16 bytes where those hold
    exactly its values (a checkpoint stored so), else itself; with int8, rounded to Q8_0 blocks
    laid out as tiles for int8 activations (models/kernels/quant.py's tile_int8) where its shape allows."""
    if int8 and w.shape[0] % TILE_ROWS == 0 and w.shape[1] % 32 == 0:
        import gguf

        q8 = int(gguf.GGMLQuantizationType.Q8_0)
        blocks = gguf.quants.quantize(w.float().numpy(), q8)  # [rows, row bytes]
        return rowwise.kernel().tile_weight(torch.from_numpy(np.ascontiguousarray(blocks)), q8), q8 + INT8
    for dtype, code in ((torch.float16, F16), (torch.bfloat16, BF16)):
        narrow = w.to(dtype)
        if torch.equal(narrow.float(), w) and w.shape[1] % FORMATS[code][1] == 0:
            return narrow.contiguous().view(torch.uint8), code
    return w.float().contiguous(), 0


def kernel_weights(head: "EagleHead", int8: bool = False) -> dict[str, tuple[tuple[list[torch.Tensor], list[int]], torch.Tensor | None]]:
    """The head's matrices as kernel Weights: key -> ((parts, types), bias or None)."""
    w = head.w
    groups = {**FUSED, "fc": ("fc",), "o": ("midlayer.self_attn.o_proj",), "down": ("midlayer.mlp.down_proj",)}
    out = {}
    for key, names in groups.items():
        if not all(f"{n}.weight" in w for n in names):
            continue
        parts, types = zip(*(_part(w[f"{n}.weight"], int8) for n in names))
        biases = [w.get(f"{n}.bias") for n in names]
        bias = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else torch.zeros(w[f"{n}.weight"].shape[0]) for b, n in zip(biases, names)])
        out[key] = ((list(parts), list(types)), bias)
    lm_part, lm_type = _part(head.lm_head, int8)
    out["lm_head"] = (([lm_part], [lm_type]), None)
    return out


def _kernel(head, x: torch.Tensor, key: str) -> torch.Tensor | None:
    """EagleHead.kernel_project where the head has it (not the trainer's module), else None."""
    return head.kernel_project(x, key) if hasattr(head, "kernel_project") else None


def _linear(head, x: torch.Tensor, key: str, name: str) -> torch.Tensor:
    """One matrix: the kernel's product where it applies, else F.linear over the float32 weight."""
    y = _kernel(head, x, key)
    return y if y is not None else F.linear(x, head.w[name + ".weight"], head.w.get(name + ".bias"))


def embed_and_state(head, states: torch.Tensor, e: torch.Tensor, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention's input and the residual from the states and the token embeddings e [..., T, H]:
    ([..., T, 2H] (EAGLE-1/2: [..., T, H]), [..., T, H])."""
    c, w = head.config, head.w
    if c.kind == "eagle1":
        x = F.linear(torch.cat([e, states], -1), w["fc.weight"], w.get("fc.bias"))
        return x, x
    s = _linear(head, states, "fc", "fc") if fused else states
    e = rms(e, w["midlayer.input_layernorm.weight"], c.rms_eps)
    if c.norm_before_residual:
        s = rms(s, w["midlayer.hidden_norm.weight"], c.rms_eps)
        return torch.cat([e, s], -1), s
    return torch.cat([e, rms(s, w["midlayer.hidden_norm.weight"], c.rms_eps)], -1), s


def qkv(head, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Queries [..., T, heads, D] and keys, values [..., T, kv_heads, D], RoPE applied."""
    c, w = head.config, head.w
    shape = x.shape[:-1]
    p = "midlayer.self_attn."
    fused = _kernel(head, x, "qkv")  # [..., T, (heads + 2 kv) * D]
    if fused is not None:
        q, k, v = fused.split([c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim], -1)
    else:
        q, k, v = (F.linear(x, w[p + n + ".weight"], w.get(p + n + ".bias")) for n in ("q_proj", "k_proj", "v_proj"))
    q = q.reshape(*shape, c.num_heads, c.head_dim)
    k = k.reshape(*shape, c.num_kv_heads, c.head_dim)
    v = v.reshape(*shape, c.num_kv_heads, c.head_dim)
    return rotate(q, cos, sin), rotate(k, cos, sin), v


def after_attention(head, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """o_proj, the residual, the MLP: the pre-norm output [..., T, H]."""
    c, w = head.config, head.w
    x = _linear(head, attn, "o", "midlayer.self_attn.o_proj") + residual
    h = rms(x, w["midlayer.post_attention_layernorm.weight"], c.rms_eps)
    gate_up = _kernel(head, h, "gate_up")  # [..., T, 2I]
    if gate_up is not None:
        gate, up = gate_up.chunk(2, -1)
    else:
        gate, up = F.linear(h, w["midlayer.mlp.gate_proj.weight"]), F.linear(h, w["midlayer.mlp.up_proj.weight"])
    return _linear(head, F.silu(gate) * up, "down", "midlayer.mlp.down_proj") + x


def logits(head, pre: torch.Tensor) -> torch.Tensor:
    """[..., T, draft_vocab] (EAGLE-1/2: the target's LM head over the un-normed output)."""
    x = pre if head.config.kind == "eagle1" else rms(pre, head.w["norm.weight"], head.config.rms_eps)
    y = _kernel(head, x, "lm_head")
    return y if y is not None else F.linear(x, head.lm_head)
