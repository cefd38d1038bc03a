"""llama.cpp's own native tools (llama-bench, llama-server, llama-speculative-simple), built here.

The measuring stick for plain decoding and prompt processing is llama.cpp's native code, not a
Python loop around it. `build()` compiles the tools from the llama.cpp source vendored in the
pinned llama-cpp-python sdist (the same source as the `llamacpp` backend), for this CPU
(`-DGGML_NATIVE=ON`), statically, without the web UI download. The result is cached per source
version and CPU (its model name and feature flags), so a session on another machine builds its own.
About 20 minutes on 2 cores; `make peers` runs it, `verispec bench` and scripts/compare_native.py use
what it left.

    python -m verispec.bench.native build     # build (or say where the cached build is)
    python -m verispec.bench.native where     # the folder holding the binaries, or exit 1
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from verispec.models.cache import cache_root, log

SDIST = "llama-cpp-python==0.3.36"
TOOLS = ("llama-bench", "llama-server", "llama-speculative-simple", "llama-cli")
CMAKE_FLAGS = (
    "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_CURL=OFF",
)


class NativeUnavailable(RuntimeError):
    """llama.cpp's native tools are not built here (and how to build them)."""


def cpu_key() -> str:
    """This CPU's model name and feature flags, hashed: a native build runs only where it was built."""
    model, flags = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return hashlib.sha256(f"{model}|{flags}".encode()).hexdigest()[:12]


def build_dir() -> Path:
    version = SDIST.split("==")[1]
    return cache_root() / "native" / f"llama.cpp-{version}-{cpu_key()}"


def where() -> Path:
    """The folder holding the built tools; NativeUnavailable when they are not built for this CPU."""
    folder = build_dir() / "bin"
    if all((folder / t).is_file() for t in TOOLS):
        return folder
    raise NativeUnavailable(f"llama.cpp's native tools are not built for this CPU ({folder}): run `make peers`")


def tool(name: str) -> Path:
    return where() / name


def build(jobs: int | None = None) -> Path:
    """Build the tools once for this CPU and source (cached); returns the folder holding them."""
    try:
        return where()
    except NativeUnavailable:
        pass
    for program in ("cmake", "ninja", "c++"):
        if shutil.which(program) is None:
            raise NativeUnavailable(f"building llama.cpp's tools needs {program} on PATH")
    out = build_dir()
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    source = _source(work)
    started = time.time()
    log(f"building llama.cpp's native tools from {SDIST}'s vendored source for this CPU: about 20 minutes on 2 cores")
    _run(["cmake", "-S", str(source), "-B", str(work / "build"), *CMAKE_FLAGS], work / "cmake.log")
    cmd = ["ninja", "-C", str(work / "build"), *TOOLS]
    if jobs:
        cmd[1:1] = ["-j", str(jobs)]
    _run(cmd, work / "ninja.log", progress=True)
    bin_dir = out / "bin"
    bin_dir.mkdir(exist_ok=True)
    for t in TOOLS:
        shutil.copy2(work / "build" / "bin" / t, bin_dir / t)
    shutil.rmtree(work / "build", ignore_errors=True)
    log(f"llama.cpp's native tools built in {time.time() - started:.0f} s: {bin_dir}")
    return bin_dir


def _source(work: Path) -> Path:
    """The vendored llama.cpp of the pinned sdist, downloaded with pip and unpacked once."""
    unpacked = work / "src"
    marker = unpacked / ".complete"
    if not marker.exists():
        shutil.rmtree(unpacked, ignore_errors=True)
        unpacked.mkdir(parents=True)
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            log(f"downloading the {SDIST} source with pip")
            _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", tmp, SDIST],
                 work / "download.log")
            archives = list(Path(tmp).glob("*.tar.gz"))
            if len(archives) != 1:
                raise NativeUnavailable(f"pip download of {SDIST} gave {[p.name for p in Path(tmp).iterdir()]}")
            with tarfile.open(archives[0]) as tar:
                tar.extractall(unpacked, filter="data")
        marker.touch()
    found = [p for p in unpacked.glob("*/vendor/llama.cpp") if (p / "CMakeLists.txt").is_file()]
    if len(found) != 1:
        raise NativeUnavailable(f"no vendor/llama.cpp in the unpacked {SDIST}")
    return found[0]


def _run(cmd: list[str], log_file: Path, progress: bool = False) -> None:
    """Run a build step, its output into log_file; with progress, ninja's [n/N] lines shown every 30 s."""
    with open(log_file, "w") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        last = 0.0
        assert proc.stdout is not None
        for line in proc.stdout:
            f.write(line)
            if progress and line.startswith("[") and time.time() - last > 30:
                log(f"  {line.split(' ', 1)[0]} {os.path.basename(line.split()[-1])}")
                last = time.time()
        if proc.wait() != 0:
            tail = log_file.read_text()[-3000:]
            raise NativeUnavailable(f"{' '.join(cmd[:2])} failed (log: {log_file}):\n{tail}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "build"
    try:
        if command == "build":
            print(build())
        elif command == "where":
            print(where())
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except NativeUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
