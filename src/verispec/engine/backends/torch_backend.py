"""The torch backend: our PyTorch Transformer (engine/runner.py's TorchRunner), any model."""

from __future__ import annotations

import torch

from verispec.engine.backends import RunnerConfig, register_backend
from verispec.engine.runner import TorchRunner
from verispec.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@register_backend("torch")
def build(config: RunnerConfig) -> TorchRunner:
    from verispec.models.loaders import file_key
    from verispec.models.registry import load_model, resolve

    dtype = DTYPES.get(config.dtype)
    if dtype is None:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}")
    loaded = load_model(config.model)
    return TorchRunner(loaded.config, loaded.weights, loaded.tokenizer, dtype=dtype, max_context=config.max_context,
                       batch_invariant=config.batch_invariant, source=file_key(resolve(config.model)))
