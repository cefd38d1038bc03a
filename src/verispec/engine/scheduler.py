"""Continuous batching: requests join and leave the running batch at every step.

The scheduler owns a bounded waiting queue and the running batch. One `step()`:

  1. retire   aborted requests leave (their caches are freed at once);
  2. admit    waiting requests join while the batch has room and the KV budget allows their
              worst case (prompt + max_tokens positions, target's and drafter's keys and values:
              `kv_budget`; the oldest waits first, nothing is dropped): prefill, first token out;
              with chunked prefill they only open their caches here, and
  3. prefill  the oldest admitted request forwards one chunk of its prompt (chunked prefill):
              running streams wait one chunk per step, not a whole long prompt;
  4. decode   one `step_batch` over every running request: each drafts its own k (zero
              included), one target forward verifies all the drafts;
  5. finish   requests that hit a stop or their length leave and free their caches.

Every new block of tokens goes to the request's `on_event` callback as an `Event`, on the engine
thread (a server hands it to its event loop). `submit` and `abort` may be called from any thread;
`step` runs on one thread only (`EngineLoop`), the only one that touches models and caches.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from verispec.config import SamplingParams
from verispec.engine.metrics import RequestMetrics
from verispec.engine.decoder import Request, SpeculativeDecoder
from verispec.errors import ContextLengthError, QueueFullError, VerispecError

log = logging.getLogger("verispec")


@dataclass
class Event:
    handle: "Handle"
    new_token_ids: list[int]  # the block committed at this step (may be empty on finish)
    finished: bool = False
    error: Exception | None = None  # set when the engine failed this request


@dataclass(eq=False)
class Handle:
    """A submitted request as its submitter sees it."""

    id: int
    prompt_ids: list[int]
    params: SamplingParams
    on_event: Callable[[Event], None]
    submitted: float = field(default_factory=time.perf_counter)
    kv_bytes: int = 0  # the most KV cache it may fill (prompt + max_tokens positions), reserved while admitted
    req: Request | None = None  # set when admitted
    aborted: bool = False
    done: bool = False

    @property
    def output_ids(self) -> list[int]:
        return self.req.output_ids if self.req is not None else []

    @property
    def finish_reason(self) -> str | None:
        if self.aborted:
            return "abort"
        return self.req.finish_reason if self.req is not None else None

    @property
    def metrics(self) -> RequestMetrics:
        return self.req.metrics if self.req is not None else RequestMetrics(num_prompt_tokens=len(self.prompt_ids))

    def text(self) -> str:
        """The output text, stop strings and stop tokens cut as the offline API cuts them."""
        return self.req.text() if self.req is not None else ""


class Scheduler:
    def __init__(
        self,
        decoder: SpeculativeDecoder,
        max_num_seqs: int = 16,
        max_waiting: int = 64,
        on_retire: Callable[[Handle], None] | None = None,
        chunked_prefill: bool = False,
        kv_budget: int | None = None,
    ) -> None:
        """`kv_budget`: bytes of KV cache the admitted requests may fill at most, each counted at
        its worst case (None: no bound)."""
        self.decoder = decoder
        self.kv_budget = kv_budget
        self.kv_reserved = 0  # the admitted requests' worst cases
        self.max_num_seqs = max_num_seqs
        self.max_waiting = max_waiting
        self.on_retire = on_retire  # called once per request that leaves (finished, aborted, failed)
        self.chunked_prefill = chunked_prefill
        self.waiting: deque[Handle] = deque()
        self.prefilling: list[Handle] = []  # admitted, prompt not yet all in (chunked prefill)
        self.running: list[Handle] = []
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._ids = itertools.count(1)

    # -- any thread ---------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], params: SamplingParams, on_event: Callable[[Event], None]) -> Handle:
        """Queue a request. Raises the decoder's typed errors for a bad prompt, QueueFullError when full."""
        self.decoder.check_prompt(prompt_ids, params)
        need = self.decoder.kv_bytes(len(prompt_ids) + params.max_tokens)
        if self.kv_budget is not None and need > self.kv_budget:
            raise ContextLengthError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) needs {need / 2**20:.1f} MiB of KV "
                f"cache, more than the engine's whole budget (kv_cache_max_bytes = {self.kv_budget / 2**20:.1f} MiB)")
        with self._lock:
            if len(self.waiting) >= self.max_waiting:
                raise QueueFullError(f"the waiting queue is full ({self.max_waiting} requests); retry later")
            handle = Handle(next(self._ids), list(prompt_ids), params, on_event, kv_bytes=need)
            self.waiting.append(handle)
            self._wakeup.notify()
        return handle

    def abort(self, handle: Handle) -> None:
        """Cancel a request: a waiting one leaves now, a running one at the start of the next step."""
        with self._lock:
            if handle.done or (handle.req is not None and handle.req.finished):
                return  # finished already (its last event may still be on its way)
            handle.aborted = True
            if handle in self.waiting:
                self.waiting.remove(handle)
                handle.done = True
            else:
                self._wakeup.notify()
                return
        if self.on_retire is not None:
            self.on_retire(handle)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        """Requests admitted: decoding, or prefilling their prompts."""
        return len(self.running) + len(self.prefilling)

    def wait_for_work(self, timeout: float) -> bool:
        with self._lock:
            if not self.waiting and not self.num_running:
                self._wakeup.wait(timeout)
            return bool(self.waiting or self.num_running)

    # -- the engine thread --------------------------------------------------------------------
    def step(self) -> None:
        # 1. retire aborted requests
        for handle in [h for h in self.prefilling + self.running if h.aborted]:
            self._retire(handle)
        # 2. admit
        while self.num_running < self.max_num_seqs:
            with self._lock:
                if not self.waiting:
                    break
                if self.kv_budget is not None and self.kv_reserved + self.waiting[0].kv_bytes > self.kv_budget:
                    break  # the oldest waits for memory (none behind it overtakes: no starvation)
                handle = self.waiting.popleft()
                self.kv_reserved += handle.kv_bytes
            self._admit(handle)
        # 3. prefill one chunk
        if self.prefilling:
            self._prefill(self.prefilling[0])
        if not self.running:
            return
        # 4. decode: one forward for the whole batch
        active = list(self.running)  # a copy: retiring below changes self.running
        try:
            blocks = self.decoder.step_batch([h.req for h in active])
        except Exception as e:  # a failed forward must not leave clients waiting forever
            log.exception("engine step failed; failing %d running requests", len(active))
            for handle in active:
                self._fail(handle, e)
            return
        # 5. emit, and finish what ended
        for handle, block in zip(active, blocks):
            finished = handle.req.finished
            self._send(handle, Event(handle, block, finished=finished))
            if finished:
                self._retire(handle)

    def _admit(self, handle: Handle) -> None:
        try:
            handle.req = self.decoder.begin(handle.prompt_ids, handle.params)
        except Exception as e:  # begin frees what it took before raising
            if not isinstance(e, VerispecError):
                log.exception("admitting request %d failed", handle.id)
            self.kv_reserved -= handle.kv_bytes
            handle.done = True
            self._send(handle, Event(handle, [], finished=True, error=e))
            if self.on_retire is not None:
                self.on_retire(handle)
            return
        handle.req.metrics.queue_time = handle.req.started - handle.submitted
        self.prefilling.append(handle)
        if not self.chunked_prefill:
            self._prefill(handle, whole=True)

    def _prefill(self, handle: Handle, whole: bool = False) -> None:
        """One chunk of the handle's prompt (all of it when `whole`); once it is all in, the first
        token goes out and the request joins the decoding batch."""
        try:
            while not self.decoder.prefill(handle.req):
                if not whole:
                    return
        except Exception as e:
            if not isinstance(e, VerispecError):
                log.exception("prefill failed for request %d", handle.id)
            self._fail(handle, e)
            return
        self.prefilling.remove(handle)
        self.running.append(handle)
        finished = handle.req.finished
        self._send(handle, Event(handle, list(handle.req.output_ids), finished=finished))
        if finished:
            self._retire(handle)

    def _fail(self, handle: Handle, error: Exception) -> None:
        self._send(handle, Event(handle, [], finished=True, error=error))
        self._retire(handle)

    def _retire(self, handle: Handle) -> None:
        (self.running if handle in self.running else self.prefilling).remove(handle)
        self.decoder.finish(handle.req)
        self.kv_reserved -= handle.kv_bytes
        handle.done = True
        if self.on_retire is not None:
            self.on_retire(handle)

    @staticmethod
    def _send(handle: Handle, event: Event) -> None:
        if handle.aborted:
            return
        try:
            handle.on_event(event)
        except Exception:
            log.exception("event callback of request %d failed", handle.id)


class EngineLoop:
    """Runs `scheduler.step()` on a daemon thread while there is work."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="verispec-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        with self.scheduler._lock:
            self.scheduler._wakeup.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.scheduler.wait_for_work(timeout=0.5):
                self.scheduler.step()
