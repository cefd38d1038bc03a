"""llama.cpp's own `llama-server` as a benchmark peer: native plain decoding, or its own speculative
decoding (a draft model, or n-gram drafting), over HTTP as its users run it.

The server is the binary `make peers` builds (verispec.bench.native), started on the target GGUF with
this process's thread count, one slot and no prompt cache reuse between runs, bound to 127.0.0.1 on a
free port. A run sends the prompt's token ids to `/completion` and reads back the generated ids and
the server's own timings (prompt processing and generation, measured inside llama.cpp). The server
dies with the process that started it (PR_SET_PDEATHSIG), so a killed benchmark leaves none behind.
"""

from __future__ import annotations

import ctypes
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from verispec.bench import native
from verispec.bench.methods import Run, Unavailable
from verispec.server.loadtest import free_port


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def speculative_flags(spec_type: str, draft: Path | None = None, n_max: int | None = None,
                      p_min: float | None = None) -> list[str]:
    """llama-server's flags for its own speculative decoding (this version's: `--spec-type` is
    required, without it a draft model is silently unused): a draft model (`draft-simple`, the
    draft GGUF in `draft`) or n-gram drafting (`ngram-mod`, ...), with its longest draft and the
    draft's least confidence to go on drafting."""
    flags = ["--spec-type", spec_type]
    if draft is not None:
        flags += ["-md", str(draft)]
    if n_max is not None:
        flags += ["--spec-draft-n-max", str(n_max)]
    if p_min is not None:
        flags += ["--spec-draft-p-min", str(p_min)]
    return flags


class LlamaServerMethod:
    """A real llama-server process on the GGUF target, decoding plainly or with `spec_flags`
    (`speculative_flags`)."""

    def __init__(self, name: str, gguf_path: Path, threads: int, context: int = 4096, timeout: float = 300.0,
                 spec_flags: list[str] = ()) -> None:
        try:
            binary = native.tool("llama-server")
        except native.NativeUnavailable as e:
            raise Unavailable(str(e)) from e
        self.name = name
        self.speculative = False  # a peer: compared, not held to our exactness
        self.weight_bytes = gguf_path.stat().st_size
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        cmd = [str(binary), "-m", str(gguf_path), "-t", str(threads), "-c", str(context), "--port", str(port),
               "--host", "127.0.0.1", "-np", "1", "--no-webui", "--cache-reuse", "0", *spec_flags]
        if "-md" in spec_flags:
            cmd += ["-td", str(threads)]
        self._log = open(native.build_dir() / f"llama-server-{port}.log", "w")
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        deadline = time.time() + timeout
        while True:
            if self._proc.poll() is not None:
                raise Unavailable(f"llama-server exited with {self._proc.returncode} (log: {self._log.name})")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.time() > deadline:
                self.close()
                raise Unavailable(f"llama-server not ready after {timeout:.0f} s (log: {self._log.name})")
            time.sleep(0.2)

    def run(self, prompt_ids: list[int], max_tokens: int, temperature: float, seed: int) -> Run:
        body = {"prompt": list(prompt_ids), "n_predict": max_tokens, "temperature": temperature, "seed": seed,
                "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
                "cache_prompt": False, "return_tokens": True, "stream": False}
        request = urllib.request.Request(self.base + "/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        t = time.perf_counter()
        with urllib.request.urlopen(request, timeout=1800) as r:
            out = json.loads(r.read())
        wall = time.perf_counter() - t
        timings = out.get("timings", {})
        tokens = [int(i) for i in out.get("tokens", [])]
        ttft = timings.get("prompt_ms", 0.0) / 1000
        if tokens and timings.get("predicted_n"):
            ttft += timings["predicted_ms"] / 1000 / timings["predicted_n"]  # the first token's share of generation
        # a forward a token, the prompt's included; where the server drafted, one per step instead
        # (its timings count the drafts: draft_n proposed, draft_n_accepted kept)
        forwards = len(tokens)
        if timings.get("draft_n"):
            forwards = max(1, len(tokens) - int(timings.get("draft_n_accepted", 0)))
        return Run(tokens, wall, ttft, forwards)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._log.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
