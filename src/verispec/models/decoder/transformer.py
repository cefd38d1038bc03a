"""Our decoder: one forward for the Llama family and Gemma 3.

Architectures differ by small named switches of ModelConfig (QKV bias, q/k norm, sandwich
norms, embedding scale, activation, per-layer sliding window and RoPE base), never by a forked
model file.

Weights use our own names and fused layouts (see `WEIGHT_NAMES`):
    embed.weight                  [vocab, hidden]
    lm_head.weight                [vocab, hidden]   (absent when tied to embed)
    norm.weight                   [hidden]
    layers.{i}.attn_norm.weight   [hidden]
    layers.{i}.qkv.weight         [(heads + 2 * kv_heads) * head_dim, hidden]   q, k, v stacked
    layers.{i}.qkv.bias           [(heads + 2 * kv_heads) * head_dim]           Qwen2 only
    layers.{i}.q_norm.weight      [head_dim]                                    qk_norm only
    layers.{i}.k_norm.weight      [head_dim]                                    qk_norm only
    layers.{i}.o.weight           [hidden, heads * head_dim]
    layers.{i}.post_attn_norm.weight [hidden]                                   sandwich only
    layers.{i}.mlp_norm.weight    [hidden]
    layers.{i}.gate_up.weight     [2 * intermediate, hidden]                    gate, up stacked
    layers.{i}.down.weight        [hidden, intermediate]
    layers.{i}.post_mlp_norm.weight [hidden]                                    sandwich only
Norm weights are stored as applied: Gemma's (1 + w) offset is folded in by the loaders.

Decoding and verification rows (segments of fewer than 48 tokens), float32 on the CPU: the
row-wise kernels (the variant this CPU runs best: AVX-512, AVX2, NEON or plain C++, all
bit-identical) (models/kernels/rowwise.py, kernels/) run every layer, the final norm and the LM head in
one call (`_forward_rows`, kernels/layer.cpp's Stack, given the weights once at construction):
the projections (one pass over the weights per 8 rows, near the memory bandwidth), the attention
(one query row at a time over exactly the keys it sees) and the glue between them (norms, RoPE,
the cache write, the activation), each with one fixed arithmetic whatever the rows beside it.
Prompts (48+ tokens) go through `_layer`: F.linear and SDPA's flash kernel; a batch that mixes
both runs them as two forwards. Without the kernel (another
dtype, no C++ compiler, VERISPEC_KERNELS=0) projections run as `W @ x^T` through MKL
(see `project`), not `F.linear(x, W)`, which runs a few rows as separate single-threaded
matrix-vector products and is the slower for decoding rows (docs/design/exactness.md,
"Measurements behind the MKL path").

Batch invariance (`batch_invariant=True`): every row that wants its logits (decoding and
verification rows) gets bit for bit the logits a one-token decode gives it. With the kernel that
holds by construction for its products and attention; the MLP's activation runs one row at a
time (`_gated`). Without it: MKL computes a column of `W @ x^T` with the same arithmetic as a
one-row product only while the product has at most 3 columns (from 4 on it switches kernels:
results move by ~1e-5), and torch's softmax rounds a row differently when masked columns follow
it, so projections run in chunks of 2-3 rows (`invariant_chunks`) and attention one row at a
time over exactly the keys it sees (`_attention_row`).
A verified draft, a request decoded beside others in the server's batch and a plain decoding
step then give bit-identical logits for the same row (tests/test_batch_invariance.py), and with
the kernels whichever variant the CPU picks (tests/test_kernel_variants.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verispec.models.kernels import rowwise
from verispec.models.config import SLIDING, ModelConfig, RopeConfig
from verispec.models.heap import return_freed_heap
from verispec.models.decoder.kv_cache import KVCache
from verispec.models.kernels.quant import QuantTensor


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2], float32, with the configured scaling."""
    inv = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.freq_factors is not None:
        inv = inv / torch.tensor(rope.freq_factors, dtype=torch.float32)
    if rope.kind == "linear":
        inv = inv / rope.factor
    elif rope.kind == "llama3":
        low_wavelen = rope.original_max_position / rope.low_freq_factor
        high_wavelen = rope.original_max_position / rope.high_freq_factor
        wavelen = 2 * torch.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
        smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    return inv


