"""The torch backend: our PyTorch Transformer (engine/runner.py's TorchRunner), any model."""

from __future__ import annotations

import logging

import torch

from verispec.engine.backends import RunnerConfig, register_backend
from verispec.engine.runner import TorchRunner
from verispec.errors import ConfigError, UnsupportedWeightFormatError

log = logging.getLogger("verispec")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


WEIGHTS_FORMATS = ("gguf", "gguf-int8", "float32")
BLOCKS = ("gguf", "gguf-int8")  # the formats that keep a GGUF file's blocks


@register_backend("torch", weights_formats=WEIGHTS_FORMATS)
def build(config: RunnerConfig) -> TorchRunner:
    from verispec.models import rowwise
    from verispec.models.loaders import file_key
    from verispec.models.registry import load_model, resolve

    dtype = DTYPES.get(config.dtype)
    if dtype is None:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}")
    path = resolve(config.model)
    gguf = path.is_file() and path.suffix.lower() == ".gguf"
    fmt = config.weights_format
    if fmt in BLOCKS and (not gguf or dtype != torch.float32 or rowwise.kernel() is None):
        raise ConfigError(f"weights_format {fmt!r} needs a .gguf model, dtype float32 and the row-wise kernels "
                          f"(model {path.name}, dtype {config.dtype}, kernels {'on' if rowwise.kernel() else 'off'})")
    auto = fmt is None
    if auto:  # the file's blocks wherever the kernels can multiply by them
        fmt = "gguf" if gguf and dtype == torch.float32 and rowwise.kernel() is not None else "float32"
    try:
        loaded = load_model(config.model, blocks=fmt in BLOCKS, int8=fmt == "gguf-int8")
    except UnsupportedWeightFormatError as e:
        if not auto:
            raise
        log.warning("%s; dequantising this model to float32 instead (weights_format='float32')", e)
        fmt = "float32"
        loaded = load_model(config.model, blocks=False)
    if fmt == "gguf-int8":  # products with int8 activations (kernels/quant8.h)
        from verispec.models.quant import use_int8

        use_int8(loaded.weights)
    return TorchRunner(loaded.config, loaded.weights, loaded.tokenizer, dtype=dtype, max_context=config.max_context,
                       batch_invariant=config.batch_invariant, source=file_key(path), weights_format=fmt)
