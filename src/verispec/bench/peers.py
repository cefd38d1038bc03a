"""Third-party peers (transformers, llama-cpp-python) run in child processes.

A peer is other people's native code: a segfault in it (llama.cpp's AMX kernels, say) would end
the benchmark and every method's results with it. So each peer lives in a child process of its
own, `python -m verispec.bench.peers FD` (a fresh interpreter: nothing inherited but the
environment, and unlike multiprocessing's 'spawn' it never re-imports the caller's main script),
driven over a socket pair with multiprocessing's Connection (pickled messages): the parent sends
a prompt's token ids and settings, the child runs the peer's `Method.run` and sends back its
`Run` (token ids, and timings measured in the child around the generation, as in one process)
and the child's peak RSS. A child that dies (a signal, an exit), raises, or does not answer
within the timeout makes `PeerFailed` with the reason, for the bench to report that method as
failed while the others go on.

Fault injection, to show the containment (tests, or by hand): VERISPEC_BENCH_CRASH_PEER=NAME
makes peer NAME's child kill itself with SIGSEGV at its first run (the bench's warm-up);
NAME@N at its N-th run, NAME@load while loading; several entries separated by commas.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Callable

import torch

from verispec.bench.methods import HFMethod, LlamaCppMethod, Method, Run, Unavailable, load_hf_model

CRASH_ENV = "VERISPEC_BENCH_CRASH_PEER"


def _gguf(model: str):
    from verispec.models.weights.registry import resolve

    path = resolve(model)
    if path.suffix.lower() != ".gguf":
        raise Unavailable("llama.cpp needs a GGUF target")
    return path


@dataclass(frozen=True)
class Peer:
    """A third-party decoding method: how to build it in its child process, and what is known of it
    before starting one."""

    family: str  # the report's group: "hf", "llama.cpp (peer)"
    speculative: bool  # it drafts (its speed compared with its family's plain decoding)
    build: Callable[[str, str, list[int], str | None], Method]  # (name, model, eos, draft_model)
    needs: str = ""  # "assistant": a same-vocabulary draft model; "llama_cpp": llama-cpp-python and a GGUF target;
    # "native": llama.cpp's native tools (`make peers`) and a GGUF target; "native_draft": those and a draft model

    def check(self, model: str, draft_model: str | None) -> None:
        """Unavailable where it cannot run here, known without starting its child."""
        if self.needs == "assistant" and not draft_model:
            raise Unavailable("no same-vocabulary assistant (--draft-model) for this target")
        if self.needs == "llama_cpp":
            if importlib.util.find_spec("llama_cpp") is None:
                raise Unavailable("llama-cpp-python is not installed (pip install llama-cpp-python)")
            _gguf(model)
        if self.needs == "native_draft" and not draft_model:
            raise Unavailable("no same-vocabulary draft model (--draft-model) for this target")
        if self.needs in ("native", "native_draft"):
            from verispec.bench import native

            try:
                native.where()
            except native.NativeUnavailable as e:
                raise Unavailable(str(e)) from e
            _gguf(model)


def _hf(lookup: int = 0, assisted: bool = False):
    def build(name: str, model: str, eos: list[int], draft_model: str | None) -> Method:
        if assisted and not draft_model:
            raise Unavailable("no same-vocabulary assistant (--draft-model) for this target")
        assistant = load_hf_model(draft_model) if assisted else None
        return HFMethod(name, load_hf_model(model), eos, prompt_lookup=lookup, assistant=assistant)
    return build


def _llamacpp(lookup: int = 0):
    def build(name: str, model: str, eos: list[int], draft_model: str | None) -> Method:
        return LlamaCppMethod(name, str(_gguf(model)), eos, prompt_lookup=lookup)
    return build


def _llama_server(spec_type: str | None = None, n_max: int | None = None, p_min: float | None = None):
    """llama-server on the target: plain, or its own speculative decoding (`spec_type`: draft-simple
    with --draft-model, or an n-gram kind)."""
    def build(name: str, model: str, eos: list[int], draft_model: str | None) -> Method:
        from verispec.bench.llama_server import LlamaServerMethod, speculative_flags

        flags: list[str] = []
        if spec_type is not None:
            if spec_type == "draft-simple" and not draft_model:
                raise Unavailable("no same-vocabulary draft model (--draft-model) for this target")
            draft = _gguf(draft_model) if spec_type == "draft-simple" else None
            flags = speculative_flags(spec_type, draft, n_max, p_min)
        return LlamaServerMethod(name, _gguf(model), torch.get_num_threads(), spec_flags=flags)
    return build


# llama-server's own draft-model decoding over the grid of its two knobs: the longest draft and the
# draft's least confidence to go on (llamacpp_native_draft_n4_p0.5); llamacpp_native_draft: the server's defaults
NATIVE_DRAFT_GRID = [(n, p) for n in (2, 4, 8) for p in (0.0, 0.5, 0.8)]


# llama-cpp-python's peers run its Python generation loop (`Llama.generate`): not llama.cpp's native
# speed; llamacpp_native is llama.cpp's own llama-server (built by `make peers`)
PEERS: dict[str, Peer] = {
    "hf": Peer("hf", False, _hf()),
    "hf_prompt_lookup": Peer("hf", True, _hf(lookup=10)),
    "hf_assisted": Peer("hf", True, _hf(assisted=True), needs="assistant"),
    "llamacpp": Peer("llama.cpp (peer)", False, _llamacpp(), needs="llama_cpp"),
    "llamacpp_prompt_lookup": Peer("llama.cpp (peer)", True, _llamacpp(lookup=10), needs="llama_cpp"),
    "llamacpp_native": Peer("llama.cpp (native)", False, _llama_server(), needs="native"),
    "llamacpp_native_draft": Peer("llama.cpp (native)", True, _llama_server("draft-simple"), needs="native_draft"),
    "llamacpp_native_ngram": Peer("llama.cpp (native)", True, _llama_server("ngram-mod"), needs="native"),
}
PEERS.update({f"llamacpp_native_draft_n{n}_p{p:g}": Peer("llama.cpp (native)", True, _llama_server("draft-simple", n, p),
                                                        needs="native_draft") for n, p in NATIVE_DRAFT_GRID})


class PeerFailed(Exception):
    """A peer's child process died, timed out or raised: the reason is the message."""


