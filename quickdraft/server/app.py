"""The OpenAI-compatible HTTP front end: routes, authentication, request to engine requests,
and responses whole or streamed as server-sent events.

Every handler is async and does no model work: tokenizing runs in a worker thread, the model
on the engine's thread (``loop.EngineLoop``). A request whose client disconnects, or that runs
past ``request_timeout``, is aborted, and the engine frees its rows at its next step.
"""

from __future__ import annotations

import hashlib
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

from quickdraft.config import check_range
from quickdraft.engine.core import Engine
from quickdraft.models.tokenizer import HFTokenizer
from quickdraft.server.answer import Answer
from quickdraft.server.grammar import Compiler
from quickdraft.server.guard import HostGuard, HostRules, require_json
from quickdraft.server.inputs import prompt_count, prompt_ids, read_body
from quickdraft.server.loop import QueueFull, Unavailable
from quickdraft.server.metrics import Metrics
from quickdraft.server.page import playground_response
from quickdraft.server.pool import EnginePool, OtherMethods
from quickdraft.server.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
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
    api_keys: when given, /v1 routes need ``Authorization: Bearer <key>`` with one of them;
    each key is a tenant (what the server shares between clients: README.md). max_queue:
    requests waiting beyond the engine's rows before the server answers 429. request_timeout:
    seconds before a request is aborted (408, or an error event in a stream).
    max_body_bytes: larger request bodies get 413. playground: serve the playground page at
    ``/``. host, port: the address the server is bound to (port None: any), which the Host
    header must name when there are no api_keys (``server.guard``); allowed_hosts replaces
    that check's names (``name`` or ``name:port``, ``*`` for any) and applies with api_keys
    too. max_constraint_bytes, constraint_timeout: the largest structured output (its JSON or
    text) a request may send, and the seconds its compiling may take; past either, a 400."""

    model_name: str
    method: str = "ar"
    api_keys: tuple[str, ...] = ()
    max_queue: int = 64
    request_timeout: float = 600.0
    max_body_bytes: int = 4 << 20
    playground: bool = True
    host: str = "127.0.0.1"
    port: int | None = None
    allowed_hosts: tuple[str, ...] | None = None
    max_constraint_bytes: int = 256 << 10
    constraint_timeout: float = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.api_keys, tuple) or not all(
            isinstance(key, str) and key for key in self.api_keys
        ):
            raise ValueError("api_keys must be a tuple of non-empty strings")
        if self.allowed_hosts is not None:
            HostRules.parse(self.allowed_hosts)  # a ValueError naming allowed_hosts
        check_range("max_constraint_bytes", self.max_constraint_bytes, 1, 1 << 30, integer=True)
        check_range("constraint_timeout", self.constraint_timeout, 0.001, 3600.0)

    def host_rules(self) -> HostRules:
        """What the Host check allows (``server.guard``)."""
        if self.allowed_hosts is not None:
            return HostRules.parse(self.allowed_hosts)
        if self.api_keys:
            return HostRules(everything=True)
        return HostRules.bound(self.host, self.port)


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
    compiler = Compiler(config.max_constraint_bytes, config.constraint_timeout)
    tenants = {key: _tenant(key) for key in config.api_keys}
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool.start()
        yield
        compiler.close()
        await run_in_threadpool(pool.stop)

    app = FastAPI(
        title="quickdraft", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.loop, app.state.metrics = pool, metrics
    app.add_middleware(HostGuard, rules=config.host_rules())

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

    def authorize(request: Request) -> str | None:
        """The request's tenant (its key's, hashed); None without api_keys (one tenant)."""
        if not config.api_keys:
            return None
        given = request.headers.get("authorization", "").encode()
        found = None
        for key, tenant in tenants.items():  # every key compared: the time tells none
            if secrets.compare_digest(given, f"Bearer {key}".encode()):
                found = tenant
        if found is None:
            raise ApiError(
                401,
                "missing or wrong API key: send the header Authorization: Bearer <key>",
                code="invalid_api_key",
            )
        return found

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
        tenant = authorize(request)
        require_json(request.headers.get("content-type"))
        body = read_json(await read_body(request, config.max_body_bytes))
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
        count = prompt_count(req) * req.choices_per_prompt
        if count > loop.limit:  # could never run: say so, not "retry later", before any work
            field = "n" if req.choices_per_prompt > 1 else "prompt"
            raise ApiError(
                400,
                f"{field}: {count} choices (prompts x n) are more than this server takes at "
                f"once ({loop.limit})",
                field,
            )
        prompts = await run_in_threadpool(prompt_ids, req, tokenizer)
        bound = await compiler.bind(req, loop.engine)  # (field, constraint) or None
        constraint = None if bound is None else bound[1]
        jobs = []
        for ids in prompts:
            for n in range(req.choices_per_prompt):
                sampling = sampling_for(
                    req, len(ids), loop.engine.max_model_len, n,
                    constraint=constraint, tenant=tenant,
                )  # fmt: skip
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
        redact = loop.engine.needs.pooled  # its rejected drafts may be others' text
        choices = [
            Choice(
                index,
                request_id,
                ids,
                sampling,
                tokenizer,
                texts,
                keep_steps=not req.stream,
                redact=redact,
            )
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
            constraint_field=None if bound is None else bound[0],
        )
        if req.stream:
            return answer.streaming()
        body = await answer.whole(request)
        return Response(status_code=499) if body is None else JSONResponse(body)

    return app


def _tenant(key: str) -> str:
    """A tenant's name from its API key: a digest, so that no key sits in the engine's
    requests or the drafters' state."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]
