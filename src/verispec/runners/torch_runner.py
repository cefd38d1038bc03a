"""The torch backend: our PyTorch decoder (models/decoder/) on any model, its runner and its
built-in cost curve."""

from __future__ import annotations

import itertools
import logging

import torch

from verispec.errors import ConfigError, UnsupportedWeightFormatError
from verispec.models.cache import file_key
from verispec.models.config import ModelConfig
from verispec.models.decoder.kv_cache import KVCache
from verispec.models.decoder.transformer import KERNEL_WIDTH, PROMPT_ROWS, ForwardOutput, Segment, Transformer, invariant_chunks
from verispec.models.kernels import rowwise
from verispec.models.kernels.quant import use_int8, weight_bytes
from verispec.models.tokenizers.tokenizer import Tokenizer
from verispec.models.weights.registry import load_model, resolve
from verispec.runners.base import BatchItem, ModelRunner, RunnerCapabilities, vocab_fingerprint
from verispec.runners.costs import CostCurve, default_cost, interpolated, split_cost
from verispec.runners.registry import RunnerConfig, build_runner, register_backend

log = logging.getLogger("verispec")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


WEIGHTS_FORMATS = ("gguf", "gguf-int8", "float32")
BLOCKS = ("gguf", "gguf-int8")  # the formats that keep a GGUF file's blocks


# The torch backend with batch_invariant on and no row-wise kernel (models/decoder/transformer.py):
# rows go through the weights in products of 1-3 rows (`invariant_chunks`), and a forward costs the
# sum of its products' costs (n rows: in one-row forwards; a second row costs little, a third more):
# docs/results/forward-cost.md, "The built-in torch curves".
INVARIANT_CHUNK_COST = {1: 1.0, 2: 1.1, 3: 1.55}


# The torch backend with the row-wise kernels (models/kernels/rowwise.py, float32), batch-invariant or
# not: each layer in one call, one pass over the weights per 8 rows, so a 9th row starts a second
# pass. SmolLM2's curve, the steeper of the two bundled models: docs/results/forward-cost.md,
# "The built-in torch curves".
KERNEL_POINTS = ((1, 1.0), (2, 1.24), (3, 1.39), (4, 1.56), (5, 1.68), (6, 1.89), (8, 2.24), (9, 2.87), (12, 3.27), (16, 4.0))


def invariant_cost(n: int, width: int = 3) -> float:
    """The torch backend's built-in curve with batch_invariant on: the sum of its products' costs
    (products of at most `width` rows, the runner's probed `invariant_width`)."""
    return max(1.0, sum(INVARIANT_CHUNK_COST[c] for c in invariant_chunks(n, width)))



def torch_cost(batch_invariant: bool, kernel: bool, width: int) -> CostCurve:
    """The torch backend's built-in curve: rows in products of at most `width` rows (the
    runner's probed `invariant_width`), through the row-wise kernel where `kernel`."""
    if not batch_invariant:
        return default_cost
    if kernel:  # the row-wise kernel's curve, in passes of `width` rows
        return kernel_cost if width == KERNEL_WIDTH else split_cost(kernel_cost, width)
    return invariant_cost if width == 3 else (lambda n: invariant_cost(n, width))


