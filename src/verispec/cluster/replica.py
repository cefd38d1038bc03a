"""One replica: one verispec engine and the single-process server's own app (server/app.py),
driven over ASGI in memory, so every endpoint answers exactly as `verispec serve` does.

`Replica.forward(method, path, headers, body, affinity)` is an async generator: first the response
head `(status, headers)`, then the body's chunks as the app sends them (a server-sent-events
stream chunk by chunk); the head names the replica (`x-verispec-replica`). Cancelling it (the client went away) tells the app the client disconnected,
which aborts the request in the engine. A thread pushes the replica's Prometheus text to the
ingress's metrics board every `PUSH_PERIOD` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import AsyncIterator

from verispec.config import EngineConfig, ServerConfig
from verispec.errors import ConfigError

log = logging.getLogger("verispec")

PUSH_PERIOD = 1.0  # seconds between pushes of this replica's metrics


class Replica:
    def __init__(self, engine_config: EngineConfig, server_config: ServerConfig, board_name: str | None = None) -> None:
        from verispec.server import create_app

        self.app = create_app(engine_config, server_config)
        engine = self.app.state.engine
        engine._load()  # synchronously: Ray Serve counts the replica as started once the model is loaded
        if engine.load_error is not None:
            raise ConfigError(f"the model failed to load: {type(engine.load_error).__name__}: {engine.load_error}")
        self.engine = engine
        self.replica_tag = _replica_tag()
        self.board_name = board_name
        self._stop = threading.Event()
        if board_name is not None:
            threading.Thread(target=self._push_metrics, name="verispec-metrics-push", daemon=True).start()

    # -- requests -----------------------------------------------------------------------------
    async def forward(self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes,
                      query: bytes = b"", affinity: list[str] | None = None) -> AsyncIterator:
        """Run one HTTP request through the app (see the module docstring). `affinity` is for the
        router only."""
        out: asyncio.Queue = asyncio.Queue()
        disconnected = asyncio.Event()
        sent_body = False

        async def receive() -> dict:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            await out.put(message)

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": query, "root_path": "",
            "headers": [(bytes(k), bytes(v)) for k, v in headers], "client": ("127.0.0.1", 0), "server": ("replica", 0),
        }
        task = asyncio.ensure_future(self._run(scope, receive, send, out))
        try:
            while True:
                message = await out.get()
                if message is None:  # the app returned
                    return
                if message["type"] == "http.response.start":
                    headers = [(k, v) for k, v in message.get("headers", [])] + [(b"x-verispec-replica", self.replica_tag.encode())]
                    yield ("head", message["status"], headers)
                elif message["type"] == "http.response.body":
                    body, more = message.get("body", b""), message.get("more_body", False)
                    while more and not out.empty():  # what is already queued goes in one hop, not one per chunk
                        nxt = out.get_nowait()
                        if nxt is None or nxt["type"] != "http.response.body":
                            out.put_nowait(nxt)  # (only None can follow a body; keep it for the loop)
                            break
                        body, more = body + nxt.get("body", b""), nxt.get("more_body", False)
                    if body:
                        yield ("body", body)
                    if not more:
                        return
        finally:  # finished, or cancelled by a client that went away
            disconnected.set()
            if not task.done():
                try:
                    await asyncio.wait_for(asyncio.shield(task), timeout=5)
                except (asyncio.TimeoutError, asyncio.CancelledError, Exception):
                    task.cancel()

    async def _run(self, scope, receive, send, out: asyncio.Queue) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            await out.put(None)

    # -- metrics ------------------------------------------------------------------------------
    def metrics_text(self) -> str:
        return self.engine.metrics.render().decode()

    def _push_metrics(self) -> None:
        import ray

        board = None
        while not self._stop.wait(PUSH_PERIOD):
            try:
                if board is None:
                    board = ray.get_actor(self.board_name, namespace=_namespace())
                board.put.remote(self.replica_tag, self.metrics_text(), time.time())
            except Exception:  # the board is not up yet, or went away with the ingress: try again
                board = None

    def __del__(self) -> None:
        self._stop.set()


def _replica_tag() -> str:
    """This replica's name in Ray Serve (its label on /metrics)."""
    try:
        from ray import serve

        return serve.get_replica_context().replica_tag
    except Exception:
        return f"pid{os.getpid()}"


def _namespace() -> str:
    import ray

    return ray.get_runtime_context().namespace
