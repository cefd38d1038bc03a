"""Load time of a model on the torch backend with an empty cache, then a later load, beside the
time to read its file once.

    python scripts/first_load.py smollm2-135m gemma3-270m

Each model runs in a child process with VERISPEC_CACHE pointing at a fresh folder (the row-wise
kernels' builds copied in, so no compile is timed); the first load reads the GGUF's metadata,
hashes the file and builds the tokenizer, the later one reads them from that cache. The peak is the
child's VmHWM over its RSS after imports.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import sys, time
def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
from verispec.runners.registry import RunnerConfig, build_runner
from verispec.models.kernels import rowwise
from verispec.models.weights.registry import resolve
rowwise.kernel()
model = sys.argv[1]
path = resolve(model)
t = time.time()
with open(path, "rb") as f:
    while f.read(1 << 22):
        pass
read_s = time.time() - t
base = rss("VmRSS")
open("/proc/self/clear_refs", "w").write("5")
t = time.time(); r = build_runner("torch", RunnerConfig(model)); first = time.time() - t
peak = rss("VmHWM") - base
del r
t = time.time(); r = build_runner("torch", RunnerConfig(model)); later = time.time() - t
print(f"{model}: reading the file {read_s:.2f} s; first load (empty cache) {first:.2f} s, peak +{peak:.0f} MiB; later load {later:.2f} s")
"""


def main() -> int:
    from verispec.models.cache import cache_root

    home = cache_root()
    for model in sys.argv[1:] or ["smollm2-135m", "gemma3-270m"]:
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("kernels", "bundled", "bundled.json"):  # compiled kernels, assembled bundled files
                src = home / name
                if src.is_dir():
                    shutil.copytree(src, Path(tmp) / name)
                elif src.exists():
                    shutil.copy(src, Path(tmp) / name)
            env = {**os.environ, "VERISPEC_CACHE": tmp}
            proc = subprocess.run([sys.executable, "-c", CHILD, model], env=env, capture_output=True, text=True)
            print(proc.stdout.strip() or proc.stderr.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
