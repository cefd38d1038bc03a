"""The one place an engine is put together from its configuration.

    engine = build_engine(EngineConfig(model="smollm2-135m", speculative=SpeculativeConfig(method="prompt_lookup")))
    engine.decoder.generate(engine.tokenizer.encode("The capital of France is"), SamplingParams(max_tokens=8))

`build_engine` builds the target runner on the configured backend (runners/), the drafter
(proposers/), the speculation-length policy on the runner's cost curve (engine/policy.py,
runners/costs.py) and the decoder (engine/decoder.py). The library (`LLM`), the server, the
bench, the demo and the scripts all build their engines here; `build_decoder` gives another
drafter (or none) a decoder on a runner already loaded, as the bench and demo compare methods on
one set of weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from verispec.config import EngineConfig, SpeculativeConfig
from verispec.engine.decoder import SpeculativeDecoder
from verispec.engine.policy import SpeculationPolicy
from verispec.engine.prefix_cache import PrefixCache
from verispec.errors import ConfigError
from verispec.proposers import PROPOSERS, Proposer, create_proposer
from verispec.runners import ModelRunner, RunnerConfig, build_runner, check_options
from verispec.runners.base import Tokenizer
from verispec.runners.costs import CostProfile, cached_cost, default_cost, measured_cost, profile_cost


@dataclass
class Engine:
    config: EngineConfig
    runner: ModelRunner  # the target
    tokenizer: Tokenizer
    proposer: Proposer | None  # None: plain decoding
    policy: SpeculationPolicy
    decoder: SpeculativeDecoder

    @property
    def runners(self) -> list[ModelRunner]:
        """The target's runner and the drafter's, if it has one (for cache statistics)."""
        drafter = self.proposer.runner if self.proposer is not None else None
        return [self.runner] + ([drafter] if drafter is not None else [])

    @property
    def cache_bytes(self) -> int:
        """Memory held by the open sequences' KV caches, target and drafter."""
        return sum(r.cache_bytes for r in self.runners)

    @property
    def open_sequences(self) -> int:
        return sum(r.open_sequences for r in self.runners)


def runner_config(config: EngineConfig) -> RunnerConfig:
    return RunnerConfig(config.model, dtype=config.dtype, max_context=config.max_model_len,
                        weights_format=config.weights_format, batch_invariant=config.batch_invariant)


def build_engine(config: EngineConfig, runner: ModelRunner | None = None) -> Engine:
    """The engine `config` describes; on `runner` when given (its model and backend options are
    then the runner's, not config's)."""
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    check_options(config.backend, config.weights_format, config.enable_prefix_caching or config.enable_chunked_prefill)
    if runner is None:
        runner = build_runner(config.backend, runner_config(config))
    decoder = build_decoder(runner, config.speculative, config)
    return Engine(config, runner, runner.tokenizer, decoder.proposer, decoder.policy, decoder)


def ready_methods(runner: ModelRunner) -> list[str]:
    """The registered methods that draft for `runner`'s model with nothing given beside it."""
    return [name for name, drafter in PROPOSERS.items() if drafter.ready_for(runner)]


def build_decoder(runner: ModelRunner, spec: SpeculativeConfig | None, engine: EngineConfig | None = None) -> SpeculativeDecoder:
    """A decoder on `runner` with the drafter and policy `spec` asks for; `spec` None: plain
    decoding with no policy to build (no cost curve timed or read). `engine`: the options of
    prompts and outputs (prefix caching, chunked prefill, logprobs mode); None: the defaults."""
    engine = engine or EngineConfig()
    prefix_cache, prefill_rows = None, None
    if engine.enable_prefix_caching or engine.enable_chunked_prefill:
        caps = runner.capabilities
        prefill_rows = caps.prefill_rows
        if prefill_rows is None:
            raise ConfigError(f"prefix caching and chunked prefill need a runner whose prompts go through its decoding "
                              f"kernels: the {runner.backend} backend's row-wise kernels (float32 on the CPU) with "
                              f"batch_invariant on")
        if engine.enable_chunked_prefill:  # chunks short enough that running streams hardly wait
            prefill_rows = caps.chunk_rows or prefill_rows
        if engine.enable_prefix_caching:
            prefix_cache = PrefixCache(runner, engine.prefix_cache_max_bytes)
    options = dict(logprobs_mode=engine.logprobs_mode, prefix_cache=prefix_cache, prefill_rows=prefill_rows)
    if spec is None:
        return SpeculativeDecoder(runner, **options)
    proposer = create_proposer(spec, runner) if spec.method else None
    policy = build_policy(spec, proposer.relative_cost if proposer is not None else 0.0, runner)
    return SpeculativeDecoder(runner, proposer, spec.num_speculative_tokens, policy, tree_nodes=spec.tree_max_nodes, **options)


def build_policy(spec: SpeculativeConfig, draft_cost: float = 0.0, runner: ModelRunner | None = None) -> SpeculationPolicy:
    """The speculation-length policy the configuration asks for, on `runner`'s cost curve:
    "measured" (timed once per machine and model, then read from the cache), "auto" (timed now),
    "builtin" (the backend's built-in curve), or a profile file."""
    k = spec.num_speculative_tokens if spec.method else 0
    rows = max(k, spec.tree_max_nodes if spec.method else 0) + 1  # the most rows a verification forwards
    cost = runner.builtin_cost() if runner is not None else default_cost
    timed = spec.method and spec.adaptive_k and runner is not None
    if spec.cost_profile in ("auto", "measured"):
        if runner is None and spec.cost_profile == "auto":
            raise ConfigError('cost_profile "auto" needs the loaded model to time')
        if timed:
            cost = measured_cost(runner, rows) if spec.cost_profile == "auto" else cached_cost(runner, rows)
    elif spec.cost_profile and spec.cost_profile != "builtin":
        try:
            cost = profile_cost(CostProfile.load(Path(spec.cost_profile)))
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ConfigError(f"cannot read the cost profile {spec.cost_profile}: {e}") from e
    return SpeculationPolicy(k, adaptive=spec.adaptive_k, disable_by_batch_size=spec.disable_by_batch_size, cost=cost,
                             draft_cost=draft_cost, chunks=runner.verify_chunks if runner is not None else None)
