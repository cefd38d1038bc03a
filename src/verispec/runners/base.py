"""The narrow interface between the engine and a model backend.

Everything above this line (drafters, verifier, scheduler) talks to models only through
`ModelRunner`: open a sequence, forward new tokens at the sequence's next positions and get
logits (and hidden states where the backend has them), truncate, free. A runner also reports what
callers would otherwise reach around it for: what it can do (`RunnerCapabilities`), its built-in
cost curve, what its cost depends on, and how to build a drafter runner beside it. Each backend
is one module of this package that implements these verbs and registers a factory
(runners/registry.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from verispec.models.config import ModelConfig
from verispec.models.decoder.transformer import ForwardOutput
from verispec.models.tokenizers.tokenizer import Tokenizer
from verispec.runners.costs import CostCurve

__all__ = ["BatchItem", "ForwardOutput", "ModelRunner", "RunnerCapabilities", "Tokenizer", "vocab_fingerprint"]


@dataclass
class BatchItem:
    seq: int
    tokens: list[int]  # appended at the sequence's next positions
    num_logits: int = 1  # logits of the last num_logits of them
    return_hidden: bool = False
    aux_layers: tuple[int, ...] = ()  # residual streams entering these layers, for every token (EAGLE-3)
    parents: list[int] | None = None  # the tokens form a token tree (Segment.parents); runners with capabilities.trees


@dataclass(frozen=True)
class RunnerCapabilities:
    """What a runner can do beyond the verbs every runner has. The engine reads these; it never
    probes a runner for optional members."""

    trees: bool = False  # forward takes `parents` (a token tree) and keep() keeps one of its paths
    hidden_states: bool = False  # forward returns the states drafters read (return_hidden, aux_layers: EAGLE)
    # Prompt rows per forward that go through the decoding kernels, each row with a one-token
    # decode's arithmetic, so keys and values do not depend on how a prompt is split (prefix
    # caching, chunked prefill); None: no such path.
    prefill_rows: int | None = None
    # The widest prompt chunk every model of this runner takes through its decoding kernels
    # (chunked prefill's rows per forward); None: prefill_rows.
    chunk_rows: int | None = None


class ModelRunner(Protocol):
    backend: ClassVar[str]  # the registry's name for it
    capabilities: RunnerCapabilities
    vocab_size: int
    max_context: int
    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]
    weight_bytes: int  # bytes of weights a one-token forward reads (decoding is bound by this)
    weights_format: str  # the weights' arithmetic on this backend (its registry's weights_formats)
    kv_bytes_per_value: float  # bytes its KV cache takes per key or value element
    config: ModelConfig  # the model's shape (layers, heads: what a position of its KV cache holds)

    def open(self, capacity: int) -> int:
        """Open a sequence able to hold `capacity` tokens; returns its id."""

    def forward(self, seq: int, tokens: list[int], num_logits: int = 1, return_hidden: bool = False,
                aux_layers: tuple[int, ...] = (), parents: list[int] | None = None) -> ForwardOutput:
        """Append `tokens` at the sequence's next positions; logits of the last `num_logits` of them
        (and, for drafters that read them, the residual streams entering `aux_layers`: runners with
        `capabilities.hidden_states`). `parents`: the tokens are a token tree (`capabilities.trees`)."""

    def forward_batch(self, items: list[BatchItem]) -> list[ForwardOutput]:
        """Several sequences in one forward (a ragged batch); one output per item, in order."""

    def keep(self, seq: int, start: int, indices: list[int]) -> None:
        """After a token tree forwarded at `start`: keep the tree rows `indices` (a path, root
        first) at positions start, start + 1, ... and forget the rest (`capabilities.trees`)."""

    def verify_chunks(self, n: int) -> list[int]:
        """How n rows that all want logits may be forwarded a chunk at a time with every row's
        logits unchanged ([n]: only together). The decoding loop then verifies chunk by chunk and
        stops at the first rejected draft (engine/decoder.py)."""

    def length(self, seq: int) -> int:
        """Number of tokens whose keys/values the sequence holds."""

    def truncate(self, seq: int, length: int) -> None:
        """Forget every position >= length (O(1))."""

    def close(self, seq: int) -> None:
        """Free the sequence's memory."""

    @property
    def open_sequences(self) -> int:
        """Sequences open now."""

    @property
    def cache_bytes(self) -> int:
        """Memory held by the open sequences' KV caches."""

    def builtin_cost(self) -> CostCurve:
        """The backend's built-in forward-cost curve for this runner (runners/costs.py)."""

    def cost_identity(self) -> str:
        """What this runner's forward cost depends on, beside the machine (runners/costs.py)."""

    def build_drafter(self, model: str, head_rows: int | None = None) -> "ModelRunner":
        """A runner for a draft model `model` beside this one: same backend and dtype, on the
        cheapest arithmetic the backend has; `head_rows`: logits over the vocabulary's first ids
        only, where the backend can (None: all)."""

    def vocab_fingerprint(self) -> str:
        """Vocabulary size and the tokenizer's fingerprint: a drafter must match its target's."""


def vocab_fingerprint(runner: ModelRunner) -> str:
    """The `vocab_fingerprint` every runner reports: its logits' width and its tokenizer's vocabulary."""
    return f"{runner.vocab_size}:{runner.tokenizer.vocab_fingerprint()}"


def kv_bytes_per_token(runner: ModelRunner) -> int:
    """Bytes of keys and values one position of a sequence holds in the runner's cache (every layer
    keeps every position: sliding-window layers too, so any rollback stays possible)."""
    c = runner.config
    return int(2 * c.num_layers * c.num_kv_heads * c.head_dim * runner.kv_bytes_per_value)
