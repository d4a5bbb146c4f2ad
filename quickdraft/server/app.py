"""The OpenAI-compatible HTTP front end: routes, authentication, request to engine requests,
and responses whole or streamed as server-sent events.

Every handler is async and does no model work: tokenizing runs in a worker thread, the model
on the engine's thread (``loop.EngineLoop``). A request whose client disconnects, or that runs
past ``request_timeout``, is aborted, and the engine frees its rows at its next step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from quickdraft.engine.core import Engine
from quickdraft.models.tokenizer import HFTokenizer
from quickdraft.server.loop import EngineDead, EngineLoop, Failure, QueueFull
from quickdraft.server.metrics import Metrics
from quickdraft.server.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    parse,
    read_json,
    refuse_unsupported,
    sampling_for,
)
from quickdraft.server.responses import Choice, extension, usage

log = logging.getLogger("quickdraft.server")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """model_name: the id clients send as ``model``. method: reported in responses.
    api_key: when set, /v1 routes need ``Authorization: Bearer <key>``. max_queue: requests
    waiting beyond the engine's rows before the server answers 429. request_timeout: seconds
    before a request is aborted (408, or an error event in a stream). max_body_bytes: larger
    request bodies get 413."""

    model_name: str
    method: str = "ar"
    api_key: str | None = None
    max_queue: int = 64
    request_timeout: float = 600.0
    max_body_bytes: int = 4 << 20


class _ClientGone(Exception):
    pass


def create_app(engine: Engine, tokenizer: HFTokenizer, config: ServerConfig) -> FastAPI:
    if engine.tokenizer is None:
        raise ValueError("engine: the server needs an engine built with its tokenizer")
    metrics = Metrics(engine.needs.depth)
    loop = EngineLoop(engine, metrics, engine.scheduler.num_rows + config.max_queue)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop.start()
        yield
        await run_in_threadpool(loop.stop)

    app = FastAPI(
        title="quickdraft", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.loop, app.state.metrics = loop, metrics

    # -- errors and authentication -------------------------------------------------------

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        metrics.invalid.labels(str(error.status)).inc()
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {error.detail}"
        return await api_error(request, ApiError(error.status_code, message))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        body = ApiError(500, "internal server error (see the server's log)", kind="server_error")
        return JSONResponse(body.body(), status_code=500)

    def authorize(request: Request) -> None:
        if config.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {config.api_key}".encode()):
            raise ApiError(
                401,
                "missing or wrong API key: send the header Authorization: Bearer <key>",
                code="invalid_api_key",
            )

    # -- routes ----------------------------------------------------------------------------

    @app.get("/health")
    async def health() -> Response:
        if loop.error is not None:
            return JSONResponse({"status": "error", "message": loop.error}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize(request)
        return {
            "object": "list",
            "data": [
                {
                    "id": config.model_name,
                    "object": "model",
                    "created": created,
                    "owned_by": "quickdraft",
                    "max_model_len": engine.max_model_len,
                }
            ],
        }

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(request, CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _serve(request, ChatRequest)

    # -- one request -------------------------------------------------------------------------

    async def _serve(request: Request, kind: type[CompletionRequest | ChatRequest]) -> Response:
        authorize(request)
        body = read_json(await _body(request, config.max_body_bytes))
        req = parse(kind, body)
        if req.model is not None and req.model != config.model_name:
            raise ApiError(
                404,
                f"model: {req.model!r} is not served here; this server serves "
                f"{config.model_name!r}",
                "model",
                code="model_not_found",
            )
        refuse_unsupported(req)
        prompts = await run_in_threadpool(_prompts, req, tokenizer)
        choices, jobs = [], []
        for ids in prompts:
            for n in range(req.n):
                sampling = sampling_for(req, len(ids), engine.max_model_len, n)
                try:
                    engine.check_request(ids, sampling)
                except ValueError as error:
                    field = "messages" if isinstance(req, ChatRequest) else "prompt"
                    raise ApiError(400, str(error), field) from None
                jobs.append((ids, sampling))
        try:
            request_ids, inbox = loop.submit(jobs)
        except QueueFull as error:
            raise ApiError(429, str(error), kind="rate_limit_error", code="queue_full") from None
        except EngineDead as error:
            raise ApiError(503, str(error), kind="server_error") from None
        for index, (request_id, (ids, sampling)) in enumerate(zip(request_ids, jobs, strict=True)):
            choices.append(Choice(index, request_id, ids, sampling, tokenizer))
        answer = _Answer(req, choices, inbox, config, loop, metrics)
        if req.stream:
            return StreamingResponse(answer.events(), media_type="text/event-stream")
        return JSONResponse(await answer.whole(request))

    return app


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 past ``limit`` bytes (read no further)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"body: {declared} bytes, more than the {limit} this server takes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body: more than the {limit} bytes this server takes", "body")
        chunks.append(chunk)
    return b"".join(chunks)


def _prompts(req: CompletionRequest | ChatRequest, tokenizer: HFTokenizer) -> list[list[int]]:
    """The token ids of each prompt (one for chat; a completion may send several)."""
    if isinstance(req, ChatRequest):
        try:
            return [tokenizer.apply_chat([m.as_template_input() for m in req.messages])]
        except Exception as error:  # no template, or one that rejects these roles
            raise ApiError(400, f"messages: {error}", "messages") from None
    prompt = req.prompt
    if isinstance(prompt, str):
        prompts: list = [prompt]
    elif prompt and isinstance(prompt[0], int):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise ApiError(400, "prompt: give at least one prompt", "prompt")
    out = []
    for item in prompts:
        ids = tokenizer.encode(item) if isinstance(item, str) else list(item)
        if not ids:
            raise ApiError(400, "prompt: an empty prompt (no tokens)", "prompt")
        out.append(ids)
    return out


class _Answer:
    """The response to one HTTP request: its choices' outputs, gathered whole or streamed."""

    def __init__(self, req, choices: list[Choice], inbox, config: ServerConfig, loop, metrics):
        self.req, self.choices, self.inbox = req, choices, inbox
        self.config, self.loop, self.metrics = config, loop, metrics
        self.chat = isinstance(req, ChatRequest)
        self.by_id = {c.request_id: c for c in choices}
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    # -- whole -----------------------------------------------------------------------------

    async def whole(self, request: Request) -> dict[str, Any]:
        work = asyncio.ensure_future(self._gather())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait(
                {work, gone},
                timeout=self.config.request_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if work in done:
                work.result()
            elif gone in done:
                raise _ClientGone
            else:
                self._end("timeout")
                raise ApiError(
                    408,
                    f"the request ran past the server's timeout of "
                    f"{self.config.request_timeout:g} s",
                    kind="timeout_error",
                )
        except _ClientGone:
            self._end("abort")
            return {}
        finally:
            work.cancel()
            gone.cancel()
            self._end("abort")
        return self._response()

    async def _gather(self) -> None:
        while not all(c.finished for c in self.choices):
            item = await self.inbox.get()
            if isinstance(item, Failure):
                self._end("error")
                raise ApiError(500, item.message, kind="server_error")
            self._count(self.by_id[item.request_id], item)

    def _response(self) -> dict[str, Any]:
        choices = []
        for c in self.choices:
            if self.chat:
                body: dict[str, Any] = {
                    "index": c.index,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": c.chat_logprobs(c.logprobs),
                    "finish_reason": c.finish_reason,
                }
            else:
                body = {
                    "index": c.index,
                    "text": c.text,
                    "logprobs": c.completion_logprobs(c.logprobs),
                    "finish_reason": c.finish_reason,
                }
            if self.req.return_token_ids:
                body["token_ids"] = c.token_ids
            body["quickdraft"] = c.extension()
            choices.append(body)
        return {
            **self._head("chat.completion" if self.chat else "text_completion"),
            "choices": choices,
            "usage": usage(self.choices),
            "quickdraft": extension(self.choices, self.config.method),
        }

    # -- streamed --------------------------------------------------------------------------

    async def events(self) -> AsyncIterator[str]:
        """Server-sent events: a chunk per step per choice, usage when asked, then [DONE]. A
        client that disconnects cancels this generator; ``finally`` aborts what still runs."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        try:
            if self.chat:
                for c in self.choices:
                    delta = {"role": "assistant", "content": ""}
                    yield _sse(self._chunk(kind, c, delta, None, []))
            async with asyncio.timeout(self.config.request_timeout):
                while not all(c.finished for c in self.choices):
                    item = await self.inbox.get()
                    if isinstance(item, Failure):
                        self._end("error")
                        yield _sse(ApiError(500, item.message, kind="server_error").body())
                        break
                    choice = self.by_id[item.request_id]
                    piece, logprobs = self._count(choice, item)
                    if piece or logprobs or item.finished:
                        delta = {"content": piece} if self.chat else piece
                        yield _sse(self._chunk(kind, choice, delta, item.finish_reason, logprobs))
            options = self.req.stream_options
            if options is not None and options.include_usage:
                yield _sse(
                    {
                        **self._head(kind),
                        "choices": [],
                        "usage": usage(self.choices),
                        "quickdraft": extension(self.choices, self.config.method),
                    }
                )
        except TimeoutError:
            self._end("timeout")
            message = (
                f"the request ran past the server's timeout of {self.config.request_timeout:g} s"
            )
            yield _sse(ApiError(408, message, kind="timeout_error").body())
        finally:
            self._end("abort")
        yield "data: [DONE]\n\n"

    def _chunk(self, kind: str, c: Choice, delta, finish: str | None, logprobs) -> dict[str, Any]:
        if self.chat:
            body: dict[str, Any] = {
                "index": c.index,
                "delta": delta,
                "logprobs": c.chat_logprobs(logprobs),
                "finish_reason": finish,
            }
        else:
            body = {
                "index": c.index,
                "text": delta,
                "logprobs": c.completion_logprobs(logprobs),
                "finish_reason": finish,
            }
        chunk = {**self._head(kind), "choices": [body]}
        if finish is not None:
            if self.req.return_token_ids:
                body["token_ids"] = c.token_ids
            chunk["quickdraft"] = {"index": c.index, **c.extension()}
        return chunk

    # -- shared ----------------------------------------------------------------------------

    def _head(self, kind: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.config.model_name,
        }

    def _count(self, choice: Choice, item) -> tuple[str, list]:
        piece, logprobs = choice.add(item)
        if item.finished:
            self.metrics.requests.labels(item.finish_reason).inc()
        return piece, logprobs

    def _end(self, outcome: str) -> None:
        """Abort the choices still running and count them under ``outcome``."""
        running = [c for c in self.choices if not c.finished]
        for c in running:
            c.finish_reason = outcome
        if running:
            self.loop.abort([c.request_id for c in running])
            self.metrics.requests.labels(outcome).inc(len(running))


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body has been read: the next message the
    server gets on this connection is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, allow_nan=False, separators=(',', ':'))}\n\n"
