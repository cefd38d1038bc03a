"""ModelRunner on llama.cpp's kernels, through llama-cpp-python's low-level API (optional extra:
`pip install '.[llamacpp]'`).

One llama.cpp context holds every open sequence: a sequence is a llama.cpp `seq_id` in one
unified KV cache. A forward (or a ragged batch of several sequences' tokens) is one
`llama_decode` of a batch that asks for logits exactly at the rows that need them; a truncate is
`llama_memory_seq_rm(seq, length, -1)`, O(1) bookkeeping in llama.cpp's cells. Prompts longer
than the context's `n_batch` are split into several decodes, and so are verifications larger
than `invariant_rows` (below).

Tokenisation stays ours (`Tokenizer` from the GGUF, as for the torch backend): llama.cpp sees token
ids only, so both backends see the same prompts. `weights_format` converts the shipped GGUF once
with llama.cpp's own quantize call (`Q8_0`, `F16`; cached next to our other conversions): the
cost of verifying k tokens depends on the format (see the issue's table), and exactness is always
relative to the same backend and format.

Exactness on this backend needs the kernels to give a row the same logits whether it is decoded
alone (plain decoding) or with others (verifying k drafts, or several requests in one batch).
Two choices make them agree:
- The KV cache is Q8_0 (keys and values). With an F16 cache, llama.cpp's flash attention splits
  the keys of a lone query across threads once the attention window reaches 512 cells and
  merges the partial sums: other rounding than the one-pass path every multi-row batch takes
  (docs/design/llamacpp.md). With a quantised cache every decode takes the one-pass path.
- Decodes that want logits at every row (verification, decoding steps) hold at most
  `invariant_rows` rows, measured once per model file, format, thread count and machine
  (`probe_invariant_rows`, cached on disk): some weight formats switch matrix kernels with the
  number of rows (the values recorded per format: docs/design/llamacpp.md), and a larger
  verification is split into several decodes. Prompt processing goes in
  n_batch chunks, the same for plain and speculative decoding.
Checked here at contexts of 700 tokens (tests/test_llamacpp_backend.py); with the quantised
cache no attention path depends on the context length, and matrix kernels depend on shapes only.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import numpy as np
import torch

from verispec.errors import ConfigError, ContextLengthError, UnsupportedModelError
from verispec.models.cache import cache_root, file_key, file_sha256, memoised
from verispec.models.weights.loaders import load_gguf_meta
from verispec.models.kernels.rowwise import cpu_name
from verispec.models.decoder.transformer import ForwardOutput
from verispec.models.kernels.quant import Q8_0_BYTES, Q8_0_VALUES
from verispec.models.weights.registry import resolve
from verispec.runners.base import BatchItem, RunnerCapabilities, kv_bytes_per_token, vocab_fingerprint
from verispec.runners.costs import CostCurve, interpolated, split_cost
from verispec.runners.registry import RunnerConfig, build_runner, register_backend

log = logging.getLogger("verispec")

WEIGHT_FORMATS = ("Q8_0", "F16", "F32")
DEFAULT_CONTEXT = 8192  # cells of the shared KV cache unless max_context asks otherwise
PROBE_ROWS = 32  # probe_invariant_rows checks decodes of 2, 3, ..., this many rows
N_UBATCH = 64  # rows llama.cpp computes at once: its compute buffer is sized for this many rows wanting logits
BUFFERS = f"no extra bufts, n_ubatch {N_UBATCH}"  # weight layout and compute batch, in the probe and cost-curve keys


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError as e:
        raise ConfigError("the llamacpp backend needs llama-cpp-python: pip install 'verispec[llamacpp]' (compiles llama.cpp)") from e
    return llama_cpp


def convert_weights(path: Path, fmt: str) -> Path:
    """The GGUF re-quantised to `fmt` by llama.cpp (cached on disk by the source's SHA-256)."""
    if fmt not in WEIGHT_FORMATS:
        raise ConfigError(f"weights_format must be one of {', '.join(WEIGHT_FORMATS)}, got {fmt!r}")
    L = _llama_cpp()
    out = cache_root() / f"llamacpp-{file_sha256(path)[:24]}-{fmt}.gguf"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.gguf")
    params = L.llama_model_quantize_default_params()
    params.ftype = {"Q8_0": L.LLAMA_FTYPE_MOSTLY_Q8_0, "F16": L.LLAMA_FTYPE_MOSTLY_F16, "F32": L.LLAMA_FTYPE_ALL_F32}[fmt]
    params.allow_requantize = True
    log.info("converting %s to %s with llama.cpp (once; cached in %s)", path.name, fmt, out)
    if L.llama_model_quantize(str(path).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
        tmp.unlink(missing_ok=True)
        raise UnsupportedModelError(f"llama.cpp could not convert {path} to {fmt}")
    tmp.replace(out)
    return out


def model_params(L):
    """The llama_model_params every llama.cpp model in verispec loads with (this runner, the bench's
    llama.cpp peer): llama.cpp's defaults without the extra buffer types.

    The extra buffer types make llama.cpp repack weights at load for a CPU-specific kernel: on an
    Intel Xeon with AMX, llama-cpp-python 0.3.36 repacks Q4_1/Q8_0 weights into its AMX buffer and
    then segfaults inside llama_decode (the bundled SmolLM2, and plain `llama_cpp.Llama` alike;
    llama.cpp issue 20824 reports a segfault in its AMX matrix product); without them the same
    decode runs. Off on every CPU, not only with AMX (llama.cpp's `--no-repack`): one weight layout
    everywhere, so a machine's numerics and speed do not hang on which repacked kernels it has
    (docs/design/llamacpp.md)."""
    params = L.llama_model_default_params()
    params.use_extra_bufts = False  # any change here must change BUFFERS (probe and cost-curve keys)
    return params


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _quiet_log(level, text, user_data):  # llama.cpp's loading chatter off stderr
    pass


class LlamaCppRunner:
    backend = "llamacpp"

    def __init__(
        self,
        gguf_path: Path,
        max_context: int | None = None,
        max_sequences: int = 34,
        num_threads: int | None = None,
        weights_format: str | None = None,
        n_batch: int = 512,
    ) -> None:
        L = self._L = _llama_cpp()
        L.llama_log_set(_quiet_log, ctypes.c_void_p())
        L.llama_backend_init()
        config, self.tokenizer = load_gguf_meta(gguf_path)  # our tokenizer, the model's metadata
        self.config = config
        self.path = convert_weights(gguf_path, weights_format) if weights_format else Path(gguf_path)
        self.weights_format = weights_format or "as shipped"
        self.model = L.llama_model_load_from_file(str(self.path).encode(), model_params(L))
        if not self.model:
            raise UnsupportedModelError(f"llama.cpp could not load {self.path}")
        self.max_context = min(config.max_position, max_context or DEFAULT_CONTEXT)
        cp = L.llama_context_default_params()
        cp.n_ctx = self.max_context
        # n_ubatch: verification and decoding never put more than invariant_rows (<= PROBE_ROWS) rows
        # in one decode, prompts go in n_ubatch pieces; the default 512 reserved a compute buffer
        # for 512 rows of logits (Gemma 3's 262,144-token vocabulary: 512 MiB)
        cp.n_batch = n_batch
        cp.n_ubatch = min(n_batch, N_UBATCH)
        cp.n_seq_max = max_sequences
        cp.kv_unified = True  # every sequence may use the whole context
        cp.swa_full = True  # sliding-window layers keep every position, so any rollback is possible
        cp.no_perf = True
        cp.type_k = cp.type_v = L.GGML_TYPE_Q8_0  # the one-pass attention path for every decode (above)
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED  # a quantised V cache needs flash attention
        if num_threads:
            cp.n_threads = cp.n_threads_batch = num_threads
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise UnsupportedModelError(f"llama.cpp could not create a context for {self.path}")
        self.mem = L.llama_get_memory(self.ctx)
        self.n_batch = n_batch
        self.batch = L.llama_batch_init(n_batch, 0, 1)
        self.vocab_size = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.eos_token_ids = tuple(dict.fromkeys([*config.eos_token_ids, *self.tokenizer.eos_token_ids]))
        self.weight_bytes = int(L.llama_model_size(self.model))
        self.dtype = torch.float32  # logits; a draft model on this backend is loaded alike
        self._free = list(range(max_sequences - 1, -1, -1))
        self._lengths: dict[int, int] = {}
        self._capacity: dict[int, int] = {}
        self.threads = cp.n_threads
        self.invariant_rows = self.probe_invariant_rows()  # sets it

    # -- the ModelRunner verbs ----------------------------------------------------------------
    def open(self, capacity: int) -> int:
        if capacity > self.max_context:
            raise ContextLengthError(f"a sequence of {capacity} tokens exceeds the llama.cpp context of {self.max_context}")
        if sum(self._capacity.values()) + capacity > self.max_context:
            raise ContextLengthError(
                f"the llama.cpp KV cache ({self.max_context} cells) cannot hold another sequence of {capacity} tokens"
            )
        if not self._free:
            raise ContextLengthError("every llama.cpp sequence slot is in use")
        seq = self._free.pop()
        self._lengths[seq] = 0
        self._capacity[seq] = capacity
        return seq

    # No hidden states: llama.cpp's API gives logits and final embeddings, not inner layers' states.
    # No trees: a token tree would need one llama.cpp sequence per branch (each cell's sequence set
    # decides what a row sees) and a copy of the prefix's cells per branch; not built, so
    # tree_max_nodes is refused at start-up on this backend (engine/assembly.py).
    # No split-invariant prefill: prefix caching and chunked prefill need the torch backend.
    capabilities = RunnerCapabilities()
    kv_bytes_per_value = Q8_0_BYTES / Q8_0_VALUES  # its KV cache holds Q8_0 blocks

    def forward(self, seq: int, tokens: list[int], num_logits: int = 1, return_hidden: bool = False,
                aux_layers: tuple[int, ...] = (), parents: list[int] | None = None) -> ForwardOutput:
        return self.forward_batch([BatchItem(seq, tokens, num_logits, return_hidden, aux_layers, parents)])[0]

    def keep(self, seq: int, start: int, indices: list[int]) -> None:
        raise ConfigError("the llamacpp backend does not verify token trees")

    def forward_batch(self, items: list[BatchItem]) -> list[ForwardOutput]:
        if any(it.parents is not None for it in items):
            raise ConfigError("the llamacpp backend does not verify token trees (capabilities.trees is False)")
        # rows: (seq, token, position, which item wants its logits or -1)
        rows: list[tuple[int, int, int, int]] = []
        for i, it in enumerate(items):
            start = self._lengths[it.seq]
            if start + len(it.tokens) > self._capacity[it.seq]:
                raise IndexError(f"sequence of {start + len(it.tokens)} tokens exceeds its capacity {self._capacity[it.seq]}")
            first_logit = len(it.tokens) - it.num_logits
            for j, tok in enumerate(it.tokens):
                if not 0 <= tok < self.vocab_size:
                    raise IndexError(f"token id {tok} outside the vocabulary [0, {self.vocab_size})")
                rows.append((it.seq, tok, start + j, i if j >= first_logit else -1))
        logits: list[list[np.ndarray]] = [[] for _ in items]
        # decoding and verification (logits at every row): decodes the kernels treat row by row
        # alike. A prompt goes in n_batch chunks: no caller mixes a prompt with decoding steps in
        # one batch (the scheduler prefills a request alone), which would put the steps' rows in
        # n_batch chunks too.
        every_row = all(it.num_logits == len(it.tokens) for it in items)
        size = min(self.invariant_rows, self.n_batch) if every_row else self.n_batch
        for begin in range(0, len(rows), size):
            chunk = rows[begin : begin + size]
            self._decode(chunk)
            for r, (_, _, _, wants) in enumerate(chunk):
                if wants >= 0:
                    ptr = self._L.llama_get_logits_ith(self.ctx, r)
                    logits[wants].append(np.ctypeslib.as_array(ptr, shape=(self.vocab_size,)).copy())
        for it in items:
            self._lengths[it.seq] += len(it.tokens)
        outs = []
        for it, rows_ in zip(items, logits):
            if it.return_hidden or it.aux_layers:
                raise ConfigError("the llamacpp backend does not return hidden states")
            stacked = torch.from_numpy(np.stack(rows_)) if rows_ else torch.empty(0, self.vocab_size)
            outs.append(ForwardOutput(logits=stacked, hidden=None))  # [num_logits, vocab] float32
        return outs

    def verify_chunks(self, n: int) -> list[int]:
        """The decodes forward_batch splits n rows into anyway (at most invariant_rows each)."""
        rows = min(self.invariant_rows, self.n_batch)
        return [rows] * (n // rows) + ([n % rows] if n % rows else [])

    def length(self, seq: int) -> int:
        return self._lengths[seq]

    def truncate(self, seq: int, length: int) -> None:
        if not 0 <= length <= self._lengths[seq]:
            raise ValueError(f"cannot truncate a sequence of length {self._lengths[seq]} to {length}")
        if length < self._lengths[seq]:
            self._L.llama_memory_seq_rm(self.mem, seq, length, -1)
        self._lengths[seq] = length

    def close(self, seq: int) -> None:
        if seq in self._lengths:
            self._L.llama_memory_seq_rm(self.mem, seq, -1, -1)
            del self._lengths[seq], self._capacity[seq]
            self._free.append(seq)
            if not self._lengths:
                # start the next sequence at cell 0: llama.cpp's attention reads cells in cell
                # order over a window padded to 256, so where a sequence lies changes its numerics
                self._L.llama_memory_clear(self.mem, True)

    @property
    def open_sequences(self) -> int:
        return len(self._lengths)

    @property
    def cache_bytes(self) -> int:
        """Bytes of KV cache the open sequences' tokens fill (of llama.cpp's preallocated cells)."""
        return kv_bytes_per_token(self) * sum(list(self._lengths.values()))

    def probe_invariant_rows(self) -> int:
        """The most rows (up to PROBE_ROWS) a decode may hold while every row still gets exactly
        the logits a one-row decode gives it, on this model file, format, thread count and machine.

        Decodes a short synthetic sequence one token at a time, then the same tokens 2, 3, 4, ...
        rows at once, stopping at the first size that differs. Kernel choices depend on shapes,
        not values, so one probe answers for every sequence; the answer is cached on disk
        (llamacpp-probes.json next to the converted weights): a probe takes seconds, once."""
        self.invariant_rows = int(memoised("llamacpp-probes.json", self._probe_key(), self._measure_invariant_rows))
        log.info("llama.cpp decodes of up to %d rows give each row its one-row logits", self.invariant_rows)
        return self.invariant_rows

    def _measure_invariant_rows(self) -> int:
        self.invariant_rows = 1
        vocab = min(self.vocab_size, 1000)
        prefix = [(i * 7919) % vocab for i in range(8)]
        limit = max(1, min(PROBE_ROWS, self.n_batch, self.max_context - len(prefix)))
        tokens = [(i * 31 + 7) % vocab for i in range(limit)]
        seq = self.open(len(prefix) + limit)
        best = 1
        try:
            self.forward(seq, prefix)
            alone = torch.cat([self.forward(seq, [t]).logits for t in tokens])  # [limit, vocab]
            for n in range(2, limit + 1):
                self.truncate(seq, len(prefix))
                self.invariant_rows = n
                if not torch.equal(self.forward(seq, tokens[:n], num_logits=n).logits, alone[:n]):
                    break
                best = n
        finally:
            self.close(seq)
            self.invariant_rows = best
        return best

    def _probe_key(self) -> str:
        version = getattr(self._L, "__version__", "?")
        return f"{file_key(self.path)}|llama-cpp-python {version}|{BUFFERS}|{self.threads} threads|{cpu_name()}"

    def cost_identity(self) -> str:
        """What this runner's forward cost depends on, beside the machine (runners/costs.py)."""
        return f"llamacpp|{file_key(self.path)}|{self.weights_format}|{BUFFERS}|{self.threads} threads|rows={self.invariant_rows}"

    def vocab_fingerprint(self) -> str:
        return vocab_fingerprint(self)

    def builtin_cost(self):
        """llama.cpp's built-in curve, split into decodes of at most `invariant_rows` rows."""
        return llamacpp_cost(self.invariant_rows)

    def build_drafter(self, model: str, head_rows: int | None = None):
        """A runner for a draft model on llama.cpp too (a GGUF file, as shipped; its logits always
        span the whole vocabulary, whatever `head_rows` asks)."""
        return build_runner(self.backend, RunnerConfig(model))

    # -- internals ----------------------------------------------------------------------------
    def _decode(self, rows: list[tuple[int, int, int, int]]) -> None:
        b = self.batch
        b.n_tokens = len(rows)
        for r, (seq, tok, pos, wants) in enumerate(rows):
            b.token[r] = tok
            b.pos[r] = pos
            b.n_seq_id[r] = 1
            b.seq_id[r][0] = seq
            b.logits[r] = 1 if wants >= 0 else 0
        rc = self._L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} (batch of {len(rows)} tokens)")

    def __del__(self) -> None:
        L = getattr(self, "_L", None)
        if L is None:
            return
        if getattr(self, "batch", None) is not None:
            L.llama_batch_free(self.batch)
        if getattr(self, "ctx", None):
            L.llama_free(self.ctx)
        if getattr(self, "model", None):
            L.llama_model_free(self.model)


# llama.cpp's built-in curve: one curve for every weights format, the flattest of them at each n, from
# SmolLM2's profiles at 512 tokens of context (docs/results/profile-smollm2-135m/profile.md).
LLAMACPP_POINTS = ((1, 1.0), (2, 1.7), (4, 2.6), (8, 3.8), (16, 5.7), (32, 9.0))


def llamacpp_cost(invariant_rows: int) -> CostCurve:
    """The llamacpp backend's built-in curve, for decodes of at most `invariant_rows` rows."""
    return split_cost(interpolated(LLAMACPP_POINTS), invariant_rows)


@register_backend("llamacpp", weights_formats=WEIGHT_FORMATS)
def build(config: RunnerConfig) -> LlamaCppRunner:
    path = resolve(config.model)
    if path.suffix.lower() != ".gguf":
        raise ConfigError(f"the llamacpp backend runs GGUF files; {path} is not one")
    if config.dtype != "float32":
        raise ConfigError("the llamacpp backend computes in the GGUF's own formats; choose them with weights_format, not dtype")
    return LlamaCppRunner(path, max_context=config.max_context, weights_format=config.weights_format,
                          num_threads=torch.get_num_threads())
