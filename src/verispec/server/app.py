"""The OpenAI-compatible HTTP server: `create_app(engine_config, server_config)`.

    GET  /v1/models              the one model served
    POST /v1/completions         text or token-id prompts (several per request), stream or not
    POST /v1/chat/completions    the model's chat template, stream or not
    GET  /health                 200 when serving, 503 while loading (or if loading failed)
    GET  /metrics                Prometheus text format, vLLM's metric names (server/metrics.py)

Streams are server-sent events: one chunk per committed block of tokens (a speculative step can
commit several tokens at once), `data: [DONE]` at the end, a usage chunk first when
`stream_options.include_usage` is set. `usage` also carries the request's acceptance figures
under `usage.speculative`. A client that goes away (stream or not) aborts its request.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, NamedTuple

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from verispec.config import EngineConfig, SamplingParams, ServerConfig
from verispec.engine.scheduler import Handle
from verispec.errors import VerispecError
from verispec.server.engine import AsyncEngine, RequestStream, TextDeltas
from verispec.server.errors import APIError, from_engine_error, from_http_status, from_validation_errors
from verispec.server.logprobs import TokenStrings, chat_logprobs, completion_logprobs
from verispec.server.protocol import ChatCompletionRequest, CompletionRequest, _SamplingFields


def create_app(engine_config: EngineConfig | None = None, server_config: ServerConfig | None = None) -> FastAPI:
    engine_config = engine_config or EngineConfig()
    server_config = server_config or ServerConfig()
    model_name = server_config.served_model_name or engine_config.model
    engine = AsyncEngine(engine_config, server_config, model_name)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start_loading()
        yield
        engine.shutdown()

    app = FastAPI(title="verispec", description="Lossless speculative decoding, OpenAI-compatible.", lifespan=lifespan)
    app.add_middleware(BodyLimit, limit=server_config.max_request_bytes)
    app.state.engine = engine
    _install_error_handlers(app)

    async def check_api_key(request: Request) -> None:
        if server_config.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {server_config.api_key}".encode()):
            raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')", code="invalid_api_key")

    def check_model(name: str) -> None:
        if name != model_name:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {model_name!r}", param="model", code="model_not_found")

    @app.get("/health")
    async def health() -> Response:
        engine.check_ready()  # 503 while loading
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=[Depends(check_api_key)])
    async def models() -> dict:
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "verispec", "root": engine_config.model}
        if engine.loaded is not None:
            card["max_model_len"] = engine.loaded.runner.max_context
        return {"object": "list", "data": [card]}

    def check_choices(count: int, n: int) -> None:
        limit = server_config.max_prompts_per_request
        if count * n > limit:
            param = "n" if n > 1 else "prompt"
            raise APIError(400, f"at most {limit} completions per request (prompts x n), got {count} x {n}", param=param)

    def expand(prompt_items: list[tuple[list[int], SamplingParams, str | None]]) -> list[_Item]:
        """Each prompt's n completions, in OpenAI's choice order (prompt by prompt)."""
        return [_Item(ids, child, text) for ids, params, text in prompt_items for child in params.children()]

    def precompile(params: SamplingParams) -> None:
        if params.structured_outputs is not None:  # InvalidGrammarError (a 400) here, off the event loop
            engine.loaded.decoder.grammars.grammar(params.structured_outputs)

    @app.post("/v1/completions", dependencies=[Depends(check_api_key)])
    async def completions(body: CompletionRequest, request: Request) -> Response:
        check_model(body.model)
        engine.check_ready()
        prompts = body.prompts()
        check_choices(len(prompts), body.n)

        def prepare() -> list[_Item]:  # tokenising and compiling grammars on a worker thread
            tokenizer = engine.loaded.tokenizer
            out = []
            for p in prompts:
                if isinstance(p, list) and not p:
                    raise APIError(400, "a token-id prompt is empty", param="prompt")
                ids = tokenizer.encode(p) if isinstance(p, str) else list(p)
                params = _params(body, ids, body.max_tokens, "prompt", body.params)
                precompile(params)
                text = (p if isinstance(p, str) else tokenizer.decode(ids)) if body.echo else None
                out.append((ids, params, text))
            return expand(out)

        items = await asyncio.to_thread(prepare)
        shape = _Shape("text_completion", model_name, chat=False, strings=engine.token_strings)
        return await _respond(request, engine, items, shape, body.include_usage, body.stream)

    @app.post("/v1/chat/completions", dependencies=[Depends(check_api_key)])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        check_model(body.model)
        engine.check_ready()
        check_choices(1, body.n)

        def prepare() -> list[_Item]:
            ids = engine.loaded.tokenizer.encode_chat([m.as_template_message() for m in body.messages])
            params = _params(body, ids, body.requested_max_tokens, "messages", body.params)
            precompile(params)
            return expand([(ids, params, None)])

        items = await asyncio.to_thread(prepare)
        shape = _Shape("chat.completion", model_name, chat=True, strings=engine.token_strings)
        return await _respond(request, engine, items, shape, body.include_usage, body.stream)

    def _params(body: _SamplingFields, ids: list[int], max_tokens: int | None, prompt_param: str, build) -> SamplingParams:
        context = engine.loaded.runner.max_context
        if len(ids) >= context:
            raise APIError(
                400, f"the prompt has {len(ids)} tokens; this model's context is {context} tokens",
                param=prompt_param, code="context_length_exceeded",
            )
        if max_tokens is None:  # as long as the context allows
            max_tokens = context - len(ids)
        if len(ids) + max_tokens > context:
            raise APIError(
                400, f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds this model's context of {context} tokens",
                param="max_tokens", code="context_length_exceeded",
            )
        return build(max_tokens)

    return app


def too_large(limit: int) -> APIError:
    """The 413 for a body over `limit` bytes (this server's, and the cluster ingress's)."""
    return APIError(413, f"the request body is over this server's limit of {limit} bytes (--max-request-bytes)",
                    code="request_too_large")


class BodyLimit:
    """413 for a request body over `limit` bytes, before anything parses it: at once from its
    Content-Length, or as soon as a chunked body passes the limit (the rest is never read)."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._refuse(send)
        messages, size = [], 0
        while True:  # the whole body, or the limit: FastAPI would read it whole anyway
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                return await self._refuse(send)
            if not message.get("more_body", False):
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send) -> None:
        body = json.dumps(too_large(self.limit).body()).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _install_error_handlers(app: FastAPI) -> None:
    def answer(error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return answer(exc)

    @app.exception_handler(VerispecError)
    async def engine_error(request: Request, exc: VerispecError) -> JSONResponse:
        return answer(from_engine_error(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return answer(from_validation_errors(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else None
        return answer(from_http_status(exc.status_code, detail))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return answer(from_engine_error(exc))


class _Item(NamedTuple):
    """One choice to run."""

    ids: list[int]  # the prompt
    params: SamplingParams  # its single completion's
    echo: str | None  # prompt text to echo (completions with echo), else None


class _Shape:
    """What differs between completion and chat responses."""

    def __init__(self, object_name: str, model: str, chat: bool, strings: TokenStrings) -> None:
        self.object = object_name
        self.model = model
        self.chat = chat
        self.strings = strings
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def envelope(self, choices: list[dict], chunk: bool = False) -> dict[str, Any]:
        obj = self.object + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def choice(self, index: int, text: str, finish_reason: str | None, chunk: bool, first: bool = False,
               logprobs: dict | None = None) -> dict:
        if not self.chat:
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        if chunk:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs, "finish_reason": finish_reason}

    def logprobs(self, item: _Item, handle: Handle, start: int, end: int, echo: bool, offset: int = 0) -> dict | None:
        """The logprobs of output tokens start..end (and of the prompt, echoing): None when not asked."""
        req = handle.req
        if req is None or req.logprobs is None:
            return None
        entries = req.logprobs[start:end]
        if self.chat:
            return chat_logprobs(entries, self.strings)
        tokens = handle.output_ids[start:end]
        if echo and req.prompt_logprobs is not None:
            tokens, entries = list(item.ids) + tokens, list(req.prompt_logprobs) + entries
        return completion_logprobs(tokens, entries, self.strings, offset)


async def _respond(request: Request, engine: AsyncEngine, items: list[_Item], shape: _Shape, include_usage: bool, stream: bool) -> Response:
    stream_obj = engine.submit([(ids, params) for ids, params, _ in items])  # typed refusals (queue full, context): a 4xx/503
    if stream:
        return StreamingResponse(_sse(stream_obj, engine, items, shape, include_usage), media_type="text/event-stream")
    try:
        handles = await _until_done(request, stream_obj)
    finally:
        stream_obj.abort()
    choices = []
    for i, (item, h) in enumerate(zip(items, handles)):
        logprobs = shape.logprobs(item, h, 0, len(h.output_ids), echo=item.echo is not None)
        choices.append(shape.choice(i, (item.echo or "") + h.text(), h.finish_reason, chunk=False, logprobs=logprobs))
    return JSONResponse({**shape.envelope(choices), "usage": usage(handles)})


async def _until_done(request: Request, stream: RequestStream) -> list[Handle]:
    """Wait for every choice; a client that disconnects meanwhile aborts the request."""

    async def drain() -> None:
        async for item in stream.events():
            if item.event.error is not None:
                raise from_engine_error(item.event.error)

    task = asyncio.ensure_future(drain())
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.25)
        if done:
            task.result()  # re-raises an engine error as an APIError
            return stream.handles
        if await request.is_disconnected():
            task.cancel()
            stream.abort()
            raise APIError(499, "client disconnected")


async def _sse(stream: RequestStream, engine: AsyncEngine, items: list[_Item], shape: _Shape, include_usage: bool) -> AsyncIterator[str]:
    deltas = [TextDeltas(engine.loaded.tokenizer, params) for _, params, _ in items]
    first = [shape.chat] * len(items)  # chat streams open each choice with the assistant role
    sent = [0] * len(items)  # output tokens whose logprobs went out
    extra = {"usage": None} if include_usage else {}
    try:
        echoed = [it.echo is None for it in items]  # echo: the prompt (and its logprobs) before the first tokens
        async for item in stream.events():
            ev = item.event
            if ev.error is not None:
                yield _data(from_engine_error(ev.error).body())
                break
            i = item.index
            if not echoed[i]:
                echoed[i] = True
                req = ev.handle.req
                logprobs = None
                if req is not None and req.prompt_logprobs is not None:
                    logprobs = completion_logprobs(items[i].ids, req.prompt_logprobs, shape.strings)
                yield _data({**shape.envelope([shape.choice(i, items[i].echo, None, chunk=True, logprobs=logprobs)], chunk=True), **extra})
            offset = len(items[i].echo or "") + deltas[i].sent  # text_offset counts from the choice's start
            text = deltas[i].delta(ev)
            finish = ev.handle.finish_reason if ev.finished else None
            end = sent[i] + len(ev.new_token_ids)
            logprobs = shape.logprobs(items[i], ev.handle, sent[i], end, echo=False, offset=offset)
            sent[i] = end
            if text or finish or first[i] or (logprobs and ev.new_token_ids):
                choice = shape.choice(i, text, finish, chunk=True, first=first[i], logprobs=logprobs)
                first[i] = False
                yield _data({**shape.envelope([choice], chunk=True), **extra})
        else:
            if include_usage:
                yield _data({**shape.envelope([], chunk=True), "usage": usage(stream.handles)})
        yield "data: [DONE]\n\n"
    finally:  # the client went away, or we are done: nothing keeps running for nobody
        stream.abort()


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def usage(handles: list[Handle]) -> dict[str, Any]:
    """OpenAI's usage, plus the acceptance figures of speculative decoding (`speculative`)."""
    prompt = sum(len(h.prompt_ids) for h in handles)
    completion = sum(len(h.output_ids) for h in handles)
    ms = [h.metrics for h in handles]
    drafts = sum(m.num_drafts for m in ms)
    accepted = sum(m.num_accepted_tokens for m in ms)
    per_pos: list[int] = []
    for m in ms:
        per_pos += [0] * (len(m.accepted_per_position) - len(per_pos))
        for i, c in enumerate(m.accepted_per_position):
            per_pos[i] += c
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "speculative": {
            "num_drafts": drafts,
            "num_draft_tokens": sum(m.num_draft_tokens for m in ms),
            "num_accepted_tokens": accepted,
            "accepted_per_position": per_pos,
            "mean_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
            "target_forwards": sum(m.num_target_forwards for m in ms),
        },
    }
