"""The row-wise kernels (kernels/rowwise.cpp) for the few rows of a decoding step or a
verification, float32, each row bit-identical whatever the rows beside it:
    rows_mm(x, w)                                   y = x @ w^T, one pass over w per 8 rows
    attention_rows(q, keys, values, start, window, scale)   each query row over its causal keys
    decode_layer(x, <a layer's weights>, cos, sin, <caches>, ...)   a whole decoder layer (layer.cpp)

Compiled once per machine with torch's extension builder (`-O3 -march=native -fopenmp`, ~15 s
here), cached under the verispec cache (kernels/) by a hash of the source, the flags and torch's
version. `kernel()` is None, and the model keeps MKL's products, when:
    - VERISPEC_KERNELS=0 is set,
    - the CPU has no AVX-512 (the source compiles to a stub that says so),
    - compiling fails (no C++ compiler, no ninja): logged once with the reason.
Measured here (2 threads, ms; MKL as `transformer._project` without the kernel runs it):
    Gemma 3's head [262144, 640]: 1 row 7.8 (MKL 11.8), 3 rows 10.0 (MKL 18.8), 8 rows 12.6
    [4096, 640]: 1 row 0.05 (MKL 0.19), 8 rows 0.12
A whole forward after 512 tokens (ms, SmolLM2 / Gemma 3; batch-invariant): 1 row 8.4 / 15.5,
5 rows 14.1 / 22.3, 8 rows 18.8 / 29.4; before the kernels (MKL in 2-3-row products) 16.0 / 24.3,
40.1 / 62.7, 61.9 / 100.7.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import torch

from verispec.models.loaders import cache_root

log = logging.getLogger("verispec")

KERNELS = Path(__file__).with_name("kernels")
SOURCES = [KERNELS / "rowwise.cpp", KERNELS / "layer.cpp"]
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off"]  # no fused multiply-add but the written ones
_state: dict[str, object] = {}


def kernel():
    """The compiled module (`rows_mm(x, w)`), or None where it cannot be used (see the module)."""
    if "module" not in _state:
        _state["module"] = _load()
    return _state["module"]


def _load():
    if os.environ.get("VERISPEC_KERNELS", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load

        text = b"".join(p.read_bytes() for p in [*SOURCES, KERNELS / "rowwise.h"])
        key = hashlib.sha256(text + " ".join(FLAGS).encode() + torch.__version__.encode()).hexdigest()[:16]
        build = cache_root() / "kernels" / f"rowwise-{key}"
        build.mkdir(parents=True, exist_ok=True)
        if not any(build.glob("*.so")):
            log.warning("compiling verispec's row-wise product kernel (once, ~15 s; cached in %s)", build)
        module = load(
            name=f"verispec_rowwise_{key}",
            sources=[str(p) for p in SOURCES],
            extra_cflags=FLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(build),
            verbose=False,
        )
    except Exception as e:  # a missing compiler or ninja: MKL's products instead, said once
        log.warning("row-wise product kernel unavailable (%s: %s); using MKL's products", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return None
    if not module.available():
        log.info("row-wise product kernel: this CPU has no AVX-512; using MKL's products")
        return None
    return module


