"""The backend registry: a backend name -> the factory that builds its `ModelRunner`.

A backend is one module in this package that registers itself:

    @register_backend("mybackend", weights_formats=("Q8_0",))
    def build(config: RunnerConfig) -> ModelRunner:
        return MyRunner(...)

Every module here is imported on the first lookup, so a third backend is one new file; nothing
else in the engine names backends. `EngineConfig` checks its `backend` and `weights_format`
against this registry, and the engine assembly (engine/assembly.py) builds the runner through it.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from verispec.errors import ConfigError

if TYPE_CHECKING:
    from verispec.engine.runner import ModelRunner


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


BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, weights_formats: tuple[str, ...] = ()) -> Callable[[RunnerFactory], RunnerFactory]:
    def wrap(build: RunnerFactory) -> RunnerFactory:
        BACKENDS[name] = Backend(name, build, tuple(weights_formats))
        return build

    return wrap


_loaded = False


def _load_backends() -> None:
    """Import every module of this package (each registers its backend), once."""
    global _loaded
    if not _loaded:
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")
        _loaded = True


def backend_names() -> list[str]:
    _load_backends()
    return sorted(BACKENDS)


def get_backend(name: str) -> Backend:
    """The registered backend `name`; a ConfigError listing the known ones otherwise."""
    _load_backends()
    backend = BACKENDS.get(name)
    if backend is None:
        raise ConfigError(f"unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}")
    return backend


def build_runner(backend: str, config: RunnerConfig) -> "ModelRunner":
    """A runner for `config.model` on the named backend."""
    return get_backend(backend).build(config)
