"""The backend registry: a backend name -> the factory that builds its `ModelRunner`.

A backend is one module in the runners package that registers itself:

    @register_backend("mybackend", weights_formats=("Q8_0",))
    def build(config: RunnerConfig) -> ModelRunner:
        return MyRunner(...)

Every module of the package is imported on the first lookup, so a third backend is one new file;
nothing else names backends. The engine assembly (engine/assembly.py) checks a configuration's
`backend` and `weights_format` here (`check_options`) and builds the runner through it.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from verispec.errors import ConfigError

if TYPE_CHECKING:
    from verispec.runners.base import ModelRunner


@dataclass(frozen=True)
class RunnerConfig:
    """What a backend's factory needs to build a runner (the runner's share of `EngineConfig`)."""

    model: str  # a bundled name, a .gguf file or an HF folder
    dtype: str = "float32"  # weight and activation precision (torch's dtype names)
    max_context: int | None = None  # cap on a sequence's tokens (default: the backend's)
    weights_format: str | None = None  # a backend's own weight format (one of its weights_formats)
    batch_invariant: bool = True  # see EngineConfig.batch_invariant


RunnerFactory = Callable[[RunnerConfig], "ModelRunner"]


@dataclass(frozen=True)
class Backend:
    name: str
    build: RunnerFactory
    weights_formats: tuple[str, ...] = ()  # accepted EngineConfig.weights_format values (none: no choice)
    variants: dict[str, dict] | None = None  # named option sets beside the formats ("fast": batch_invariant off)
    # its prompts can go through its decoding kernels, so keys and values do not depend on how a
    # prompt is split (prefix caching, chunked prefill): its runners' capabilities.prefill_rows
    split_invariant_prefill: bool = False


BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, weights_formats: tuple[str, ...] = (), variants: dict[str, dict] | None = None,
                     split_invariant_prefill: bool = False) -> Callable[[RunnerFactory], RunnerFactory]:
    def wrap(build: RunnerFactory) -> RunnerFactory:
        BACKENDS[name] = Backend(name, build, tuple(weights_formats), dict(variants or {}), split_invariant_prefill)
        return build

    return wrap


_loaded = False


def _load_backends() -> None:
    """Import every module of the runners package (each backend registers itself), once."""
    global _loaded
    if not _loaded:
        package = importlib.import_module(__name__.rpartition(".")[0])
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")
        _loaded = True


def backends() -> dict[str, Backend]:
    """Every registered backend by name."""
    _load_backends()
    return dict(sorted(BACKENDS.items()))


def get_backend(name: str) -> Backend:
    """The registered backend `name`; a ConfigError listing the known ones otherwise."""
    _load_backends()
    backend = BACKENDS.get(name)
    if backend is None:
        raise ConfigError(f"unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}")
    return backend


def check_options(backend: str, weights_format: str | None, split_invariant_prefill: bool = False) -> None:
    """A ConfigError where the backend is unknown, does not offer the weights format, or (where
    asked: prefix caching, chunked prefill) cannot prefill a prompt in split-invariant chunks."""
    if split_invariant_prefill and not get_backend(backend).split_invariant_prefill:
        able = [name for name, b in backends().items() if b.split_invariant_prefill]
        raise ConfigError(f"prefix caching and chunked prefill need prompts prefilled with a one-token decode's "
                          f"arithmetic, which the {backend} backend does not do: use the {' or '.join(able)} backend")
    formats = get_backend(backend).weights_formats
    if weights_format is not None and weights_format not in formats:
        offered = {name: b.weights_formats for name, b in backends().items() if b.weights_formats}
        raise ConfigError(
            f"weights_format {weights_format!r} is not one of backend {backend}'s "
            f"({', '.join(formats) or 'none'}); backends with weight formats: "
            + "; ".join(f"{name}: {', '.join(f)}" for name, f in offered.items())
        )


def family_options(family: str) -> dict:
    """Engine options of a "backend[:format or variant]" name, as the bench and the profiler name
    runners: 'llamacpp:Q8_0' -> backend llamacpp, weights_format Q8_0; 'torch:fast' -> the torch
    backend's variant "fast" (batch_invariant off); 'torch' -> the backend's defaults."""
    name, _, detail = family.partition(":")
    backend = get_backend(name)
    if not detail:
        return {"backend": name}
    if detail in backend.weights_formats:
        return {"backend": name, "weights_format": detail}
    if backend.variants and detail in backend.variants:
        return {"backend": name, **backend.variants[detail]}
    known = [*backend.weights_formats, *(backend.variants or {})]
    raise ConfigError(f"unknown {name} runner {family!r}: {name} or {name}:<one of {', '.join(known) or 'none'}>")


def build_runner(backend: str, config: RunnerConfig) -> "ModelRunner":
    """A runner for `config.model` on the named backend."""
    return get_backend(backend).build(config)
