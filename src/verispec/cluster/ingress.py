"""The ingress: the cluster's one HTTP entry, in front of the engine replicas.

Ray Serve's HTTP proxy hands every request to `Ingress.__call__`, which

  1. reads the body (413 over the server's limit, as `verispec serve` answers),
  2. computes the request's prefix keys (routing.affinity_keys) for the router,
  3. streams the request through a replica (`Replica.forward`, routed by PrefixAffinityRouter),
  4. holds the response until the replica has sent its first body bytes: a replica that fails
     before that (died, or became unreachable) cost the client nothing, so the request goes to
     another replica (`retries` times);
  5. passes the response through: whole, or as a server-sent-events stream; a replica that fails
     mid-stream ends the stream with an OpenAI error event and `data: [DONE]`.

`/metrics` is the ingress's own: every replica's series with a `replica` label (cluster/metrics.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import AsyncIterator

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from verispec.cluster.metrics import ClusterMetrics, MetricsBoard
from verispec.cluster.routing import affinity_keys
from verispec.server.app import too_large
from verispec.server.errors import APIError

log = logging.getLogger("verispec")

HEALTH_TIMEOUT = 10.0  # seconds /health waits for a replica's answer


class ReplicaFailed(Exception):
    """The replica serving a request died or became unreachable."""


class Ingress:
    def __init__(self, replicas, board_name: str, max_request_bytes: int, retries: int = 2) -> None:
        import ray

        self.replicas = replicas  # a DeploymentHandle to the Replica deployment
        self.max_request_bytes = max_request_bytes
        self.retries = retries
        self.metrics = ClusterMetrics()
        board = ray.remote(num_cpus=0)(MetricsBoard)
        self.board = board.options(name=board_name, namespace=ray.get_runtime_context().namespace,
                                   get_if_exists=True).remote()

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        if path == "/metrics" and request.method == "GET":
            texts = await self.board.fresh.remote()
            return Response(self.metrics.render(texts), media_type=CONTENT_TYPE_LATEST)
        try:
            body = await self._read_body(request)  # 1
        except APIError as e:
            return JSONResponse(e.body(), status_code=e.status)
        keys = []  # 2
        if body and request.method == "POST":
            try:
                keys = affinity_keys(path, json.loads(body))
            except (ValueError, UnicodeDecodeError):
                pass  # the replica answers a body that is not JSON with a 400
        headers = [(k, v) for k, v in request.scope["headers"] if k not in (b"host",)]
        call = (request.method, path, headers, body, request.scope.get("query_string", b""))
        try:
            timeout = HEALTH_TIMEOUT if path == "/health" else None
            head, first, rest = await asyncio.wait_for(self._open(call, keys), timeout)  # 3, 4
        except asyncio.TimeoutError:
            return _error(503, "no replica answered in time; retry shortly", "no_replica")
        except ReplicaFailed as e:
            return _error(503, f"the replicas serving this request failed: {e}", "replica_failed")
        status, raw_headers = head
        hdrs = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw_headers}
        if hdrs.get("content-type", "").startswith("text/event-stream"):  # 5
            return StreamingResponse(self._stream(first, rest), status_code=status, headers=hdrs)
        chunks = list(first)
        try:
            async for kind, *data in rest:
                chunks.append(data[0])
        except Exception as e:  # the head came with the end of the body in practice; be safe
            self.metrics.stream_errors.inc()
            return _error(502, f"the replica failed while sending its answer: {e}", "replica_failed")
        return Response(b"".join(chunks), status_code=status, headers=hdrs)

    async def _read_body(self, request: Request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_request_bytes):
            raise too_large(self.max_request_bytes)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_request_bytes:
                raise too_large(self.max_request_bytes)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _open(self, call: tuple, keys: list[str]):
        """(head, first body chunks, the rest) from the first replica that gets as far as its body."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        failures = []
        for attempt in range(self.retries + 1):
            gen = self.replicas.options(stream=True).forward.remote(*call, affinity=keys)
            head, first = None, []
            try:
                async for kind, *data in gen:
                    if kind == "head":
                        head = tuple(data)
                    else:
                        first.append(data[0])
                        break
                if head is None:
                    raise ReplicaFailed("the replica ended the response without a status")
                return head, first, gen
            except (RayActorError, ActorUnavailableError, ReplicaFailed) as e:
                failures.append(f"{type(e).__name__}")
                log.warning("replica failed before answering (attempt %d): %s", attempt + 1, e)
                if attempt < self.retries:
                    self.metrics.retried.inc()
            except asyncio.CancelledError:
                gen.cancel()
                raise
        raise ReplicaFailed(", ".join(failures))

    async def _stream(self, first: list[bytes], rest) -> AsyncIterator[bytes]:
        from ray.exceptions import RayError

        try:
            for chunk in first:
                yield chunk
            try:
                async for kind, *data in rest:
                    yield data[0]
            except RayError as e:
                self.metrics.stream_errors.inc()
                error = APIError(502, f"the replica serving this stream failed mid-stream ({type(e).__name__}); "
                                      "the output so far is incomplete", code="replica_failed")
                yield f"data: {json.dumps(error.body())}\n\ndata: [DONE]\n\n".encode()
        finally:  # the client went away, or we are done
            rest.cancel()


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(APIError(status, message, code=code).body(), status_code=status)