kernel_cost = interpolated(KERNEL_POINTS)


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
        self.kv_bytes_per_value = torch.finfo(dtype).bits // 8  # its KV cache holds the activations' dtype
        # every path of the model masks a tree and returns inner layers' states; prompts go through
        # the decoding kernels (split-invariant) under the model's `stack_rows` where the row-wise
        # kernel runs batch-invariant: PROMPT_ROWS, or more where every matrix is GGUF blocks
        invariant = self.model.uses_kernel and batch_invariant
        prefill_rows = self.model.stack_rows - 1 if invariant else None
        self.capabilities = RunnerCapabilities(trees=True, hidden_states=True, prefill_rows=prefill_rows,
                                               chunk_rows=min(prefill_rows, PROMPT_ROWS - 1) if invariant else None)

    def open(self, capacity: int) -> int:
        seq = next(self._ids)
        self._caches[seq] = self.model.new_cache(capacity)
        return seq

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

    @property
    def head_rows(self) -> int:
        """The logits' width: the vocabulary, or a drafter's first ids (build_drafter)."""
        return self.model.lm_head.shape[0]

    def cost_identity(self) -> str:
        """What this runner's forward cost depends on, beside the machine (runners/costs.py)."""
        variant = self.model.kernel_variant
        # the variant and its build (sources, flags, compiler): a changed kernel is timed afresh
        kernel = f"{variant}:{rowwise.build_key(variant)[:8]}" if variant else "mkl"
        return (f"torch|{self.source}|{self.dtype}|{self.weights_format}|invariant={self.batch_invariant}|kernel={kernel}"
                f"|width={self.model.invariant_width}" + (f"|head={self.head_rows}" if self.head_rows < self.vocab_size else ""))

    def vocab_fingerprint(self) -> str:
        return vocab_fingerprint(self)

    def builtin_cost(self) -> CostCurve:
        return torch_cost(self.batch_invariant, self.model.uses_kernel, self.model.invariant_width)

    def build_drafter(self, model: str, head_rows: int | None = None) -> "ModelRunner":
        """A draft model's runner on the cheapest arithmetic its file allows. Exactness is the
        target's concern: any draft verifies losslessly, and a sampled draft's q is the
        distribution it was drawn from, so the drafter drops batch invariance, multiplies a GGUF
        file's blocks with int8 activations (`gguf-int8`) whatever the target's arithmetic, and
        with `head_rows` computes logits over the vocabulary's first ids only
        (Transformer.restrict_head; None or 0: all of them)."""
        dtype = str(self.dtype).removeprefix("torch.")
        int8 = takes_blocks(resolve(model), self.dtype)
        runner = build_runner(self.backend, RunnerConfig(model, dtype=dtype, batch_invariant=False,
                                                         weights_format="gguf-int8" if int8 else None))
        if head_rows and head_rows < runner.vocab_size:
            runner.model.restrict_head(head_rows)
        return runner

    def verify_chunks(self, n: int) -> list[int]:
        """Batch-invariant: the products the forward would split n rows into anyway, so forwarding
        them one after another reads the weights no more often and changes no logit."""
        if not self.batch_invariant:
            return [n]
        return invariant_chunks(n, self.model.invariant_width)

    def length(self, seq: int) -> int:
        return self._caches[seq].length

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


def takes_blocks(path, dtype: torch.dtype) -> bool:
    """Whether the kernels can multiply by this model's GGUF blocks: a .gguf file, float32, the
    row-wise kernels built."""
    return path.is_file() and path.suffix.lower() == ".gguf" and dtype == torch.float32 and rowwise.kernel() is not None


@register_backend("torch", weights_formats=WEIGHTS_FORMATS, variants={"fast": {"batch_invariant": False}},
                  split_invariant_prefill=True)
def build(config: RunnerConfig) -> TorchRunner:
    dtype = DTYPES.get(config.dtype)
    if dtype is None:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}")
    path = resolve(config.model)
    blocks = takes_blocks(path, dtype)
    fmt = config.weights_format
    if fmt in BLOCKS and not blocks:
        raise ConfigError(f"weights_format {fmt!r} needs a .gguf model, dtype float32 and the row-wise kernels "
                          f"(model {path.name}, dtype {config.dtype}, kernels {'on' if rowwise.kernel() else 'off'})")
    auto = fmt is None
    if auto:  # the file's blocks wherever the kernels can multiply by them
        fmt = "gguf" if blocks else "float32"
    try:
        loaded = load_model(config.model, blocks=fmt in BLOCKS, int8=fmt == "gguf-int8")
    except UnsupportedWeightFormatError as e:
        if not auto:
            raise
        log.warning("%s; dequantising this model to float32 instead (weights_format='float32')", e)
        fmt = "float32"
        loaded = load_model(config.model, blocks=False)
    if fmt == "gguf-int8":  # products with int8 activations (kernels/quant8.h)
        use_int8(loaded.weights)
    return TorchRunner(loaded.config, loaded.weights, loaded.tokenizer, dtype=dtype, max_context=config.max_context,
                       batch_invariant=config.batch_invariant, source=file_key(path), weights_format=fmt)
