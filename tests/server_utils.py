"""Helpers for the server tests: a real `verispec serve` process (the load test's own helper), an
in-thread uvicorn, and reading one sample of /metrics."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from verispec.server.loadtest import free_port, metric, server_process, wait_healthy  # noqa: F401  (shared with the tests)


@contextmanager
def server_thread(app):
    """The app under uvicorn on a thread of this process (for tests that need its internals)."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(20)
