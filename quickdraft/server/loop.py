"""The engine on a thread of its own, so that the event loop never waits on model work.

The event loop hands requests and aborts to the thread through a queue; the thread steps the
engine while any request is unfinished and sleeps otherwise, and hands every step's outputs
back to the event loop (``call_soon_threadsafe``), which routes each into the asyncio queue of
the HTTP request it belongs to. Which request goes to which queue is known on the event loop
only, so a request is always either answered or failed: if the thread dies, it asks the event
loop to fail every request it knows of, and nothing is submitted after that.

Only the thread touches the engine, apart from ``Engine.check_request``, which reads nothing a
step changes.
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


class Unavailable(Exception):
    """The server is draining for shutdown, or its engine stopped on an error."""


@dataclass(frozen=True, slots=True)
class Failure:
    """Delivered in place of an output when the engine could not run a request. status:
    400 for a request the engine refused, 500 when the engine itself failed."""

    request_id: str
    message: str
    status: int = 500


@dataclass(frozen=True, slots=True)
class _Add:
    request_id: str
    prompt: list[int]
    sampling: SamplingParams


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


class _Stop:
    pass


class EngineLoop:
    """limit: the most requests in flight (running or waiting); one more is ``QueueFull``."""

    def __init__(self, engine: Engine, metrics: Metrics, limit: int):
        self.engine, self.metrics, self.limit = engine, metrics, limit
        self.error: str | None = None  # set (on the event loop) once the engine failed
        self.draining = False
        self._commands: queue.SimpleQueue[_Add | _Abort | _Stop] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._inboxes: dict[str, asyncio.Queue] = {}  # event loop only: requests in flight
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="quickdraft-engine", daemon=True)

    @property
    def in_flight(self) -> int:
        return len(self._inboxes)

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
            raise Unavailable(self.error)
        if self.draining:
            raise Unavailable("the server is shutting down")
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
            self._inboxes[request_id] = inbox
            self.metrics.prompt_tokens.inc(len(prompt))
            self._commands.put(_Add(request_id, prompt, sampling))
        self._wake.set()
        return ids, inbox

    def abort(self, request_ids: Sequence[str]) -> None:
        """Stop these requests at the next step (finished ones are ignored)."""
        for request_id in request_ids:
            self._commands.put(_Abort(request_id))
        self._wake.set()

    def drain(self, grace: float) -> None:
        """Take no new requests; abort those still running after ``grace`` seconds, so that
        their handlers answer (finish reason "abort") before the server closes. Callable
        from a signal handler."""
        self.draining = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(
                self._loop.call_later, grace, lambda: self.abort(list(self._inboxes))
            )

    def stop(self, timeout: float = 5.0) -> None:
        """Abort what still runs and end the thread."""
        self.draining = True
        self._commands.put(_Stop())
        self._wake.set()
        self._thread.join(timeout)

    def _deliver(self, item: RequestOutput | Failure) -> None:
        inbox = self._inboxes.get(item.request_id)
        if inbox is None:  # failed already
            return
        if isinstance(item, Failure) or item.finished:
            del self._inboxes[item.request_id]
        inbox.put_nowait(item)

    def _fail_all(self, message: str) -> None:
        self.error = message
        for request_id in list(self._inboxes):
            self._deliver(Failure(request_id, message))

    # -- the engine's thread --------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        try:
            while self._drain():
                if not engine.has_unfinished():
                    self._observe()
                    self._wake.wait()
                    self._wake.clear()
                    continue
                for out in engine.step():
                    self._post(out)
                self._observe()
            for request_id in list(engine.requests):  # stopping: abort what is left
                engine.abort(request_id)
            while engine.has_unfinished():
                for out in engine.step():
                    self._post(out)
            self._observe()
        except Exception as error:  # a bug: fail every request; /health turns 503
            log.exception("the engine stopped")
            message = f"the engine stopped: {type(error).__name__}: {error}"
            if self._loop is not None:
                with contextlib.suppress(RuntimeError):  # the event loop has closed
                    self._loop.call_soon_threadsafe(self._fail_all, message)

    def _drain(self) -> bool:
        """Carry out queued adds and aborts; False once stop() was called."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True
            if isinstance(command, _Stop):
                return False
            if isinstance(command, _Abort):
                self.engine.abort(command.request_id)
                continue
            try:
                self.engine.add_request(command.prompt, command.sampling, command.request_id)
            except ValueError as error:  # checked before submit: only a race gets here
                self._post(Failure(command.request_id, str(error), 400))

    def _post(self, item: RequestOutput | Failure) -> None:
        if isinstance(item, RequestOutput):
            self.metrics.generation_tokens.inc(len(item.new_token_ids))
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # a closed event loop: nobody is listening
            self._loop.call_soon_threadsafe(self._deliver, item)

    def _observe(self) -> None:
        """Gauges and step statistics; a failure here is logged, never fatal to serving."""
        try:
            self.metrics.observe_steps(self.engine.take_stats())
            self.metrics.observe_usage(self.engine.usage())
        except Exception:
            log.exception("metrics: could not record a step")
