"""The narrow interface between the engine and a model backend.

Everything above this line (drafters, verifier, scheduler) talks to models only through
`ModelRunner`: open a sequence, forward new tokens at the sequence's next positions and get
logits (and hidden states where the backend has them), truncate, free. A runner also reports what
callers would otherwise reach around it for: its built-in cost curve, what its cost depends on,
and how to build a drafter runner beside it. Each backend implements the same verbs and registers
a factory in engine/backends/.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Protocol

import torch

from verispec.engine.costs import CostCurve, torch_cost
from verispec.models.config import ModelConfig
from verispec.models import rowwise
from verispec.models.kv_cache import KVCache
from verispec.models.quant import weight_bytes
from verispec.models.transformer import ForwardOutput, Segment, Transformer, invariant_chunks
from verispec.models.tokenizer import Tokenizer


@dataclass
class BatchItem:
    seq: int
    tokens: list[int]  # appended at the sequence's next positions
    num_logits: int = 1  # logits of the last num_logits of them
    return_hidden: bool = False
    aux_layers: tuple[int, ...] = ()  # residual streams entering these layers, for every token (EAGLE-3)
    parents: list[int] | None = None  # the tokens form a token tree (Segment.parents); runners with supports_trees


class ModelRunner(Protocol):
    vocab_size: int
    max_context: int
    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]
    weight_bytes: int  # bytes of weights a one-token forward reads (decoding is bound by this)

    def open(self, capacity: int) -> int:
        """Open a sequence able to hold `capacity` tokens; returns its id."""

    def forward(self, seq: int, tokens: list[int], num_logits: int = 1, return_hidden: bool = False,
                aux_layers: tuple[int, ...] = (), parents: list[int] | None = None) -> ForwardOutput:
        """Append `tokens` at the sequence's next positions; logits of the last `num_logits` of them
        (and, for drafters that read them, the residual streams entering `aux_layers`: runners that
        can return them have `returns_aux` True). `parents`: the tokens are a token tree."""

    def forward_batch(self, items: list[BatchItem]) -> list[ForwardOutput]:
        """Several sequences in one forward (a ragged batch); one output per item, in order."""

    supports_trees: bool  # forward takes parents (a token tree) and keep() keeps one of its paths

    def keep(self, seq: int, start: int, indices: list[int]) -> None:
        """After a token tree forwarded at `start`: keep the tree rows `indices` (a path, root
        first) at positions start, start + 1, ... and forget the rest."""

    def verify_chunks(self, n: int) -> list[int]:
        """How n rows that all want logits may be forwarded a chunk at a time with every row's
        logits unchanged ([n]: only together). The decoding loop then verifies chunk by chunk and
        stops at the first rejected draft (engine/speculative.py)."""

    def length(self, seq: int) -> int:
        """Number of tokens whose keys/values the sequence holds."""

    def truncate(self, seq: int, length: int) -> None:
        """Forget every position >= length (O(1))."""

    def close(self, seq: int) -> None:
        """Free the sequence's memory."""

    def builtin_cost(self) -> CostCurve:
        """The backend's built-in forward-cost curve for this runner (engine/costs.py)."""

    def cost_identity(self) -> str:
        """What this runner's forward cost depends on, beside the machine (engine/costs.py)."""

    def build_drafter(self, model: str) -> "ModelRunner":
        """A runner for a draft model `model` beside this one: same backend and dtype."""

    def vocab_fingerprint(self) -> str:
        """Vocabulary size and the tokenizer's fingerprint: a drafter must match its target's."""


def vocab_fingerprint(runner) -> str:
    """The `vocab_fingerprint` every runner reports: its logits' width and its tokenizer's vocabulary."""
    return f"{runner.vocab_size}:{runner.tokenizer.vocab_fingerprint()}"


