"""The llamacpp backend: GGUF files on llama.cpp's kernels (engine/llamacpp_runner.py's
LlamaCppRunner), always batch-invariant."""

from __future__ import annotations

import torch

from verispec.engine.backends import RunnerConfig, register_backend
from verispec.engine.llamacpp_runner import WEIGHT_FORMATS, LlamaCppRunner
from verispec.errors import ConfigError


@register_backend("llamacpp", weights_formats=WEIGHT_FORMATS)
def build(config: RunnerConfig) -> LlamaCppRunner:
    from verispec.models.registry import resolve

    path = resolve(config.model)
    if path.suffix.lower() != ".gguf":
        raise ConfigError(f"the llamacpp backend runs GGUF files; {path} is not one")
    if config.dtype != "float32":
        raise ConfigError("the llamacpp backend computes in the GGUF's own formats; choose them with weights_format, not dtype")
    return LlamaCppRunner(path, max_context=config.max_context, weights_format=config.weights_format,
                          num_threads=torch.get_num_threads())
