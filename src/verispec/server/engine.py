"""The bridge between the HTTP event loop and the engine thread.

`AsyncEngine` loads the model on a background thread (the server answers /health with 503 until
it is ready), runs the scheduler's `EngineLoop`, and turns a request's engine events into an
async stream. Leaving the stream early (a client that disconnects, a cancelled handler) aborts
the request, which frees its caches at the engine's next step.

`TextDeltas` turns committed token blocks into text deltas that never have to be taken back:
it holds back an incomplete UTF-8 character and the last (longest stop string - 1) characters,
which a stop string completed by a later token could still cut.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import AsyncIterator

from verispec.config import EngineConfig, SamplingParams, ServerConfig
from verispec.engine.scheduler import EngineLoop, Event, Handle, Scheduler
from verispec.errors import EngineNotReadyError
from verispec.server.logprobs import TokenStrings
from verispec.server.metrics import ServerMetrics

log = logging.getLogger("verispec")


@dataclass
class ChoiceEvent:
    index: int  # which prompt of the request
    event: Event


class AsyncEngine:
    def __init__(self, engine_config: EngineConfig, server_config: ServerConfig, model_name: str) -> None:
        self.engine_config = engine_config
        self.server_config = server_config
        self.metrics = ServerMetrics(model_name)
        self.loaded = None  # the assembled engine (engine/assembly.py), once loaded
        self.token_strings: TokenStrings | None = None  # for logprobs, once loaded
        self.scheduler: Scheduler | None = None
        self.loop: EngineLoop | None = None
        self.load_error: Exception | None = None
        self._ready = threading.Event()

    # -- lifecycle ----------------------------------------------------------------------------
    def start_loading(self) -> threading.Thread:
        thread = threading.Thread(target=self._load, name="verispec-load", daemon=True)
        thread.start()
        return thread

    def _load(self) -> None:
        from verispec.engine.assembly import build_engine

        try:
            c = self.engine_config
            engine = build_engine(c)
            s = self.server_config
            scheduler = Scheduler(engine.decoder, c.max_num_seqs, s.max_waiting, on_retire=self.metrics.on_retire,
                                  chunked_prefill=c.enable_chunked_prefill, kv_budget=c.kv_cache_max_bytes)
            self.metrics.bind(
                lambda: scheduler.num_running,
                lambda: scheduler.num_waiting,
                lambda: engine.cache_bytes,
                lambda: engine.open_sequences,
                lambda: engine.proposer.memory_bytes if engine.proposer is not None else 0,
                lambda: engine.proposer.cached_tokens if engine.proposer is not None else 0,
                lambda: engine.decoder.prefix_cache.bytes if engine.decoder.prefix_cache else 0,
            )
            self.loaded, self.scheduler = engine, scheduler
            self.token_strings = TokenStrings(engine.tokenizer, engine.decoder.grammars)
            self.loop = EngineLoop(scheduler)
            self.loop.start()
            self._ready.set()
            log.info("model %s loaded; serving", c.model)
        except Exception as e:  # reported by /health and every request
            log.exception("loading %s failed", self.engine_config.model)
            self.load_error = e

    def shutdown(self) -> None:
        if self.loop is not None:
            self.loop.stop()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def check_ready(self) -> None:
        if self.load_error is not None:
            raise EngineNotReadyError(f"the model failed to load: {type(self.load_error).__name__}: {self.load_error}")
        if not self.ready:
            raise EngineNotReadyError("the model is still loading; retry shortly")

    # -- requests -----------------------------------------------------------------------------
    def submit(self, requests: list[tuple[list[int], SamplingParams]]) -> "RequestStream":
        """Queue every (prompt ids, params) of one HTTP request, or none: a refusal (typed error)
        aborts the ones already queued and propagates, before any response is started."""
        self.check_ready()
        return RequestStream(self.scheduler, requests, asyncio.get_running_loop())


class RequestStream:
    """The engine events of one HTTP request's choices, as an async iterator."""

    def __init__(self, scheduler: Scheduler, requests: list[tuple[list[int], SamplingParams]], loop: asyncio.AbstractEventLoop) -> None:
        self.scheduler = scheduler
        self.queue: asyncio.Queue[ChoiceEvent] = asyncio.Queue()
        self.handles: list[Handle] = []
        try:
            for index, (ids, params) in enumerate(requests):
                put = lambda ev, i=index: loop.call_soon_threadsafe(self.queue.put_nowait, ChoiceEvent(i, ev))  # noqa: E731
                self.handles.append(scheduler.submit(ids, params, put))
        except BaseException:
            self.abort()
            raise

    async def events(self) -> AsyncIterator[ChoiceEvent]:
        remaining = len(self.handles)
        while remaining:
            item = await self.queue.get()
            remaining -= item.event.finished
            yield item

    def abort(self) -> None:
        """Cancel what is still running (a no-op for finished choices)."""
        for handle in self.handles:
            if not handle.done:
                self.scheduler.abort(handle)


class TextDeltas:
    """Text of one choice as safe-to-send deltas (see the module docstring)."""

    def __init__(self, tokenizer, params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.hold = max((len(s) for s in params.stop or []), default=1) - 1
        self.sent = 0
        self.ids: list[int] = []  # the tokens of the events seen (the engine may be further on)

    def delta(self, event: Event) -> str:
        self.ids.extend(event.new_token_ids)
        if event.finished:
            text = event.handle.text()  # final: stop strings and stop tokens cut
        else:
            text = self.tokenizer.decode(self.ids).rstrip("\ufffd")
            text = text[: max(0, len(text) - self.hold)]
        out = text[self.sent :]
        self.sent = max(self.sent, len(text))
        return out
