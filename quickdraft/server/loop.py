"""The engine on a thread of its own, so that the event loop never waits on model work.

The event loop hands requests and aborts to the thread through a queue; the thread steps the
engine while any request is unfinished and sleeps otherwise, and hands every step's outputs
back to the event loop (``call_soon_threadsafe``), into the asyncio queue of the HTTP request
they belong to. Only the thread touches the engine, apart from ``Engine.check_request``, which
reads nothing a step changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from quickdraft.config import SamplingParams
from quickdraft.engine.core import Engine
from quickdraft.engine.requests import RequestOutput
from quickdraft.server.metrics import Metrics

log = logging.getLogger("quickdraft.server")


class QueueFull(Exception):
    """More requests in flight than the engine's rows plus the waiting queue hold."""


class EngineDead(Exception):
    """The engine's thread stopped on an error; the server answers 503 from then on."""


@dataclass(frozen=True, slots=True)
class Failure:
    """Delivered in place of an output when the engine could not run a request."""

    request_id: str
    message: str


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt: list[int]
    sampling: SamplingParams
    inbox: asyncio.Queue


class EngineLoop:
    """limit: the most requests in flight (running or waiting); one more is ``QueueFull``."""

    def __init__(self, engine: Engine, metrics: Metrics, limit: int):
        self.engine, self.metrics, self.limit = engine, metrics, limit
        self.in_flight = 0  # event-loop side: requests submitted and not yet finished
        self.error: str | None = None
        self._commands: queue.SimpleQueue[_Add | str | None] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = False
        self._inboxes: dict[str, asyncio.Queue] = {}  # thread side
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="quickdraft-engine", daemon=True)

    # -- the event loop's side ------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    def submit(
        self, requests: Sequence[tuple[list[int], SamplingParams]]
    ) -> tuple[list[str], asyncio.Queue]:
        """Queue these requests together (a request's n choices); their outputs, and
        ``Failure``s, arrive in the one asyncio queue returned."""
        if self.error is not None:
            raise EngineDead(self.error)
        if self._stopping:
            raise EngineDead("the server is shutting down")
        if self.in_flight + len(requests) > self.limit:
            self.metrics.requests.labels("rejected").inc(len(requests))
            raise QueueFull(
                f"{self.in_flight} requests are in flight, the most this server takes is "
                f"{self.limit} (--max-batch + --max-queue); retry later"
            )
        inbox: asyncio.Queue = asyncio.Queue()
        ids = []
        for prompt, sampling in requests:
            request_id = uuid.uuid4().hex
            ids.append(request_id)
            self.metrics.prompt_tokens.inc(len(prompt))
            self._commands.put(_Add(request_id, prompt, sampling, inbox))
        self.in_flight += len(requests)
        self._wake.set()
        return ids, inbox

    def abort(self, request_ids: Sequence[str]) -> None:
        """Stop these requests at the next step (finished ones are ignored)."""
        for request_id in request_ids:
            self._commands.put(request_id)
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort what still runs and end the thread."""
        self._stopping = True
        self._commands.put(None)
        self._wake.set()
        self._thread.join(timeout)

    def _deliver(self, inbox: asyncio.Queue, item: RequestOutput | Failure) -> None:
        if isinstance(item, Failure) or item.finished:
            self.in_flight -= 1
        inbox.put_nowait(item)

    # -- the engine's thread --------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                if not self._drain():
                    break
                if not engine.has_unfinished():
                    self._observe()
                    self._wake.wait()
                    self._wake.clear()
                    continue
                outputs = engine.step()
                for out in outputs:
                    self._send(out)
                self._observe()
        except Exception as error:  # a bug: fail every request, keep the server answering
            log.exception("the engine stopped")
            self.error = f"the engine stopped: {type(error).__name__}: {error}"
            for request_id, inbox in self._inboxes.items():
                self._post(inbox, Failure(request_id, self.error))
            self._inboxes.clear()
            while not self._commands.empty():  # requests that never reached the engine
                command = self._commands.get_nowait()
                if isinstance(command, _Add):
                    self._post(command.inbox, Failure(command.request_id, self.error))
            return
        for request_id in list(self._inboxes):  # stopping: abort what is left
            engine.abort(request_id)
        while engine.has_unfinished():
            for out in engine.step():
                self._send(out)
        self._observe()

    def _drain(self) -> bool:
        """Carry out queued adds and aborts; False once stop() was called."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True
            if command is None:
                return False
            if isinstance(command, str):
                if command in self._inboxes:
                    self.engine.abort(command)
                continue
            try:
                self.engine.add_request(command.prompt, command.sampling, command.request_id)
            except ValueError as error:  # checked before submit; a race is still answered
                self._post(command.inbox, Failure(command.request_id, str(error)))
                continue
            self._inboxes[command.request_id] = command.inbox

    def _send(self, out: RequestOutput) -> None:
        inbox = self._inboxes.get(out.request_id)
        if inbox is None:
            return
        self.metrics.generation_tokens.inc(len(out.new_token_ids))
        if out.finished:
            del self._inboxes[out.request_id]
        self._post(inbox, out)

    def _post(self, inbox: asyncio.Queue, item: RequestOutput | Failure) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # a closed event loop: nobody is listening
            self._loop.call_soon_threadsafe(self._deliver, inbox, item)

    def _observe(self) -> None:
        self.metrics.observe_steps(self.engine.take_stats())
        self.metrics.observe_usage(self.engine.usage())