class RopeTable:
    """cos/sin for positions 0..n-1, grown on demand (doubling), shared by all sequences.

    `sin` is stored with its first half negated, so that rotating x = [x1, x2] is
    x * cos + roll(x, half) * sin: roll gives [x2, x1], the sign turns it into HF's
    rotate_half(x) = [-x2, x1]. One roll instead of two slices, a negation and a concatenation."""

    def __init__(self, rope: RopeConfig, head_dim: int) -> None:
        self.inv_freq = rope_inv_freq(rope, head_dim)  # [head_dim / 2]
        self.cos = torch.empty(0, head_dim)
        self.sin = torch.empty(0, head_dim)

    def get(self, start: int, end: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of positions start..end-1: [T, head_dim] each (sin with its first half negated)."""
        if end > self.cos.shape[0]:
            n = max(end, 2 * self.cos.shape[0], 256)
            freqs = torch.arange(n, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
            emb = torch.cat([freqs, freqs], dim=-1)
            sign = torch.ones(emb.shape[1])
            sign[: emb.shape[1] // 2] = -1
            self.cos, self.sin = emb.cos(), emb.sin() * sign
        if dtype != torch.float32:
            return self.cos[start:end].to(dtype), self.sin[start:end].to(dtype)
        return self.cos[start:end], self.sin[start:end]


@dataclass
class Layer:
    attn_norm: torch.Tensor
    qkv: torch.Tensor  # [(heads + 2 kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None
    qk_norm: torch.Tensor | None  # [heads + kv_heads, head_dim]: q_norm rows, then k_norm rows
    o: torch.Tensor  # [hidden, heads * head_dim]
    post_attn_norm: torch.Tensor | None
    mlp_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor  # [hidden, intermediate]
    post_mlp_norm: torch.Tensor | None
    sliding: bool


def project(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in], w [out, in] (+ bias [out]) -> [T, out].

    Up to 47 rows (decoding, verification) in float32: the row-wise kernel (models/kernels/rowwise.py),
    which reads the weights once per 8 rows near the memory bandwidth and gives each row the same
    arithmetic whatever its neighbours. Without it, (w @ x^T)^T through MKL: MKL parallelises a
    product with two or more columns but runs a single column on one thread, so one row is
    duplicated and the copy's result dropped (faster than x @ w^T: docs/design/exactness.md).
    From 48 rows on (prompt processing) F.linear is the faster.
    A QuantTensor (GGUF blocks): the kernel's product over its blocks, each value what the float32
    product over the dequantised matrix gives; for a prompt, the matrix dequantised for this one
    product (a buffer freed after it) and F.linear; a matrix of tiles (QuantTensor.tiled: gguf-int8's
    32-weight formats), the kernel's int8 products for prompts too, faster than dequantising and
    F.linear (docs/design/quant.md, "Prompts")."""
    quant = isinstance(w, QuantTensor)
    if x.shape[0] >= 48 and not (quant and w.tiled):  # prompt processing: MKL's usual GEMM is the faster
        return F.linear(x, w.dequantize() if quant else w, bias)
    if (quant or (x.dtype == torch.float32 and w.dtype == torch.float32 and w.device.type == "cpu" and w.is_contiguous())) \
            and (k := rowwise.kernel()) is not None:
        y = k.weight_mm(x, _kernel_weight(w))
        return (y + bias) if bias is not None else y
    if x.shape[0] == 1:
        y = torch.mm(w, torch.cat([x, x]).t())[:, :1].t()
    else:
        y = torch.mm(w, x.t()).t()
    return (y + bias) if bias is not None else y.contiguous()


PROMPT_ROWS = 48  # segments this long or longer are prompts: F.linear and SDPA's flash kernel
# ... except on a model whose every matrix is GGUF blocks (the exact `gguf` path, or gguf-int8's
# tiles): up to this many rows its prompts go through the kernel's Stack, the decoding rows' own
# products (so a prompt's keys, values and logits do not depend on how it is split), which beat
# dequantising each matrix for F.linear (docs/results/native-46/); past it the row-wise
# attention's cost, which grows with the square of the length, loses
# (docs/results/quant/2026-12-06-glue.md, "Prompts through the Stack on an all-tile model")
STACK_PROMPT_ROWS = 640
KERNEL_WIDTH = 8  # rows per pass of the row-wise kernel over the weights (kernels/rowwise.cpp)


def invariant_chunks(n: int, width: int = 3) -> list[int]:
    """Row counts of the products a batch-invariant forward splits n rows into, none wider than
    `width` (the widest product computed row by row like a one-row one; `probe_invariant_width`).
    Width 3 (MKL): 3s, with a remaining 4 as 2 + 2 (a 1-row product costs what a 2-row one does):
    5 -> [3, 2], 8 -> [3, 3, 2]. Any other width (the row-wise kernel's 8, a narrower MKL):
    n // width products of width and one of the rest: 8 -> [8], 11 -> [8, 3]."""
    if width != 3:
        return [width] * (n // width) + ([n % width] if n % width else [])
    sizes = []
    while n > 4:
        sizes.append(3)
        n -= 3
    return sizes + ({4: [2, 2]}.get(n, [n] if n else []))


def probe_invariant_width(weights: list[torch.Tensor], max_width: int = 3) -> int:
    """The widest product, up to max_width rows, that gives every row bit for bit what a one-row
    product gives it (`project`), for each of `weights` (one of every shape the model multiplies
    by). The row-wise kernel: 8 (KERNEL_WIDTH) by construction; MKL: 3 where it was measured
    (docs/design/exactness.md).
    A library that rounds otherwise gets narrower products, 1 at worst (every row alone), instead
    of rows that drift."""
    g = torch.Generator().manual_seed(0)
    width = max_width
    with torch.inference_mode():
        for w in weights:
            x = torch.randn(max_width, w.shape[1], generator=g).to(w.dtype)
            alone = torch.cat([project(x[j : j + 1], w) for j in range(max_width)])
            while width > 1 and not torch.equal(project(x[:width], w), alone[:width]):
                width -= 1
    return width


def _project_groups(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, groups: list[int] | None) -> torch.Tensor:
    """`project` over row groups of x (sizes summing to x's rows), one product each; None: one product."""
    if groups is None or len(groups) == 1:
        return project(x, w, bias)
    return torch.cat([project(part, w, bias) for part in x.split(groups)])


def _kernel_weight(w) -> tuple[list[torch.Tensor], list[int]]:
    """A matrix as the kernel's Weight: a QuantTensor's parts, or one float32 part (type 0)."""
    return w.arg if isinstance(w, QuantTensor) else ([w], [0])


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [n_logits, vocab] float32
    hidden: torch.Tensor | None  # [T, hidden]: final-norm hidden states of every new token
    aux: torch.Tensor | None = None  # [T, len(aux_layers) * hidden]: residual streams entering those layers


@dataclass
class Segment:
    """One sequence's share of a batched forward: its new tokens, its cache, what it wants back."""

    tokens: torch.Tensor  # [T] int64, written at positions cache.length ..
    cache: KVCache
    num_logits: int = 1  # logits of the last num_logits new tokens
    return_hidden: bool = False
    aux_layers: tuple[int, ...] = ()  # also return the residual stream entering these layers (EAGLE-3)
    # A token tree: parents[t] = the row token t hangs below (-1: below the cache's last token).
    # Row t is stored at slot cache.length + t but sits at position cache.length + depth(t) and
    # attends to the cache and its own path only, so its logits are bit for bit those of decoding
    # that path alone; KVCache.keep then keeps the accepted path. None: a chain.
    parents: list[int] | None = None


def tree_paths(parents: list[int]) -> list[list[int]]:
    """Each row's path in a token tree: its ancestors root first, then itself. Depth = len - 1.
    Example: parents [-1, 0, 0, 1] -> [[0], [0, 1], [0, 2], [0, 1, 3]]."""
    paths: list[list[int]] = []
    for t, p in enumerate(parents):
        if not -1 <= p < t:
            raise ValueError(f"tree row {t}: parent {p} must be -1 or an earlier row")
        paths.append((paths[p] if p >= 0 else []) + [t])
    return paths


@dataclass
class _Span:
    row: int  # first row of this segment in the batch's [sum T, hidden] activations
    start: int  # first new position in its sequence
    end: int  # one past the last
    masks: dict  # per layer kind: (first key position, mask [T, S] or None)
    rowwise: bool = False  # batch-invariant decoding rows: attention one row at a time
    paths: list[list[int]] | None = None  # a token tree's paths (tree_paths); None: a chain

    @property
    def depths(self) -> torch.Tensor | None:
        """[T] each row's offset from start in positions (a tree's depths), None for a chain."""
        return None if self.paths is None else torch.tensor([len(p) - 1 for p in self.paths])


def _logit_rows(segments: list[Segment], spans: list[_Span]) -> list[int]:
    """The batch's rows whose logits are wanted: each segment's last num_logits, in order."""
    return [r for s, sp in zip(segments, spans) for r in range(sp.row + sp.end - sp.start - s.num_logits, sp.row + sp.end - sp.start)]


class Transformer:
    """A decoder: tokens in, logits out, keys/values written to each sequence's KVCache."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], batch_invariant: bool = True) -> None:
        self.config = config
        self.batch_invariant = batch_invariant
        c = config
        w = weights
        if any(isinstance(t, QuantTensor) for t in w.values()) and rowwise.kernel() is None:
            # GGUF blocks need the row-wise kernels; without them (VERISPEC_KERNELS=0), float32
            w = {k: t.dequantize() if isinstance(t, QuantTensor) else t for k, t in w.items()}
        self.quantised = sorted({f for t in w.values() if isinstance(t, QuantTensor) for f in t.formats})  # e.g. ['Q4_1', 'Q8_0']
        self.embed = w["embed.weight"]  # [vocab, hidden]
        self.lm_head = w["embed.weight"] if c.tie_embeddings else w["lm_head.weight"]  # [vocab, hidden]
        self.norm = w["norm.weight"]
        self.dtype = self.lm_head.dtype
        self.layers: list[Layer] = []
        for i in range(c.num_layers):
            p = f"layers.{i}."
            qk_norm = None
            if c.qk_norm:
                qk_norm = torch.cat(
                    [
                        w[p + "q_norm.weight"].expand(c.num_heads, c.head_dim),
                        w[p + "k_norm.weight"].expand(c.num_kv_heads, c.head_dim),
                    ]
                ).contiguous()
            self.layers.append(
                Layer(
                    attn_norm=w[p + "attn_norm.weight"],
                    qkv=w[p + "qkv.weight"],
                    qkv_bias=w.get(p + "qkv.bias"),
                    qk_norm=qk_norm,
                    o=w[p + "o.weight"],
                    post_attn_norm=w.get(p + "post_attn_norm.weight"),
                    mlp_norm=w[p + "mlp_norm.weight"],
                    gate_up=w[p + "gate_up.weight"],
                    down=w[p + "down.weight"],
                    post_mlp_norm=w.get(p + "post_mlp_norm.weight"),
                    sliding=c.layer_types[i] == SLIDING and c.sliding_window is not None,
                )
            )
        self.rope = RopeTable(c.rope, c.head_dim)
        self.rope_local = RopeTable(c.rope_local, c.head_dim) if c.rope_local else self.rope
        self.embed_scale = torch.tensor(c.embed_scale, dtype=torch.float32).to(self.dtype)
        self.act = F.silu if c.activation == "silu" else (lambda x: F.gelu(x, approximate="tanh"))
        self._has_sliding = any(layer.sliding for layer in self.layers)
        self._q_heads = c.num_heads
        self._qk_heads = c.num_heads + c.num_kv_heads
        # the row-wise kernel computes decoding rows where it can (float32 on the CPU: `project`)
        self._kernel = rowwise.kernel() if self.dtype == torch.float32 and self.lm_head.device.type == "cpu" else None
        self.uses_kernel = self._kernel is not None
        matrices = [m for L in self.layers for m in (L.qkv, L.o, L.gate_up, L.down)] + [self.lm_head]
        all_blocks = all(isinstance(m, QuantTensor) for m in matrices)
        # segments shorter than this go through the Stack (_forward_rows), longer ones through the layers in torch
        self.stack_rows = STACK_PROMPT_ROWS if self.uses_kernel and all_blocks else PROMPT_ROWS
        # the layers as the kernel holds them (kernels/rowwise.h's Stack), handed over once
        self._stack = self._kernel_stack() if self.uses_kernel else None
        self.kernel_variant = self._kernel.variant() if self.uses_kernel else None  # avx512, avx2, neon, scalar
        widest = KERNEL_WIDTH if self.uses_kernel else 3
        self.invariant_width = widest
        if batch_invariant:
            first = self.layers[0]
            self.invariant_width = probe_invariant_width([first.qkv, first.o, first.gate_up, first.down, self.lm_head], widest)
            return_freed_heap()  # the probe's logits over the whole vocabulary (tens of MiB on a large one)
            if self.invariant_width < widest:
                print(f"[verispec] batch invariance: products keep rows apart only up to "
                      f"{self.invariant_width} row(s) here; verification runs in products that narrow", file=sys.stderr)

    def restrict_head(self, rows: int) -> None:
        """Logits of the vocabulary's first `rows` ids only (at least that many: a tiled head is cut
        at whole tiles): a drafter's cheaper head. A BPE vocabulary lists its tokens in merge order,
        roughly most frequent first, so the first ids carry most of what a model writes. The
        embedding keeps every row."""
        self.lm_head = self.lm_head.first_rows(rows) if isinstance(self.lm_head, QuantTensor) else self.lm_head[:rows]
        if self.uses_kernel:
            self._stack = self._kernel_stack()

    def _kernel_stack(self):
        """Every layer's weights in the kernel's Stack (kernels/layer.cpp): one call runs them all."""
        c = self.config
        stack = self._kernel.Stack(c.num_heads, c.num_kv_heads, c.head_dim, c.scale, c.rms_eps, c.activation != "silu")
        for L in self.layers:
            window = c.sliding_window if (L.sliding and c.sliding_window) else 0
            stack.add_layer(L.attn_norm, _kernel_weight(L.qkv), L.qkv_bias, L.qk_norm, _kernel_weight(L.o), L.post_attn_norm,
                            L.mlp_norm, _kernel_weight(L.gate_up), _kernel_weight(L.down), L.post_mlp_norm, window,
                            L.sliding and self.rope_local is not self.rope)
        stack.set_head(self.norm, _kernel_weight(self.lm_head))
        return stack

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embedding rows [T, hidden]: looked up in the blocks for a QuantTensor."""
        if isinstance(self.embed, QuantTensor):
            return self.embed.take(tokens)
        return F.embedding(tokens, self.embed)

    def new_cache(self, capacity: int) -> KVCache:
        c = self.config
        return KVCache(c.num_layers, c.num_kv_heads, c.head_dim, capacity, self.dtype, self.lm_head.device)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.config.rms_eps)

    def forward(
        self,
        tokens: torch.Tensor,  # [T] int64
        cache: KVCache,
        num_logits: int = 1,
        return_hidden: bool = False,
    ) -> ForwardOutput:
        """Run T new tokens at positions cache.length.. and append their keys/values.

        Returns logits of the last `num_logits` new tokens ([num_logits, vocab], float32).
        """
        return self.forward_batch([Segment(tokens, cache, num_logits, return_hidden)])[0]

    @torch.inference_mode()
    def forward_batch(self, segments: list[Segment]) -> list[ForwardOutput]:
        """A ragged batch: several sequences' new tokens (any number each) in one forward.

        Every projection runs once over all rows ([sum T, hidden]: the weights are read once for
        the whole batch); attention runs per sequence over its own cache and positions. Example:
        two requests verifying drafts of 3 and 1 tokens send 4 + 2 rows through each matrix.
        """
        c = self.config
        if len({id(s.cache) for s in segments}) != len(segments):
            raise ValueError("a sequence appears twice in one batch")
        for s in segments:
            if s.cache.length + s.tokens.shape[0] > s.cache.capacity:
                raise IndexError(f"sequence of {s.cache.length + s.tokens.shape[0]} tokens exceeds its cache capacity {s.cache.capacity}")
            if s.parents is not None and (len(s.parents) != s.tokens.shape[0] or len(s.parents) >= PROMPT_ROWS):
                raise ValueError(f"a token tree needs one parent per token and fewer than {PROMPT_ROWS} tokens, "
                                 f"got {len(s.parents)} parents for {s.tokens.shape[0]} tokens")
        if self.uses_kernel:
            short = [s.tokens.shape[0] < self.stack_rows for s in segments]
            if all(short):
                return self._forward_rows(segments)
            if any(short):  # decoding rows apart from prompts: a decode's arithmetic whatever the batch
                rows_out = iter(self._forward_rows([s for s, sh in zip(segments, short) if sh]))
                long_out = iter(self.forward_batch([s for s, sh in zip(segments, short) if not sh]))
                return [next(rows_out) if sh else next(long_out) for sh in short]
        spans: list[_Span] = []
        row = 0
        for s in segments:
            T, start = s.tokens.shape[0], s.cache.length
            rowwise = self.batch_invariant and T > 1 and s.num_logits == T
            paths = tree_paths(s.parents) if s.parents is not None else None
            masks = {} if rowwise else self._masks(start, start + T, T, paths)
            spans.append(_Span(row, start, start + T, masks, rowwise, paths))
            row += T
        groups = self._row_groups(segments, self.invariant_width) if self.batch_invariant else None
        tokens = segments[0].tokens if len(segments) == 1 else torch.cat([s.tokens for s in segments])
        x = self._embed(tokens)  # [N, hidden], N = sum of T
        if c.embed_scale != 1.0:
            x = x * self.embed_scale
        ropes = {False: self._rope(self.rope, spans)}
        if self.rope_local is not self.rope:
            ropes[True] = self._rope(self.rope_local, spans)
        wanted, captured = {i for s in segments for i in s.aux_layers}, {}
        for i, layer in enumerate(self.layers):
            if i in wanted:
                captured[i] = x  # each layer returns a new tensor: x is not written to afterwards
            cos, sin = ropes.get(layer.sliding, ropes[False])  # [N, head_dim] each
            x = self._layer(i, layer, x, segments, spans, cos, sin, groups)
        return self._outputs(segments, spans, x, captured)

    def _forward_rows(self, segments: list[Segment]) -> list[ForwardOutput]:
        """forward_batch for segments of fewer than `stack_rows` tokens each (decoding, verification,
        short prompts) through the kernel's Stack (kernels/layer.cpp): one call for every layer."""
        c = self.config
        spans, rows, starts, row = [], [], [], 0
        for s in segments:
            T, start = s.tokens.shape[0], s.cache.length
            s.cache.reserve(start + T)  # the layer writes keys and values into the cache's buffers
            spans.append(_Span(row, start, start + T, {}, paths=tree_paths(s.parents) if s.parents is not None else None))
            rows.append(row)
            starts.append(start)
            row += T
        tokens = segments[0].tokens if len(segments) == 1 else torch.cat([s.tokens for s in segments])
        x = self._embed(tokens)  # [N, hidden]
        if c.embed_scale != 1.0:
            x = x * self.embed_scale
        ropes = {False: self._rope(self.rope, spans)}
        if self.rope_local is not self.rope:
            ropes[True] = self._rope(self.rope_local, spans)
        cos, sin = ropes[False]  # [N, head_dim] each
        cos_local, sin_local = ropes.get(True, ropes[False])
        parents = [None if s.parents is None else torch.tensor(s.parents, dtype=torch.int64) for s in segments]
        wanted = sorted({i for s in segments for i in s.aux_layers})
        h, logits, streams = self._stack.forward(x, cos, sin, cos_local, sin_local, [s.cache.keys for s in segments],
                                                 [s.cache.values for s in segments], rows, starts, parents, wanted,
                                                 _logit_rows(segments, spans))
        # h [N, hidden] after the final norm, logits [len(logit_rows), vocab]
        return self._split(segments, spans, h, logits, dict(zip(wanted, streams)))

    def _outputs(self, segments: list[Segment], spans: list[_Span], x: torch.Tensor,
                 captured: dict[int, torch.Tensor] | None = None) -> list[ForwardOutput]:
        """The caches' new lengths, the final norm, and logits at the rows that want them;
        `captured`: layer -> the residual stream [N, hidden] entering it (Segment.aux_layers)."""
        c = self.config
        h = self._norm(x, self.norm)  # [N, hidden]
        wanted = torch.tensor(_logit_rows(segments, spans), dtype=torch.int64)  # [sum num_logits]
        head_groups = invariant_chunks(wanted.numel(), self.invariant_width) if self.batch_invariant else None
        logits = _project_groups(h[wanted], self.lm_head, None, head_groups).float() if wanted.numel() else h.new_empty(0, c.vocab_size).float()
        return self._split(segments, spans, h, logits, captured)

    @staticmethod
    def _split(segments: list[Segment], spans: list[_Span], h: torch.Tensor, logits: torch.Tensor,
               captured: dict[int, torch.Tensor] | None) -> list[ForwardOutput]:
        """Each segment's share of a forward's final-norm hidden states h [N, hidden], logits
        [sum num_logits, vocab] and captured residual streams; the caches' new lengths."""
        for s, span in zip(segments, spans):
            s.cache.advance(span.end - span.start)
        outs = []
        for s, sp, part in zip(segments, spans, logits.split([s.num_logits for s in segments])):
            rows = slice(sp.row, sp.row + sp.end - sp.start)
            hidden = h[rows] if s.return_hidden else None
            aux = torch.cat([captured[i][rows] for i in s.aux_layers], dim=-1) if s.aux_layers else None
            outs.append(ForwardOutput(logits=part, hidden=hidden, aux=aux))
        return outs

    @staticmethod
    def _row_groups(segments: list[Segment], width: int = 3) -> list[int]:
        """Batch-invariant projection groups, in row order: rows that want their logits (decoding,
        verification: a segment whose num_logits == T) in chunks of 2-3 rows, consecutive such
        segments sharing chunks (a row's result does not depend on its neighbours there); any other
        segment (a prompt) in one product of its own, as when it runs alone.
        Example: segments of 1, 1, 1 decoding rows, a 60-token prompt, 5 verification rows ->
        [3, 60, 3, 2]."""
        groups: list[int] = []
        run = 0  # decoding rows waiting to be chunked
        for s in segments:
            T = s.tokens.shape[0]
            if s.num_logits == T:
                run += T
                continue
            groups += invariant_chunks(run, width) + [T]
            run = 0
        return groups + invariant_chunks(run, width)

    def _rope(self, table: RopeTable, spans: list[_Span]) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [N, head_dim] at every row's position (a tree's rows at start + their depth)."""
        parts = []
        for sp in spans:
            cos, sin = table.get(sp.start, sp.end, self.dtype)
            depths = sp.depths
            parts.append((cos, sin) if depths is None else (cos[depths], sin[depths]))
        if len(parts) == 1:
            return parts[0]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def _masks(self, start: int, end: int, T: int, paths: list[list[int]] | None = None) -> dict[bool, tuple[int, torch.Tensor | None]]:
        """Per layer kind: (first key slot to read, additive mask [T, end - first] or None).
        A token tree (`paths`): a row sees the slots before start and its own path's, each key at
        its position (start + its depth).

        The mask holds 0 where a query may attend and -inf elsewhere, in the model's dtype."""
        out: dict[bool, tuple[int, torch.Tensor | None]] = {}
        window = self.config.sliding_window
        if paths is None:
            q_pos = torch.arange(start, end)[:, None]  # [T, 1]
        else:
            depth = torch.tensor([len(p) - 1 for p in paths])
            q_pos = start + depth[:, None]  # [T, 1]
            seen = torch.zeros(T, T, dtype=torch.bool)  # [query row, key row]: on the query's path
            for t, path in enumerate(paths):
                seen[t, path] = True
        for sliding in (False, True):
            first = max(0, end - T - window + 1) if (sliding and window) else 0
            if T == 1:
                out[sliding] = (first, None)
                continue
            if paths is None:
                k_pos = torch.arange(first, end)[None, :]  # [1, S]
                blocked = k_pos > q_pos
            else:
                k_pos = torch.cat([torch.arange(first, start), start + depth])[None, :]  # [1, S]: each slot's position
                blocked = torch.cat([torch.zeros(T, start - first, dtype=torch.bool), ~seen], dim=1)
            if sliding and window:
                blocked |= k_pos <= q_pos - window
            out[sliding] = (first, torch.zeros(blocked.shape, dtype=self.dtype).masked_fill_(blocked, float("-inf")))
        return out

    def _attention(self, q, keys, values, mask) -> torch.Tensor:
        """Grouped-query attention over cached keys/values.

        q [T, heads, D]; keys, values [kv_heads, S, D]; mask [T, S] additive or None -> [T, heads * D].
        Query heads h*g .. h*g+g-1 share kv head h (g = heads / kv_heads), as in HF.
        Up to 47 rows (decoding, verification): two batched matmuls with the scale folded into q,
        which beat SDPA's CPU kernels there from 2 rows on. One row stays on this path too, though
        SDPA is the faster there: SDPA's CPU result for one row moves with the memory alignment of
        q, k and v, which would break batch invariance; these matmuls do not, and MKL's projections
        depend only on the weights' alignment, fixed per tensor (docs/design/exactness.md). Many
        rows (prompt processing): SDPA's flash kernel, causal without a mask when the prompt
        starts the sequence.
        """
        T, H, D = q.shape
        kvh = keys.shape[0]
        if T >= 48:
            # the plain causal square (a prompt that starts the sequence, within any window)
            causal = keys.shape[1] == T and (T <= (self.config.sliding_window or T) or not self._has_sliding)
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],  # [1, heads, T, D]
                keys[None],
                values[None],
                attn_mask=None if causal else mask,
                is_causal=causal,
                scale=self.config.scale,
                enable_gqa=H != kvh,
            )  # [1, heads, T, D]
            return out[0].transpose(0, 1).reshape(T, H * D)
        g = H // kvh
        qg = (q * self.config.scale).transpose(0, 1).reshape(kvh, g * T, D)  # [kv_heads, g*T, D]
        scores = torch.bmm(qg, keys.transpose(1, 2))  # [kv_heads, g*T, S]
        if mask is not None:
            scores = (scores.view(kvh, g, T, -1) + mask).view(kvh, g * T, -1)
        if q.dtype == torch.float32:
            probs = torch.softmax(scores, dim=-1)
        else:
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.bmm(probs, values)  # [kv_heads, g*T, D]
        return out.view(H, T, D).transpose(0, 1).reshape(T, H * D)

    def _attention_row(self, i: int, layer: Layer, q: torch.Tensor, cache: KVCache, slot: int, start: int = 0,
                       path: list[int] | None = None) -> torch.Tensor:
        """One query row over exactly the keys it sees, as a one-token decode computes it:
        q [1, heads, D] -> [1, heads * D]. A chain's row at slot `slot` sits at that position; a
        tree's row (`path`: its ancestors' and its own rows from `start`) at start + its depth,
        seeing the slots before start, then its path's."""
        pos = slot if path is None else start + len(path) - 1
        window = self.config.sliding_window
        first = max(0, pos - window + 1) if (layer.sliding and window) else 0
        if path is None:
            keys, values = cache.view(i, first, pos + 1)
        else:
            slots = torch.tensor([p if p < start else start + path[p - start] for p in range(first, pos + 1)])
            keys, values = cache.keys[i][:, slots], cache.values[i][:, slots]
        return self._attention(q, keys, values, None)

    def _gated(self, gate: torch.Tensor, up: torch.Tensor, groups: list[int] | None) -> torch.Tensor:
        """act(gate) * up, [N, intermediate]. Batch-invariant: the rows of small groups (decoding
        rows) one at a time, as a one-token decode computes them. Over many rows torch splits an
        elementwise op across threads, and where a thread's share starts mid-vector up to a vector's
        worth of elements take the scalar exp/tanh, which can round one ulp apart from the vector one
        (docs/design/exactness.md)."""
        if groups is None or gate.shape[0] == 1:
            return self.act(gate) * up
        parts = []
        for g, u in zip(gate.split(groups), up.split(groups)):
            if g.shape[0] <= self.invariant_width:
                parts += [self.act(g[r : r + 1]) * u[r : r + 1] for r in range(g.shape[0])]
            else:
                parts.append(self.act(g) * u)
        return torch.cat(parts)

    def _layer(self, i, layer: Layer, x, segments: list[Segment], spans: list[_Span], cos, sin, groups=None) -> torch.Tensor:
        c = self.config
        N = x.shape[0]
        # attention: projections over all rows, attention per sequence
        h = self._norm(x, layer.attn_norm)
        qkv = _project_groups(h, layer.qkv, layer.qkv_bias, groups).view(N, -1, c.head_dim)  # [N, heads + 2 kv, D]
        qk, v = qkv[:, : self._qk_heads], qkv[:, self._qk_heads :]
        if layer.qk_norm is not None:
            qk = F.rms_norm(qk, (c.head_dim,), None, c.rms_eps) * layer.qk_norm
        qk = qk * cos[:, None, :] + torch.roll(qk, c.head_dim // 2, -1) * sin[:, None, :]  # RoPE, see RopeTable
        q, k = qk[:, : self._q_heads], qk[:, self._q_heads :]
        outs = []
        for s, sp in zip(segments, spans):
            rows = slice(sp.row, sp.row + sp.end - sp.start)
            s.cache.write(i, sp.start, k[rows].transpose(0, 1), v[rows].transpose(0, 1))
            if sp.rowwise:
                paths = sp.paths or [None] * (sp.end - sp.start)
                outs += [self._attention_row(i, layer, q[rows.start + t : rows.start + t + 1], s.cache, sp.start + t, sp.start, path)
                         for t, path in enumerate(paths)]
                continue
            first, attn_mask = sp.masks[layer.sliding]
            keys, values = s.cache.view(i, first, sp.end)  # [kv_heads, S, D]
            outs.append(self._attention(q[rows], keys, values, attn_mask))  # [T, heads * D]
        attn = outs[0] if len(outs) == 1 else torch.cat(outs)
        attn = _project_groups(attn, layer.o, None, groups)
        if layer.post_attn_norm is not None:
            attn = self._norm(attn, layer.post_attn_norm)
        x = x + attn
        # feed-forward
        h = self._norm(x, layer.mlp_norm)
        gate, up = _project_groups(h, layer.gate_up, None, groups).chunk(2, dim=-1)
        mlp = _project_groups(self._gated(gate, up, groups), layer.down, None, groups)
        if layer.post_mlp_norm is not None:
            mlp = self._norm(mlp, layer.post_mlp_norm)
        return x + mlp

