"""Configuration: the one source of truth for engine, speculation and sampling options.

Each option is a dataclass field with its help text in `metadata`; the CLI builds its flags from
these fields (see `flags.add_dataclass_flags`), so a new option is added here once. Configurations
are frozen: nothing mutates them at run time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from verispec.errors import ConfigError, InvalidSamplingParamsError, InvalidSpeculativeConfigError


def opt(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True)
class StructuredOutputsParams:
    """A constraint on the output, as vLLM's `StructuredOutputsParams`: set exactly one field.
    Compiled by llguidance (structured/grammar.py); every drafted, verified and bonus token obeys it."""

    json: dict | str | None = opt(None, "a JSON schema (dict or JSON text) the output must match")
    regex: str | None = opt(None, "a regular expression the whole output must match")
    choice: list[str] | None = opt(None, "the output is exactly one of these strings")
    grammar: str | None = opt(None, "a context-free grammar: Lark syntax (llguidance's), or GBNF (with ::=)")
    json_object: bool = opt(False, "any JSON object (OpenAI's response_format json_object)")

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None]
        given += ["json_object"] if self.json_object is True else []
        if self.json_object not in (True, False):
            raise InvalidSamplingParamsError(f"json_object must be true or false, got {self.json_object!r}")
        if len(given) != 1:
            raise InvalidSamplingParamsError(
                f"structured outputs take exactly one of json, regex, choice, grammar, json_object; got {given or 'none'}")
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise InvalidSamplingParamsError(f"json must be a JSON schema (dict or string), got {type(self.json).__name__}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidSamplingParamsError(f"{name} must be a non-empty string, got {value!r}")
        if self.choice is not None and (not isinstance(self.choice, list) or not self.choice
                                        or any(not isinstance(c, str) or not c for c in self.choice)):
            raise InvalidSamplingParamsError(f"choice must be a non-empty list of non-empty strings, got {self.choice!r}")

    @classmethod
    def from_dict(cls, raw: Any) -> "StructuredOutputsParams":
        if isinstance(raw, cls):
            return raw
        if not isinstance(raw, dict):
            raise InvalidSamplingParamsError(f"structured_outputs must be a dict such as {{'json': schema}}, got {raw!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise InvalidSamplingParamsError(f"unknown structured_outputs field(s) {unknown}; known: {sorted(known)}")
        return cls(**raw)


MAX_LOGPROBS = 20  # top alternatives a request may ask for per token (OpenAI's and vLLM's default limit)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. temperature 0 means greedy.

    Every option below applies at every position speculation verifies, exactly as plain decoding
    applies it (penalties count the draft tokens before the position; the grammar is advanced
    through them): speculation is never switched off for a request.
    """

    temperature: float = opt(1.0, "sampling temperature; 0 = greedy")
    top_p: float = opt(1.0, "nucleus sampling mass in (0, 1]; 1 = off")
    top_k: int = opt(0, "keep the k most likely tokens; 0 or -1 = off")
    seed: int | None = opt(None, "seed of this request's random generator (reproducible sampling)")
    max_tokens: int = opt(256, "maximum number of new tokens")
    stop: list[str] | str | None = opt(None, "stop strings (not included in the text)")
    stop_token_ids: list[int] | None = opt(None, "token ids that end generation")
    ignore_eos: bool = opt(False, "keep generating past end-of-sequence tokens")
    n: int = opt(1, "completions per prompt (seeded: completion i uses seed + i)")
    presence_penalty: float = opt(0.0, "subtract this from the logit of every token already in the output, in [-2, 2]")
    frequency_penalty: float = opt(0.0, "subtract this times its count in the output from each token's logit, in [-2, 2]")
    repetition_penalty: float = opt(1.0, "divide positive logits (multiply negative ones) of tokens in the prompt or "
                                         "output by this, > 0; 1 = off")
    min_p: float = opt(0.0, "sampling: drop tokens less likely than min_p times the most likely one, in [0, 1]")
    logit_bias: dict[int, float] | None = opt(None, "token id -> value added to its logit, in [-100, 100]")
    logprobs: int | None = opt(None, f"log-probability of each output token and of its top n alternatives "
                                     f"(0..{MAX_LOGPROBS}; None = none)")
    prompt_logprobs: int | None = opt(None, f"the same for each prompt token after the first (0..{MAX_LOGPROBS})")
    structured_outputs: StructuredOutputsParams | None = opt(None, "constrain the output to a JSON schema, regex, "
                                                                   "choice or grammar")

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise InvalidSamplingParamsError(msg)

        def number(name: str, lo: float, hi: float, lo_open: bool = False) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v > hi or v < lo or (lo_open and v == lo):
                bad(f"{name} must be in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")

        number("presence_penalty", -2.0, 2.0)
        number("frequency_penalty", -2.0, 2.0)
        number("repetition_penalty", 0.0, 100.0, lo_open=True)
        number("min_p", 0.0, 1.0)
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= 128:
            bad(f"n must be an integer in [1, 128], got {self.n!r}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_LOGPROBS):
                bad(f"{name} must be an integer in [0, {MAX_LOGPROBS}] or None, got {v!r}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                bad(f"logit_bias must be a dict of token id -> bias, got {type(self.logit_bias).__name__}")
            bias = {}
            for key, value in self.logit_bias.items():
                try:
                    token = int(key)  # JSON keys arrive as strings
                except (TypeError, ValueError):
                    bad(f"logit_bias keys must be token ids, got {key!r}")
                if token < 0 or isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
                    bad(f"logit_bias maps token ids >= 0 to values in [-100, 100], got {key!r}: {value!r}")
                bias[token] = float(value)
            object.__setattr__(self, "logit_bias", bias or None)
        if self.structured_outputs is not None:
            object.__setattr__(self, "structured_outputs", StructuredOutputsParams.from_dict(self.structured_outputs))

        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            bad(f"temperature must be a number, got {self.temperature!r}")
        if not 0.0 <= self.temperature <= 100.0 or self.temperature != self.temperature:
            bad(f"temperature must be in [0, 100], got {self.temperature}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            bad(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            bad(f"top_k must be an integer >= -1 (0 or -1 = off), got {self.top_k!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63):
            bad(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not isinstance(s, str) or not s for s in stops):
            bad(f"stop must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stops)
        ids = list(self.stop_token_ids or [])
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            bad(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", ids)

    @property
    def greedy(self) -> bool:
        # below this, logits / temperature overflows float32; vLLM draws the same line
        return self.temperature < 1e-5

    def children(self) -> list["SamplingParams"]:
        """The n single completions this asks for: completion i seeded with seed + i (when seeded)."""
        if self.n == 1:
            return [self]
        return [dataclasses.replace(self, n=1, seed=None if self.seed is None else (self.seed + i) % 2**63)
                for i in range(self.n)]

    @property
    def processes_logits(self) -> bool:
        """Whether the logits go through more than temperature, top-k and top-p (engine/logits.py)."""
        return bool(self.logit_bias or self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0 or self.structured_outputs is not None)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Which drafter proposes tokens and how many per step."""

    method: str | None = opt(None, "drafter: prompt_lookup, suffix, draft_model, eagle3, hybrid (suffix where "
                                   "confident, else hybrid_drafter) (none = plain decoding)")
    num_speculative_tokens: int = opt(4, "draft tokens proposed per step (k)")
    draft_model: str | None = opt(None, "draft model (name or path) for method draft_model; for eagle3 an "
                                        "EAGLE head folder (default: the head shipped for a bundled model)")
    draft_head_rows: int = opt(
        32768, "draft_model: the draft's logits over the vocabulary's first N token ids only (a BPE vocabulary lists "
        "its tokens about most frequent first; the draft then never proposes the rest, which the target still "
        "writes itself): a cheaper draft step on a large vocabulary; 0 = the whole vocabulary")
    draft_window: int = opt(
        256, "draft_model: the most tokens the draft catches up on at once: a longer prompt (or a longer stretch "
        "without drafts) restarts the draft's cache from the request's last N tokens, so its prefill stays short "
        "(the draft reads less context; the output never changes); 0 = the whole context")
    draft_cost: float | None = opt(
        None, "draft_model: a draft token's price in one-token target forwards, which adaptive k weighs drafts "
        "against (default: the two models' forwards timed once per machine and pair, then read from the verispec cache)")
    prompt_lookup_min: int = opt(2, "smallest n-gram prompt lookup matches")
    prompt_lookup_max: int = opt(4, "largest n-gram prompt lookup matches")
    suffix_decoding_max_tree_depth: int = opt(
        24, "suffix: longest tail of the context matched, in tokens (as vLLM's option of this name)")
    suffix_decoding_max_cached_requests: int = opt(
        10000, "suffix: earlier responses kept for drafting, shared by all requests of the engine; the oldest "
        "are evicted (0 = only the request's own text)")
    suffix_decoding_max_spec_factor: float = opt(
        4.0, "suffix: a draft is at most this many tokens per token of matched context (longer matches, longer drafts; "
        "vLLM's default is 1.0; drafts are ranked by their first match-length tokens; "
        "docs/results/suffix/options-2026-12-06h)")
    suffix_decoding_min_token_prob: float = opt(
        0.1, "suffix: stop a draft where its estimated probability (the share of earlier occurrences that "
        "continued this way, multiplied along the draft) falls below this")
    hybrid_drafter: str = opt(
        "eagle3", "hybrid: the model drafter used where suffix decoding is not confident: eagle3 (the head in "
        "draft_model, or the bundled one) or draft_model")
    hybrid_min_score: float = opt(
        1.0, "hybrid: suffix decoding's draft is verified when its expected accepted tokens (the sum of its path "
        "probabilities) reach this; otherwise the model drafter drafts")
    suffix_decoding_corpus: str | None = opt(
        None, "suffix: a file whose documents seed the earlier responses (.jsonl of strings or {\"text\": ...}; "
        "else plain text, documents between blank lines)")
    tree_max_nodes: int = opt(
        0, "token trees: a drafter that branches (suffix, eagle3) proposes trees of up to this many nodes, at most "
        "num_speculative_tokens deep, each verified in one forward; adaptive_k keeps the nodes the cost curve "
        "pays for. Torch backend; requests with penalties, grammars or logit_bias keep chains (0 = chains)")
    adaptive_k: bool = opt(
        True,
        "choose each request's k (0..num_speculative_tokens) per step from its measured acceptance "
        "and the forward's cost curve, so drafting backs off where it does not pay",
    )
    disable_by_batch_size: int | None = opt(None, "no drafting while more requests than this run in one batch")
    cost_profile: str | None = opt(
        "measured",
        "the forward-cost curve adaptive k weighs drafts against: 'measured' (timed on the loaded model "
        "once per machine, model, backend and kernel variant, ~1 s, then read from the verispec cache), "
        "'auto' (timed at every start-up), 'builtin' (the backend's built-in curve, measured on one "
        "machine), or a JSON from `verispec bench --profile`. k choices, and so a seeded sampled "
        "request's exact tokens, depend on the curve",
    )

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 64:
            raise InvalidSpeculativeConfigError(f"num_speculative_tokens must be in 1..64, got {k!r}")
        if self.method is not None and not isinstance(self.method, str):
            raise InvalidSpeculativeConfigError(f"method must be a string, got {self.method!r}")
        for name in ("draft_head_rows", "draft_window"):
            rows = getattr(self, name)
            if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
                raise InvalidSpeculativeConfigError(f"{name} must be an integer >= 0, got {rows!r}")
        if self.draft_cost is not None and (isinstance(self.draft_cost, bool) or not isinstance(self.draft_cost, (int, float))
                                            or not 0 <= self.draft_cost < 100):
            raise InvalidSpeculativeConfigError(f"draft_cost must be a number in [0, 100), got {self.draft_cost!r}")
        n_min, n_max = self.prompt_lookup_min, self.prompt_lookup_max
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (n_min, n_max)) or not 1 <= n_min <= n_max:
            raise InvalidSpeculativeConfigError(
                "need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"{self.prompt_lookup_min}, {self.prompt_lookup_max}"
            )
        depth, cached = self.suffix_decoding_max_tree_depth, self.suffix_decoding_max_cached_requests
        if isinstance(depth, bool) or not isinstance(depth, int) or not 2 <= depth <= 1024:
            raise InvalidSpeculativeConfigError(f"suffix_decoding_max_tree_depth must be in 2..1024, got {depth!r}")
        if isinstance(cached, bool) or not isinstance(cached, int) or cached < 0:
            raise InvalidSpeculativeConfigError(f"suffix_decoding_max_cached_requests must be an integer >= 0, got {cached!r}")
        factor, prob = self.suffix_decoding_max_spec_factor, self.suffix_decoding_min_token_prob
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 64:
            raise InvalidSpeculativeConfigError(f"suffix_decoding_max_spec_factor must be in (0, 64], got {factor!r}")
        if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not 0 <= prob <= 1:
            raise InvalidSpeculativeConfigError(f"suffix_decoding_min_token_prob must be in [0, 1], got {prob!r}")
        t = self.tree_max_nodes
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= 32:
            raise InvalidSpeculativeConfigError(f"tree_max_nodes must be in 0..32, got {t!r}")
        d = self.disable_by_batch_size
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
            raise InvalidSpeculativeConfigError(f"disable_by_batch_size must be a positive integer, got {d!r}")
        if not isinstance(self.adaptive_k, bool):
            raise InvalidSpeculativeConfigError(f"adaptive_k must be true or false, got {self.adaptive_k!r}")
        score = self.hybrid_min_score
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 64:
            raise InvalidSpeculativeConfigError(f"hybrid_min_score must be in [0, 64], got {score!r}")

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> "SpeculativeConfig":
        if raw is not None and not isinstance(raw, dict):
            raise InvalidSpeculativeConfigError(
                f"speculative must be a dict such as {{'method': 'prompt_lookup'}}, got {raw!r}"
            )
        raw = dict(raw or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise InvalidSpeculativeConfigError(
                f"unknown speculative option(s) {unknown}; known: {sorted(known)}"
            )
        return cls(**raw)


@dataclass(frozen=True)
class EngineConfig:
    """Everything `LLM(...)` and the CLI take, besides sampling."""

    model: str = opt("smollm2-135m", "model: a bundled name (smollm2-135m, gemma3-270m), a .gguf file or an HF folder")
    backend: str = opt("torch", "model backend: torch (ours, any model) or llamacpp (GGUF on llama.cpp's kernels)")
    weights_format: str | None = opt(
        None,
        "torch backend: gguf (a GGUF file's blocks kept as they are, multiplied by the row-wise kernels in "
        "exact float32: the dequantised weights' products; the default where the kernels run), gguf-int8 (the "
        "same blocks, decoding rows multiplied with int8 activations as llama.cpp does: faster, outputs within "
        "quantisation noise of exact; see docs/design/quant.md) or float32 (dequantised once at load, cached); llamacpp backend: "
        "convert the GGUF's weights to Q8_0, F16 or F32 once (cached)",
    )
    dtype: str = opt("float32", "weight and activation precision: float32 or bfloat16")
    max_model_len: int | None = opt(None, "cap on prompt + generated tokens (default: the model's context)")
    num_threads: int | None = opt(None, "torch CPU threads (default: torch's choice)")
    batch_invariant: bool = opt(
        True,
        "torch backend: compute every decoding and verification row with the kernels and shapes of a "
        "one-token decode, so speculative and batched outputs are bit-identical to plain decoding "
        "(verification costs one pass over the weights per 2-3 rows); off: one pass per forward, "
        "rows agree only to ~1e-5 (the llamacpp backend is always batch-invariant)",
    )
    max_num_seqs: int = opt(16, "most requests decoded together in the running batch (the server's, and "
                                "LLM.generate's over several prompts)")
    logprobs_mode: str = opt(
        "raw_logprobs",
        "what logprobs report (as vLLM's option): raw_logprobs, the model's log-softmax before any processing; "
        "processed_logprobs, the distribution tokens are drawn from (logit_bias, penalties, the structured-output "
        "mask, then, when sampling, temperature, min_p, top-k and top-p)",
    )
    enable_prefix_caching: bool = opt(
        False,
        "reuse the keys and values of earlier requests' prefixes (system prompts, earlier turns), up to "
        "prefix_cache_max_bytes; prompts are then prefilled through the decoding kernels (as GGUF models' "
        "prompts are anyway; with float32 weights slower on long uncached prompts: docs/design/outputs.md) so a "
        "request's tokens never depend on what was cached (torch backend, batch_invariant)",
    )
    prefix_cache_max_bytes: int = opt(2**30, "memory for cached prefixes; least recently used blocks leave first")
    kv_cache_max_bytes: int | None = opt(
        2**32, "memory the running requests' KV caches (target's and draft model's) may fill, each request counted "
        "at its worst case (prompt + max_tokens): requests wait for room in arrival order (the server answers 503 only "
        "when the waiting queue is full; a request larger than the whole budget gets 400); none = no bound")
    enable_chunked_prefill: bool = opt(
        False,
        "prefill prompts a chunk of rows at a time between decoding steps, so running streams keep their "
        "pace while a long prompt arrives (the server's scheduler; torch backend, batch_invariant)",
    )
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if not isinstance(self.batch_invariant, bool):
            raise ConfigError(f"batch_invariant must be true or false, got {self.batch_invariant!r}")
        if self.logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ConfigError(f"logprobs_mode must be raw_logprobs or processed_logprobs, got {self.logprobs_mode!r}")
        for name in ("enable_prefix_caching", "enable_chunked_prefill"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if (self.enable_prefix_caching or self.enable_chunked_prefill) and not self.batch_invariant:
            raise ConfigError("prefix caching and chunked prefill need batch_invariant on "
                              "(keys and values must not depend on how a prompt is split)")
        for name in ("max_model_len", "num_threads", "max_num_seqs", "prefix_cache_max_bytes", "kv_cache_max_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class ServerConfig:
    """`verispec serve` and `create_app`: what the HTTP server adds to the engine's options."""

    host: str = opt("127.0.0.1", "address to listen on")
    port: int = opt(8000, "port to listen on")
    api_key: str | None = opt(None, "require 'Authorization: Bearer <key>' on /v1 endpoints")
    served_model_name: str | None = opt(None, "model name clients send (default: --model)")
    max_waiting: int = opt(64, "most requests waiting for a place in the batch; more get HTTP 503")
    max_prompts_per_request: int = opt(16, "most completions one request may ask for (prompts x n)")
    max_request_bytes: int = opt(4 * 2**20, "request bodies over this many bytes get HTTP 413 before they are read whole")

    def __post_init__(self) -> None:
        for name in ("port", "max_waiting", "max_prompts_per_request", "max_request_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "port" else 1):
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class ClusterConfig:
    """`verispec serve --replicas N` / `--ray-address ADDR`: several engines behind one endpoint on
    Ray Serve (verispec.cluster; the optional extra `.[cluster]`)."""

    replicas: int | None = opt(None, "engine replicas on Ray Serve (a fixed number; default: one engine, no Ray)")
    ray_address: str | None = opt(None, "deploy onto this existing Ray cluster (e.g. ray://head:10001 or auto) "
                                        "instead of starting a local one")
    min_replicas: int | None = opt(None, "autoscaling: fewest replicas (with --max-replicas; Ray Serve's autoscaling_config)")
    max_replicas: int | None = opt(None, "autoscaling: most replicas")
    target_ongoing_requests: float = opt(4.0, "autoscaling: requests per replica Ray Serve aims at (queued and running)")
    replica_cpus: float = opt(1.0, "CPUs Ray reserves for each replica (set num_threads to match)")
    max_ongoing_requests: int | None = opt(None, "most requests Ray sends one replica at once (default: "
                                                 "max_num_seqs + max_waiting); more wait at the ingress")
    affinity_imbalance: int = opt(4, "a request follows its prefix to the replica that served it last unless that "
                                     "replica has this many more requests than the least loaded one")
    app_name: str = opt("verispec", "the Ray Serve application's name")

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.replicas, self.ray_address, self.min_replicas, self.max_replicas))

    def __post_init__(self) -> None:
        for name in ("replicas", "min_replicas", "max_replicas", "max_ongoing_requests"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "min_replicas" else 1)):
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ConfigError("autoscaling needs both min_replicas and max_replicas")
        if self.min_replicas is not None:
            if self.replicas is not None:
                raise ConfigError("give either replicas (a fixed number) or min_replicas and max_replicas (autoscaling), not both")
            if self.min_replicas > self.max_replicas:
                raise ConfigError(f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})")
        if not self.target_ongoing_requests > 0:
            raise ConfigError(f"target_ongoing_requests must be positive, got {self.target_ongoing_requests!r}")
        if not self.replica_cpus >= 0:
            raise ConfigError(f"replica_cpus must be 0 or more, got {self.replica_cpus!r}")
        if isinstance(self.affinity_imbalance, bool) or not isinstance(self.affinity_imbalance, int) or self.affinity_imbalance < 0:
            raise ConfigError(f"affinity_imbalance must be 0 or more, got {self.affinity_imbalance!r}")
