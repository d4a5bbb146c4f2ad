"""The OpenAI-compatible HTTP front end: routes, authentication, request to engine requests,
and responses whole or streamed as server-sent events.

Every handler is async and does no model work: tokenizing runs in a worker thread, the model
on the engine's thread (``loop.EngineLoop``). A request whose client disconnects, or that runs
past ``request_timeout``, is aborted, and the engine frees its rows at its next step.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from quickdraft.engine.core import Engine
from quickdraft.models.tokenizer import HFTokenizer
from quickdraft.server.answer import Answer
from quickdraft.server.loop import QueueFull, Unavailable
from quickdraft.server.metrics import Metrics
from quickdraft.server.page import playground_response
from quickdraft.server.pool import EnginePool, OtherMethods
from quickdraft.server.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    constraint_field,
    constraint_for,
    parse,
    read_json,
    refuse_unsupported,
    sampling_for,
)
from quickdraft.server.responses import Choice
from quickdraft.server.tokens import TokenTexts

log = logging.getLogger("quickdraft.server")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """model_name: the id clients send as ``model``. method: reported in responses.
    api_key: when set, /v1 routes need ``Authorization: Bearer <key>``. max_queue: requests
    waiting beyond the engine's rows before the server answers 429. request_timeout: seconds
    before a request is aborted (408, or an error event in a stream). max_body_bytes: larger
    request bodies get 413. playground: serve the playground page at ``/``."""

    model_name: str
    method: str = "ar"
    api_key: str | None = None
    max_queue: int = 64
    request_timeout: float = 600.0
    max_body_bytes: int = 4 << 20
    playground: bool = True


def create_app(
    engine: Engine,
    tokenizer: HFTokenizer,
    config: ServerConfig,
    others: OtherMethods | None = None,
) -> FastAPI:
    """The app over ``engine`` (the served method's); ``others``: the methods a request may
    name instead (``quickdraft.method``; ``server.pool``), None for the served one only."""
    if engine.tokenizer is None:
        raise ValueError("engine: the server needs an engine built with its tokenizer")
    metrics = Metrics(engine.needs.depth)
    pool = EnginePool(engine, config.method, metrics, config.max_queue, others)
    texts = TokenTexts(tokenizer)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool.start()
        yield
        await run_in_threadpool(pool.stop)

    app = FastAPI(
        title="quickdraft", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.loop, app.state.metrics = pool, metrics

    # -- errors and authentication -------------------------------------------------------

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        if error.status < 500:
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

    if config.playground:

        @app.get("/", include_in_schema=False)
        async def page() -> Response:
            return playground_response()

    @app.get("/health")
    async def health() -> Response:
        if pool.error is not None:
            return JSONResponse({"status": "error", "message": pool.error}, status_code=503)
        if pool.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
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

    @app.get("/v1/methods")
    async def method_list(request: Request) -> dict[str, Any]:
        authorize(request)
        return pool.listing()

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
        loop = await pool.loop_for(req.method)
        count = _prompt_count(req) * req.choices_per_prompt
        if count > loop.limit:  # could never run: say so, not "retry later", before any work
            field = "n" if req.choices_per_prompt > 1 else "prompt"
            raise ApiError(
                400,
                f"{field}: {count} choices (prompts x n) are more than this server takes at "
                f"once ({loop.limit})",
                field,
            )
        prompts = await run_in_threadpool(_prompts, req, tokenizer)
        await _bind_constraint(req, loop.engine)
        jobs = []
        for ids in prompts:
            for n in range(req.choices_per_prompt):
                sampling = sampling_for(req, len(ids), loop.engine.max_model_len, n)
                try:
                    loop.engine.check_request(ids, sampling)
                except ValueError as error:
                    field = "messages" if isinstance(req, ChatRequest) else "prompt"
                    raise ApiError(400, str(error), field) from None
                jobs.append((ids, sampling))
        try:
            request_ids, inbox = loop.submit(jobs)
        except QueueFull as error:
            raise ApiError(429, str(error), kind="rate_limit_error", code="queue_full") from None
        except Unavailable as error:
            raise ApiError(503, str(error), kind="server_error") from None
        choices = [
            Choice(index, request_id, ids, sampling, tokenizer, texts, keep_steps=not req.stream)
            for index, (request_id, (ids, sampling)) in enumerate(
                zip(request_ids, jobs, strict=True)
            )
        ]
        answer = Answer(
            req,
            choices,
            inbox,
            model=config.model_name,
            method=req.method or config.method,
            timeout=config.request_timeout,
            loop=loop,
            metrics=metrics,
        )
        if req.stream:
            return answer.streaming()
        body = await answer.whole(request)
        return Response(status_code=499) if body is None else JSONResponse(body)

    return app


async def _bind_constraint(req: CompletionRequest | ChatRequest, engine: Engine) -> None:
    """Bind the request's structured output to the model's tokenizer before it queues, off
    the event loop (the first one builds the tokenizer's index, 0.3-1.4 s): a grammar this
    model cannot follow is a 400 naming its field, before a stream has begun, and not on the
    engine's thread, where it stalled every running request. Compiled once, then cached."""
    constraint = constraint_for(req)
    if constraint is None:
        return
    try:
        await run_in_threadpool(engine.constraints.matcher, constraint)
    except ValueError as error:
        field = constraint_field(req)
        message = str(error).split(": ", 1)[-1]
        raise ApiError(400, f"{field}: {message}", field) from None


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 past ``limit`` bytes (read no further)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(
            413, f"body: {declared} bytes, more than the {limit} this server takes", "body"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body: more than the {limit} bytes this server takes", "body")
        chunks.append(chunk)
    return b"".join(chunks)


def _prompt_count(req: CompletionRequest | ChatRequest) -> int:
    if isinstance(req, ChatRequest):
        return 1
    prompt = req.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return 1
    return len(prompt)


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
        try:
            ids = tokenizer.encode(item) if isinstance(item, str) else list(item)
        except ValueError as error:  # text that is not valid UTF-8 (a lone surrogate)
            raise ApiError(400, str(error), "prompt") from None
        if not ids:
            raise ApiError(400, "prompt: an empty prompt (no tokens)", "prompt")
        out.append(ids)
    return out