class TorchRunner:
    """ModelRunner over our PyTorch Transformer; one preallocated KVCache per sequence."""

    backend = "torch"

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], tokenizer: Tokenizer,
                 dtype: torch.dtype = torch.float32, max_context: int | None = None, batch_invariant: bool = True,
                 source: str = "", weights_format: str = "float32") -> None:
        self.source = source  # the weights' identity (file_key of the model path), for on-disk memos
        self.weights_format = weights_format  # gguf (the file's blocks) or float32
        if dtype != torch.float32:
            weights = {k: v.to(dtype) for k, v in weights.items()}
        self.dtype = dtype
        self.model = Transformer(config, weights, batch_invariant=batch_invariant)
        self.config = config
        self.tokenizer = tokenizer
        self.vocab_size = config.vocab_size
        self.max_context = min(config.max_position, max_context or config.max_position)
        self.eos_token_ids = tuple(dict.fromkeys([*config.eos_token_ids, *tokenizer.eos_token_ids]))
        self._caches: dict[int, KVCache] = {}
        self._ids = itertools.count()
        self.weight_bytes = sum(weight_bytes(w) for w in weights.values())

    def open(self, capacity: int) -> int:
        seq = next(self._ids)
        self._caches[seq] = self.model.new_cache(capacity)
        return seq

    returns_aux = True  # forward can return the residual streams entering chosen layers
    supports_trees = True  # every path of the torch backend masks a tree (models/transformer.py)

    def forward(self, seq: int, tokens: list[int], num_logits: int = 1, return_hidden: bool = False,
                aux_layers: tuple[int, ...] = (), parents: list[int] | None = None) -> ForwardOutput:
        ids = torch.tensor(tokens, dtype=torch.int64)
        return self.model.forward_batch([Segment(ids, self._caches[seq], num_logits, return_hidden, aux_layers, parents)])[0]

    def forward_batch(self, items: list[BatchItem]) -> list[ForwardOutput]:
        segments = [
            Segment(torch.tensor(it.tokens, dtype=torch.int64), self._caches[it.seq], it.num_logits, it.return_hidden,
                    it.aux_layers, it.parents)
            for it in items
        ]
        return self.model.forward_batch(segments)

    def keep(self, seq: int, start: int, indices: list[int]) -> None:
        self._caches[seq].keep(start, indices)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The target's token embeddings [T, hidden] (unscaled), for drafters that share them."""
        return self.model._embed(tokens).float()

    @property
    def batch_invariant(self) -> bool:
        return self.model.batch_invariant

    def cost_identity(self) -> str:
        """What this runner's forward cost depends on, beside the machine (engine/costs.py)."""
        variant = self.model.kernel_variant
        # the variant and its build (sources, flags, compiler): a changed kernel is timed afresh
        kernel = f"{variant}:{rowwise.build_key(variant)[:8]}" if variant else "mkl"
        return (f"torch|{self.source}|{self.dtype}|{self.weights_format}|invariant={self.batch_invariant}|kernel={kernel}"
                f"|width={self.model.invariant_width}")

    def vocab_fingerprint(self) -> str:
        return vocab_fingerprint(self)

    def builtin_cost(self) -> CostCurve:
        return torch_cost(self.batch_invariant, self.model.uses_kernel, self.model.invariant_width)

    def build_drafter(self, model: str) -> "ModelRunner":
        """Batch invariance is the target's concern: any draft verifies losslessly, and a sampled
        draft's q is the distribution it was drawn from, so the drafter takes the faster kernels."""
        from verispec.engine.backends import RunnerConfig, build_runner

        dtype = str(self.dtype).removeprefix("torch.")
        return build_runner(self.backend, RunnerConfig(model, dtype=dtype, batch_invariant=False))

    def verify_chunks(self, n: int) -> list[int]:
        """Batch-invariant: the products the forward would split n rows into anyway, so forwarding
        them one after another reads the weights no more often and changes no logit."""
        if not self.batch_invariant:
            return [n]
        return invariant_chunks(n, self.model.invariant_width)

    def length(self, seq: int) -> int:
        return self._caches[seq].length

    @property
    def invariant_prefill_rows(self) -> int | None:
        """Prompt rows per forward that go through the decoding kernels (each row with a one-token
        decode's arithmetic, so keys and values do not depend on how a prompt is split); None where
        this runner has no such path (no row-wise kernel, or batch invariance off): under the model's
        `stack_rows`, PROMPT_ROWS (48), or 640 where every matrix is tiles (SmolLM2 on gguf-int8),
        whose prompts take those kernels anyway."""
        return self.model.stack_rows - 1 if self.model.uses_kernel and self.batch_invariant else None

    def read_kv(self, seq: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the keys and values of positions start..end-1: [layers, kv_heads, n, head_dim] each."""
        keys, values = self._caches[seq].keys, self._caches[seq].values
        return keys[:, :, start:end].clone(), values[:, :, start:end].clone()

    def write_kv(self, seq: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append keys and values [layers, kv_heads, n, head_dim] at the sequence's next positions."""
        cache = self._caches[seq]
        start, end = cache.length, cache.length + keys.shape[2]
        cache.reserve(end)
        cache.keys[:, :, start:end] = keys
        cache.values[:, :, start:end] = values
        cache.advance(end - start)

    def truncate(self, seq: int, length: int) -> None:
        self._caches[seq].truncate(length)

    def close(self, seq: int) -> None:
        self._caches.pop(seq, None)

    @property
    def open_sequences(self) -> int:
        return len(self._caches)

    @property
    def cache_bytes(self) -> int:
        """Memory held by the open sequences' KV caches."""
        return sum(c.nbytes() for c in list(self._caches.values()))
