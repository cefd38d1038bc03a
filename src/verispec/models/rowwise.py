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

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import torch

from verispec.models.loaders import cache_root

log = logging.getLogger("verispec")

KERNELS = Path(__file__).with_name("kernels")
SOURCES = [KERNELS / "quant.cpp", KERNELS / "rowwise.cpp", KERNELS / "layer.cpp", KERNELS / "module.cpp", KERNELS / "suffix.cpp"]  # longest first
HEADERS = [KERNELS / "rowwise.h", KERNELS / "ops.h", KERNELS / "vec.h", KERNELS / "quant.h", KERNELS / "int8.h", KERNELS / "quant8.h", KERNELS / "tile8.h", KERNELS / "tile8_amx.h", KERNELS / "suffix.h"]
# no -march=native: a variant's library runs on any CPU with its instruction set, and no
# -ffast-math; -ffp-contract=off: no fused multiply-add but the written ones
COMMON_FLAGS = ["-fopenmp", "-ffp-contract=off", "-fno-fast-math"]
VARIANT_FLAGS = {
    "avx512": ["-O3", "-DVERISPEC_AVX512", "-mavx512f", "-mavx512bw", "-mavx2", "-mfma", "-mf16c"],
    "avx2": ["-O3", "-DVERISPEC_AVX2", "-mavx2", "-mfma", "-mf16c"],
    "neon": ["-O3", "-DVERISPEC_NEON"],
    # -O1: the plain C++ lanes took GCC 12 ~6 minutes to compile at -O3 (quant.cpp alone 351 s),
    # 110-145 s at -O2, 58 s at -O1; the fallback for CPUs without AVX2, and the same bits either way
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


def loaded_kernel():
    """The compiled module where this process has loaded it already (a model on the row-wise
    kernels did), else None: it never builds one (that takes a minute or two)."""
    return _state.get("module")


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
    """What the built library depends on: sources, flags, compiler, torch, Python and the
    environment's paths (torch's builder writes them into its build files)."""
    h = hashlib.sha256()
    for p in [*SOURCES, *HEADERS]:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    parts = [variant, *COMMON_FLAGS, *variant_flags(variant), compiler_version(), torch.__version__,
             str(Path(torch.__file__).parent), sys.version, sys.prefix, platform.machine()]
    h.update("\0".join(parts).encode())
    return h.hexdigest()[:16]


@lru_cache(maxsize=1)
def compiler_version() -> str:
    cxx = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return f"{cxx}: {out.stdout.splitlines()[0] if out.stdout else out.returncode}"
    except (OSError, subprocess.SubprocessError) as e:
        return f"{cxx}: {type(e).__name__}"


def _build(variant: str):
    key = build_key(variant)
    name = f"verispec_rowwise_{variant}_{key}"
    root = cache_root() / "kernels"
    build = root / f"{variant}-{key}"
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{variant}-{key}.lock"):
        library = build / f"{name}.so"
        if library.exists():
            module = _import(name, library)
        else:
            log.warning("compiling verispec's row-wise kernels for %s (once, ~1-2 minutes; cached in %s)", variant, build)
            if build.exists():  # a build that was interrupted: start it afresh
                shutil.rmtree(build)
            build.mkdir(parents=True)
            from torch.utils.cpp_extension import load

            # load() builds the library and imports it: that module is the one used
            module = load(name=name, sources=[str(p) for p in SOURCES], extra_cflags=COMMON_FLAGS + variant_flags(variant),
                          extra_include_paths=[str(KERNELS)], extra_ldflags=["-fopenmp"], build_directory=str(build), verbose=False)
            sys.modules[name] = module
    if module.variant() != variant:
        raise RuntimeError(f"{library} reports variant {module.variant()}, expected {variant}")
    return module


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on `path`, released when the process ends however it ends."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _import(name: str, library: Path):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module
