"""The row-wise kernels (kernels/) for the few rows of a decoding step or a verification, float32,
each row bit-identical whatever the rows beside it:
    rows_mm(x, w)                                   y = x @ w^T, one pass over w per 8 rows
    attention_rows(q, keys, values, start, window, scale)   each query row over its causal keys
    Stack(...).add_layer(<a layer's weights>) ... .forward(x, cos, sin, <caches>, ...)
                                                    every layer, the final norm, the LM head (layer.cpp)

The arithmetic is defined once (kernels/vec.h, ops.h) and built per instruction set, each variant
giving bit-identical results:
    avx512   x86-64 with AVX-512F and BW
    avx2     x86-64 with AVX2 and FMA
    neon     AArch64
    scalar   any CPU: plain C++, the reference (several times slower than MKL's one-row products,
             so used only when forced)
The variant is chosen at run time from this CPU's features (the best vector one it has), or
forced with VERISPEC_KERNEL_VARIANT=avx512|avx2|neon|scalar. Each is compiled once with torch's extension
builder and cached under the verispec cache (kernels/) in a folder keyed by the variant, its
flags, the compiler, the sources and the build environment (torch, Python, the environment's
prefix), so it is never rebuilt without a change; a file lock keeps two processes from building
the same one at once. `kernel()` is None, and the model keeps MKL's products, when
VERISPEC_KERNELS=0 is set or the build fails (no C++ compiler, no ninja: logged once, with why).
"""

from __future__ import annotations

import logging
import os
import platform
from functools import lru_cache
from pathlib import Path

import torch

from verispec.models.kernels import build

log = logging.getLogger("verispec")

KERNELS = Path(__file__).parent  # the C++ sources beside this module
SOURCES = [KERNELS / "quant.cpp", KERNELS / "rowwise.cpp", KERNELS / "layer.cpp", KERNELS / "module.cpp"]  # longest first
HEADERS = [KERNELS / "rowwise.h", KERNELS / "ops.h", KERNELS / "vec.h", KERNELS / "quant.h", KERNELS / "int8.h", KERNELS / "quant8.h", KERNELS / "tile8.h", KERNELS / "ktile8.h", KERNELS / "tile8_amx.h"]
# no -march=native: a variant's library runs on any CPU with its instruction set, and no
# -ffast-math; -ffp-contract=off: no fused multiply-add but the written ones
COMMON_FLAGS = ["-fopenmp", "-ffp-contract=off", "-fno-fast-math"]
VARIANT_FLAGS = {
    "avx512": ["-O3", "-DVERISPEC_AVX512", "-mavx512f", "-mavx512bw", "-mavx2", "-mfma", "-mf16c"],
    "avx2": ["-O3", "-DVERISPEC_AVX2", "-mavx2", "-mfma", "-mf16c"],
    "neon": ["-O3", "-DVERISPEC_NEON"],
    # -O1: the plain C++ lanes take GCC many times longer to compile at -O2 or -O3 (docs/design/exactness.md);
    # the fallback for CPUs without AVX2, and the same bits either way
    "scalar": ["-O1", "-DVERISPEC_SCALAR"],
}
VARIANTS = tuple(VARIANT_FLAGS)  # best first
_state: dict[str, object] = {}


