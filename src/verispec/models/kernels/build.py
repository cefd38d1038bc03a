"""Building and loading the project's C++ extension modules: compiled once with torch's extension
builder into the verispec cache (kernels/), in a folder keyed by everything the library depends on
(`build_key`: sources, flags, compiler, torch, Python, the environment's paths), so a module is
never rebuilt without a change; a file lock keeps two processes from building the same one at once.
The row-wise kernels (rowwise.py) and suffix decoding's search (proposers/suffix/native.py) build
here."""

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

from verispec.models.cache import cache_root

log = logging.getLogger("verispec")


def build_key(sources: list[Path], flags: list[str]) -> str:
    """What a built library depends on: its sources and headers, flags, compiler, torch, Python and
    the environment's paths (torch's builder writes them into its build files)."""
    h = hashlib.sha256()
    for p in sources:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    parts = [*flags, compiler_version(), torch.__version__, str(Path(torch.__file__).parent), sys.version, sys.prefix,
             platform.machine()]
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


def build_module(name: str, folder: str, sources: list[Path], include: Path, cflags: list[str],
                 ldflags: list[str], what: str):
    """The extension module `name` built from `sources` (compiled into cache_root()/kernels/<folder>
    if not there yet, `what` naming it in the one log line a build writes), imported."""
    root = cache_root() / "kernels"
    build = root / folder
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{folder}.lock"):
        library = build / f"{name}.so"
        if library.exists():
            return _import(name, library)
        log.warning("compiling %s (once; cached in %s)", what, build)
        if build.exists():  # a build that was interrupted: start it afresh
            shutil.rmtree(build)
        build.mkdir(parents=True)
        from torch.utils.cpp_extension import load

        # load() builds the library and imports it: that module is the one used
        module = load(name=name, sources=[str(p) for p in sources], extra_cflags=cflags, extra_include_paths=[str(include)],
                      extra_ldflags=ldflags, build_directory=str(build), verbose=False)
        sys.modules[name] = module
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