def build_peer(name: str, model: str, eos: list[int], draft_model: str | None = None) -> Method:
    """The peer `name` on target `model`, built in the process that runs it."""
    peer = PEERS.get(name)
    if peer is None:
        raise Unavailable(f"unknown method {name!r}")
    return peer.build(name, model, eos, draft_model)


class IsolatedPeer:
    """A peer `Method` whose instance lives in a child process (see the module's notes).

    The child starts loading at construction; `wait_ready` waits for it (several peers load side
    by side). `peak_rss_mb` is the child's high-water mark after the latest run."""

    speculative = False  # a peer: its output is compared, but a mismatch is not our bug

    def __init__(self, name: str, model: str, eos: list[int], draft_model: str | None = None,
                 timeout: float = 600.0) -> None:
        self.name = name
        self.timeout = timeout
        self.weight_bytes = 0
        self.peak_rss_mb: float | None = None
        self._conn, child_end = multiprocessing.Pipe()
        fd = child_end.fileno()
        self._proc = subprocess.Popen([sys.executable, "-m", "verispec.bench.peers", str(fd)], pass_fds=[fd])
        child_end.close()  # the child holds the other end: its death reads as end of file here
        try:
            self._conn.send(dict(name=name, model=model, eos=list(eos), draft_model=draft_model,
                                 threads=torch.get_num_threads()))
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # a child already gone: wait_ready says why

    def wait_ready(self) -> None:
        """Block until the peer is loaded; Unavailable if it cannot run here, PeerFailed if its child died."""
        kind, value = self._receive("while loading")
        if kind == "unavailable":
            self.close()
            raise Unavailable(value)
        self.weight_bytes = value

    def run(self, prompt_ids, max_tokens, temperature, seed) -> Run:
        try:
            self._conn.send((list(prompt_ids), max_tokens, temperature, seed))
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise PeerFailed(self._death()) from None
        run, self.peak_rss_mb = self._receive("")[1]
        return run

    @property
    def pid(self) -> int:
        return self._proc.pid

    def close(self) -> None:
        """Ask the child to exit (a hung one is killed)."""
        if self._proc.poll() is None:
            try:
                self._conn.send(None)
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._kill()
        self._conn.close()

    def _kill(self) -> None:
        self._proc.kill()
        self._proc.wait()

    def _receive(self, when: str) -> tuple:
        suffix = f" {when}" if when else ""
        if not self._conn.poll(self.timeout):
            self._kill()
            raise PeerFailed(f"no answer within {self.timeout:g} s{suffix} (killed)")
        try:
            kind, value = self._conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            raise PeerFailed(self._death() + suffix) from None
        if kind == "error":
            self.close()
            raise PeerFailed(f"raised {value}{suffix}")
        return kind, value

    def _death(self) -> str:
        """Why the child is gone, from its exit status."""
        try:
            code = self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._kill()
            return "closed its pipe (killed)"
        if code < 0:
            try:
                return f"crashed: signal {-code} ({signal.Signals(-code).name})"
            except ValueError:
                return f"crashed: signal {-code}"
        return f"exited with code {code}"


# -- the child ----------------------------------------------------------------------------------


def _crash_point(name: str) -> int | None:
    """From VERISPEC_BENCH_CRASH_PEER: 0 = crash while loading, N = at the N-th run, None = never."""
    for entry in os.environ.get(CRASH_ENV, "").split(","):
        peer, _, at = entry.strip().partition("@")
        if peer == name:
            return 0 if at == "load" else int(at or 1)
    return None


def _crash() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def _serve(conn: Connection) -> None:
    faulthandler.enable()  # a native crash prints the Python stack to stderr (the exit stays the signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    spec = conn.recv()
    torch.set_num_threads(spec.pop("threads"))  # the parent's setting, as when peers ran in its process
    crash_at = _crash_point(spec["name"])
    try:
        if crash_at == 0:
            _crash()
        method = build_peer(**spec)
    except Unavailable as e:
        conn.send(("unavailable", str(e)))
        return
    except Exception as e:  # noqa: BLE001 - reported to the parent as the peer's failure
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", int(method.weight_bytes)))
    calls = 0
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the parent is gone
            return
        if request is None:
            return
        calls += 1
        if calls == crash_at:
            _crash()
        try:
            run = method.run(*request)
        except Exception as e:  # noqa: BLE001
            conn.send(("error", f"{type(e).__name__}: {e}"))
            return
        conn.send(("run", (run, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