class KernelVariantError(ValueError):
    """A kernel variant was asked for that does not exist or that this CPU cannot run."""


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux reports them (/proc/cpuinfo), empty where unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), or what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=1)
def supported_variants() -> tuple[str, ...]:
    """The variants this CPU runs, best first; always ends with "scalar"."""
    machine = platform.machine().lower()
    out: list[str] = []
    if machine in ("x86_64", "amd64"):
        flags = cpu_flags()
        if not flags:  # no /proc/cpuinfo: torch's own detection
            cap = torch.backends.cpu.get_cpu_capability()
            flags = {"avx512f", "avx512bw", "avx2", "fma", "f16c"} if cap.startswith("AVX512") else {"avx2", "fma", "f16c"} if cap == "AVX2" else set()
        if {"avx512f", "avx512bw", "avx2", "fma", "f16c"} <= flags:
            out.append("avx512")
        if {"avx2", "fma", "f16c"} <= flags:
            out.append("avx2")
    elif machine in ("aarch64", "arm64"):
        out.append("neon")
    out.append("scalar")
    return tuple(out)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax, [n, vocab] -> [n] int64: torch.argmax's index (the first largest value; a
    NaN counts as the largest), through the kernel (ops.h's argmax) for float32 rows on the CPU,
    where torch's reduction is several times slower over a large vocabulary; else torch."""
    module = kernel() if logits.dim() == 2 and logits.dtype == torch.float32 and logits.device.type == "cpu" else None
    if module is None or logits.shape[1] == 0:
        return logits.argmax(dim=-1)
    return module.rows_argmax(logits)


def chosen_variant() -> str:
    """VERISPEC_KERNEL_VARIANT where set (checked against this CPU), else the best supported."""
    forced = os.environ.get("VERISPEC_KERNEL_VARIANT", "").strip().lower()
    if forced:
        if forced not in VARIANTS:
            raise KernelVariantError(f"VERISPEC_KERNEL_VARIANT={forced!r}: not one of {', '.join(VARIANTS)}")
        if forced not in supported_variants():
            raise KernelVariantError(f"VERISPEC_KERNEL_VARIANT={forced}: this CPU runs only {', '.join(supported_variants())}")
        return forced
    return supported_variants()[0]


def kernel():
    """The compiled module of the chosen variant, or None where it cannot be used (see the module)."""
    if "module" not in _state:
        variant = chosen_variant()
        if os.environ.get("VERISPEC_KERNELS", "1") == "0":
            _state["module"] = None
        elif variant == "scalar" and not os.environ.get("VERISPEC_KERNEL_VARIANT"):
            # the plain C++ reference is several times slower than MKL: only where asked for
            log.info("no vector kernel variant for this CPU; using MKL's products (VERISPEC_KERNEL_VARIANT=scalar forces the reference)")
            _state["module"] = None
        else:
            _state["module"] = load_variant(variant, required=False)
    return _state["module"]


def use(variant: str | None) -> None:
    """Make `variant` the kernel of models built from now on in this process (None: MKL's products)."""
    _state["module"] = None if variant is None else load_variant(variant)


def load_variant(variant: str, required: bool = True):
    """The compiled module for `variant`, built if not cached. Build failures raise where
    `required`, else they are logged once and give None."""
    if variant not in VARIANTS:
        raise KernelVariantError(f"unknown kernel variant {variant!r}; known: {', '.join(VARIANTS)}")
    if variant not in supported_variants():
        raise KernelVariantError(f"kernel variant {variant} cannot run on this CPU (it runs {', '.join(supported_variants())})")
    cached = _state.get(f"variant:{variant}")
    if cached is not None:
        return cached
    try:
        module = _build(variant)
    except Exception as e:  # a missing compiler or ninja: MKL's products instead, said once
        if required:
            raise
        log.warning("row-wise kernel (%s) unavailable (%s: %s); using MKL's products", variant, type(e).__name__,
                    str(e).splitlines()[0] if str(e) else "")
        return None
    _state[f"variant:{variant}"] = module
    return module


def variant_flags(variant: str) -> list[str]:
    """The compiler flags of `variant` on this CPU: AVX-512 adds VNNI and AMX where the CPU has them
    (the int8 products' dot instructions, kernels/tile8_amx.h; the integers, so the results, are
    the same without them)."""
    extra = []
    if variant == "avx512":
        flags = cpu_flags()
        extra += ["-mavx512vnni"] if "avx512_vnni" in flags else []
        extra += ["-mamx-tile", "-mamx-int8"] if {"amx_tile", "amx_int8"} <= flags else []
    return VARIANT_FLAGS[variant] + extra


def build_key(variant: str) -> str:
    """What the variant's library depends on (build.py's build_key over its sources and flags)."""
    return build.build_key([*SOURCES, *HEADERS], [variant, *COMMON_FLAGS, *variant_flags(variant)])


def _build(variant: str):
    key = build_key(variant)
    module = build.build_module(f"verispec_rowwise_{variant}_{key}", f"{variant}-{key}", SOURCES, KERNELS,
                                COMMON_FLAGS + variant_flags(variant), ["-fopenmp"],
                                f"verispec's row-wise kernels for {variant} (~1-2 minutes)")
    if module.variant() != variant:
        raise RuntimeError(f"the {variant} kernels' library reports variant {module.variant()}")
    return module


