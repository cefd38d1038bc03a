"""Memory and decoding speed of GGUF models on each backend, side by side in one run.

    python scripts/quant_scale.py --models smollm2-135m gemma3-270m ~/.cache/verispec/synth/llama-1b-q4_k_m.gguf \
        --out docs/results/quant/2026-12-04.md

Each (model, backend) runs in a child process of its own, so memory figures do not mix:
- RSS after imports (the baseline), after load, and the peak after decoding; reported as the
  issue does: peak minus the baseline;
- load time; the one-row forward (ms, best of the decoding steps, after a 64-token prompt) and
  the 4-row verification forward; tokens/s of plain greedy decoding of 64 tokens;
- the floor: bytes of weights over the memory bandwidth measured in the same run.
Backends: torch:gguf (the file's blocks, the default), torch:gguf-int8 (the same blocks, int8
activations), torch:float32 (dequantised; skipped for files above --float32-max-mib), llamacpp (the
file as shipped).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, os, resource, sys, time
def rss(field="VmRSS"):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
import torch
from verispec.runners.registry import RunnerConfig, build_runner
from verispec.models.kernels import rowwise
rowwise.kernel()
model, backend, fmt = sys.argv[1], sys.argv[2], sys.argv[3] or None
base = rss()
with open("/proc/self/clear_refs", "w") as f:  # the peak (VmHWM) restarts here: imports do not count
    f.write("5")
t = time.time()
r = build_runner(backend, RunnerConfig(model, weights_format=fmt))
load_s = time.time() - t
after_load = rss()
vocab = min(r.vocab_size, 1000)
prompt = [(i * 7919) % vocab + 3 for i in range(64)]
seq = r.open(256)
out = r.forward(seq, prompt)
one = []
for _ in range(64):
    tok = int(out.logits[-1].argmax())
    t0 = time.perf_counter(); out = r.forward(seq, [tok]); one.append(time.perf_counter() - t0)
four = []
for _ in range(6):
    t0 = time.perf_counter(); r.forward(seq, [5, 6, 7, 8], num_logits=4); four.append(time.perf_counter() - t0)
    r.truncate(seq, 64 + 64)
peak = rss("VmHWM")
one.sort(); four.sort()
print(json.dumps(dict(load_s=load_s, base_mib=base, load_mib=after_load - base, peak_mib=peak - base,
                      one_ms=one[0] * 1000, one_median_ms=one[len(one) // 2] * 1000, four_ms=four[0] * 1000,
                      tok_s=len(one) / sum(one), weight_bytes=getattr(r, "weight_bytes", 0),
                      kernel=getattr(getattr(r, "model", None), "kernel_variant", None))))
"""


def run_child(model: str, backend: str, fmt: str | None, timeout: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, model, backend, fmt or ""], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--float32-max-mib", type=float, default=300, help="skip torch:float32 for files larger than this")
    ap.add_argument("--timeout", type=int, default=900)
    args = ap.parse_args()
    from verispec.bench.profile import measure_bandwidth
    from verispec.bench.report import print_and_save
    from verispec.models.weights.registry import resolve
    from verispec.models.kernels.rowwise import cpu_name

    bandwidth = measure_bandwidth()
    lines = [f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {cpu_name()}, {os.cpu_count()} cores; memory read bandwidth "
             f"{bandwidth:.1f} GB/s (torch's sum). Command: `python scripts/quant_scale.py --models {' '.join(args.models)}`.",
             "",
             "| model | file MiB | backend | load s | RSS after load MiB | peak RSS MiB | 1 row ms | floor ms | 1 row / floor | 4 rows ms | decode tok/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    from verispec.models.weights.loaders import gguf_meta

    for model in args.models:
        path = resolve(model)
        size = path.stat().st_size
        gguf_meta(path)  # fill the metadata cache first: the load times are those of a later load
        floor_ms = size / (bandwidth * 1e9) * 1000
        runs = [("torch", "gguf"), ("torch", "gguf-int8"), ("torch", "float32"), ("llamacpp", None)]
        for backend, fmt in runs:
            if fmt == "float32" and size > args.float32_max_mib * 2**20:  # its float32 copy: 4-7x the file
                continue
            label = f"{backend}:{fmt}" if fmt else backend
            print(f"[quant_scale] {Path(model).name} on {label} ...", file=sys.stderr, flush=True)
            res = run_child(model, backend, fmt, args.timeout)
            if "error" in res:
                lines.append(f"| {Path(model).name} | {size / 2**20:.0f} | {label} | failed: {res['error'][:120]} |||||||||")
                continue
            lines.append(f"| {Path(model).name} | {size / 2**20:.0f} | {label} | {res['load_s']:.2f} | {res['load_mib']:.0f} | "
                         f"{res['peak_mib']:.0f} | {res['one_ms']:.1f} | {floor_ms:.1f} | {res['one_ms'] / floor_ms:.2f} | "
                         f"{res['four_ms']:.1f} | {res['tok_s']:.1f} |")
            print(lines[-1], file=sys.stderr, flush=True)
    lines += ["", "floor: the GGUF file's bytes over the measured bandwidth (every weight read once a token); "
              "peak RSS: the child's peak (VmHWM, reset after imports) minus its RSS after imports (load + 64-token prompt + 64 decoding steps + "
              "six 4-row forwards); load s: a later load (the file's metadata cache filled before)."]
    print_and_save(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
