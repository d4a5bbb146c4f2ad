"""The answer to one HTTP request: its choices' outputs gathered into one response, or
streamed as server-sent events, and what happens when the client leaves or time runs out."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from quickdraft.engine.requests import RequestOutput, TokenLogprob
from quickdraft.server.loop import EngineLoop, Failure
from quickdraft.server.metrics import Metrics
from quickdraft.server.protocol import ApiError, ChatRequest, CompletionRequest
from quickdraft.server.responses import Choice, extension, usage


class Answer:
    """choices: one per engine request (prompts x n), in response order; their outputs
    arrive in ``inbox``. method: reported in the ``quickdraft`` extension."""

    def __init__(
        self,
        req: CompletionRequest | ChatRequest,
        choices: list[Choice],
        inbox: asyncio.Queue,
        *,
        model: str,
        method: str,
        timeout: float,
        loop: EngineLoop,
        metrics: Metrics,
        constraint_field: str | None = None,
    ):
        """constraint_field: the field that set the request's structured output, which an
        error names if the grammar fails mid-output."""
        self.req, self.choices, self.inbox = req, choices, inbox
        self.constraint_field = constraint_field
        self.model, self.method, self.timeout = model, method, timeout
        self.loop, self.metrics = loop, metrics
        self.chat = isinstance(req, ChatRequest)
        self.by_id = {c.request_id: c for c in choices}
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    # -- whole -----------------------------------------------------------------------------

    async def whole(self, request: Request) -> dict[str, Any] | None:
        """The response body; None when the client left first."""
        work = asyncio.ensure_future(self._gather())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait(
                {work, gone}, timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if work in done:
                work.result()  # raises the ApiError of a failed request
                return self._response()
            if gone in done:
                self._end("abort")
                return None
            self._end("timeout")
            raise ApiError(408, self._timeout_message(), kind="timeout_error")
        finally:
            work.cancel()
            gone.cancel()
            self._end("abort")

    async def _gather(self) -> None:
        while not all(c.finished for c in self.choices):
            item = await self.inbox.get()
            if isinstance(item, Failure):
                self._end("error")
                raise _failure_error(item)
            self._count(self.by_id[item.request_id], item)
            if item.finish_reason == "error":
                self._end("error")
                raise self._constraint_error()

    def _response(self) -> dict[str, Any]:
        choices = []
        for c in self.choices:
            body: dict[str, Any] = {"index": c.index}
            if self.chat:
                body["message"] = {"role": "assistant", "content": c.text}
                body["logprobs"] = c.chat_logprobs(c.logprobs)
            else:
                body["text"] = c.text
                body["logprobs"] = c.completion_logprobs(c.logprobs)
            body["finish_reason"] = c.finish_reason
            if self.req.return_token_ids:
                body["token_ids"] = c.token_ids
            body["quickdraft"] = c.extension()
            if c.steps is not None:
                body["quickdraft"]["steps"] = c.steps
            choices.append(body)
        return {
            **self._head("chat.completion" if self.chat else "text_completion"),
            "choices": choices,
            "usage": usage(self.choices),
            "quickdraft": extension(self.choices, self.method),
        }

    # -- streamed --------------------------------------------------------------------------

    def streaming(self) -> StreamingResponse:
        return _AbortingStream(self)

    async def events(self) -> AsyncIterator[str]:
        """Server-sent events: a chunk per step per choice, usage when asked, then [DONE].
        The timeout bounds the waits for outputs only, never a send to a slow reader."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        if self.chat:
            for c in self.choices:
                delta = {"role": "assistant", "content": ""}
                yield _sse(self._chunk(kind, c, delta, None, []))
        deadline = asyncio.get_running_loop().time() + self.timeout
        while not all(c.finished for c in self.choices):
            left = deadline - asyncio.get_running_loop().time()
            try:
                item = await asyncio.wait_for(self.inbox.get(), max(left, 0))
            except TimeoutError:
                self._end("timeout")
                body = ApiError(408, self._timeout_message(), kind="timeout_error").body()
                yield _sse(body)
                break
            if isinstance(item, Failure):
                self._end("error")
                yield _sse(_failure_error(item).body())
                break
            choice = self.by_id[item.request_id]
            piece, logprobs, steps = self._count(choice, item)
            if item.finish_reason == "error":  # no finish chunk: an error event ends it
                self._end("error")
                yield _sse(self._constraint_error().body())
                break
            if piece or logprobs or steps or item.finished:
                delta = {"content": piece} if self.chat else piece
                chunk = self._chunk(kind, choice, delta, item.finish_reason, logprobs)
                if steps:  # a step whose text the detokenizer holds back still reports
                    chunk.setdefault("quickdraft", {"index": choice.index})["steps"] = steps
                yield _sse(chunk)
        else:
            options = self.req.stream_options
            if options is not None and options.include_usage:
                yield _sse(
                    {
                        **self._head(kind),
                        "choices": [],
                        "usage": usage(self.choices),
                        "quickdraft": extension(self.choices, self.method),
                    }
                )
        yield "data: [DONE]\n\n"

    def _chunk(
        self,
        kind: str,
        c: Choice,
        delta: str | dict[str, str],
        finish: str | None,
        logprobs: list[TokenLogprob],
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"index": c.index}
        if self.chat:
            body["delta"] = delta
            body["logprobs"] = c.chat_logprobs(logprobs)
        else:
            body["text"] = delta
            body["logprobs"] = c.completion_logprobs(logprobs)
        body["finish_reason"] = finish
        chunk = {**self._head(kind), "choices": [body]}
        if finish is not None:
            if self.req.return_token_ids:
                body["token_ids"] = c.token_ids
            chunk["quickdraft"] = {"index": c.index, **c.extension()}
        return chunk

    # -- shared ----------------------------------------------------------------------------

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _constraint_error(self) -> ApiError:
        """A choice's grammar failed mid-output (one of llguidance's per-step limits): its
        text matches nothing, so the request fails rather than return it."""
        field = self.constraint_field or "response_format"
        return ApiError(
            400,
            f"{field}: the grammar library could not follow this constraint past part of the "
            "output (a limit of its per-token work); simplify the constraint",
            field,
        )

    def _timeout_message(self) -> str:
        return f"the request ran past the server's timeout of {self.timeout:g} s"

    def _count(
        self, choice: Choice, item: RequestOutput
    ) -> tuple[str, list[TokenLogprob], list[dict[str, Any]]]:
        added = choice.add(item)
        if item.finished:
            self.metrics.requests.labels(item.finish_reason).inc()
        return added

    def end(self) -> None:
        """Abort whatever still runs (the response ended early: the client left)."""
        self._end("abort")

    def _end(self, outcome: str) -> None:
        """Abort the choices still running and count them under ``outcome``."""
        running = [c for c in self.choices if not c.finished]
        for c in running:
            c.finish_reason = outcome
        if running:
            self.loop.abort([c.request_id for c in running])
            self.metrics.requests.labels(outcome).inc(len(running))


class _AbortingStream(StreamingResponse):
    """A stream whose requests are aborted however the response ends: the client leaving
    mid-stream, a send that fails, or a server that never started the generator."""

    def __init__(self, answer: Answer):
        super().__init__(answer.events(), media_type="text/event-stream")
        self.answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.answer.end()


def _failure_error(failure: Failure) -> ApiError:
    if failure.status < 500:
        return ApiError(failure.status, failure.message, "prompt")
    return ApiError(failure.status, failure.message, kind="server_error")


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body has been read: the next message the
    server gets on this connection is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, allow_nan=False, separators=(',', ':'))}\n\n"
