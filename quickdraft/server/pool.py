"""The engines one server runs requests on: one per method, over the one target.

The served method's engine is made at start. A request may name another method of the
registry in its ``quickdraft.method`` (the playground's method menu and its race against plain
decoding do): it then runs on that method's engine, made the first time a request names it
and kept for the server's life. Each engine has its rows, cache and thread of its own, so
requests of different methods decode side by side; every one of them is exact, so the method a
request names changes how fast its tokens come, never which tokens (at temperature 0) or their
distribution.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from quickdraft.engine.core import Engine
from quickdraft.models.base import Model
from quickdraft.models.tokenizer import HFTokenizer
from quickdraft.server.loop import EngineLoop
from quickdraft.server.metrics import Metrics
from quickdraft.server.protocol import ApiError

log = logging.getLogger("quickdraft.server")


@dataclass(frozen=True, slots=True)
class MethodOption:
    """A registry method as the server offers it: ``reason`` says why it cannot run here
    (a drafter with no artifacts for this target, no draft model), None when it can;
    ``status``, what a request naming it then gets: 400, or 503 when its engine failed."""

    name: str
    description: str
    reason: str | None = None
    status: int = 400


@dataclass(frozen=True, slots=True)
class OtherMethods:
    """The methods a request may name besides the served one: ``options``, every method
    with whether it can run here, and ``make``, which builds the engine of one that can (it
    may take seconds: it runs on a worker thread; a ValueError it raises answers 400)."""

    options: tuple[MethodOption, ...]
    make: Callable[[str], Engine]


class EnginePool:
    """served: the served method's name; others: what else requests may name (None: only
    the served method). max_queue: requests each engine takes beyond its rows.

    ``metrics`` (exported at /metrics) follows the served method's engine: its gauges and
    its acceptance by position describe that engine alone. Engines made for other methods
    keep statistics of their own (not exported), so that a playground race's plain decoding
    does not blur the served method's figures; their requests are still counted. /health
    reports the served engine too: another method's engine that fails makes that method
    unavailable, not the server."""

    def __init__(
        self,
        engine: Engine,
        served: str,
        metrics: Metrics,
        max_queue: int,
        others: OtherMethods | None = None,
    ):
        self.served, self.metrics, self.max_queue = served, metrics, max_queue
        self.loops: dict[str, EngineLoop] = {served: self._loop(engine)}
        self.others = others
        self.options = {o.name: o for o in (others.options if others else ())}
        self.options.setdefault(served, MethodOption(served, "the served method"))
        self._building = asyncio.Lock()
        self._started = False
        self._grace: float | None = None  # set once draining: no engine is made after

    @property
    def main(self) -> EngineLoop:
        return self.loops[self.served]

    def _loop(self, engine: Engine, metrics: Metrics | None = None) -> EngineLoop:
        metrics = metrics or self.metrics
        return EngineLoop(engine, metrics, engine.scheduler.num_rows + self.max_queue)

    def start(self) -> None:
        """On the event loop: start the engines' threads."""
        self._started = True
        for loop in list(self.loops.values()):
            loop.start()

    def stop(self) -> None:
        """End every engine's thread (from any thread); no engine is made after."""
        if self._grace is None:
            self._grace = 0.0
        for loop in list(self.loops.values()):
            loop.stop()

    def drain(self, grace: float) -> None:
        """Every engine takes no new request and aborts what runs after ``grace`` seconds;
        a request naming a method whose engine is not made yet gets 503."""
        self._grace = grace
        for loop in list(self.loops.values()):
            loop.drain(grace)

    @property
    def error(self) -> str | None:
        """The served engine's failure, if it failed."""
        return self.main.error

    @property
    def draining(self) -> bool:
        return self._grace is not None

    async def loop_for(self, method: str | None) -> EngineLoop:
        """The engine loop of ``method`` (None: the served one), made on first use; a 400
        naming ``quickdraft.method`` when this server cannot run it."""
        if method is None or method == self.served:
            return self.main
        loop = self.loops.get(method)
        if loop is not None and loop.error is not None:
            self._unavailable(method, loop.error, 503)
        if loop is not None:
            return loop
        option = self.options.get(method)
        if option is None:
            runs = ", ".join(o.name for o in self.options.values() if o.reason is None)
            raise ApiError(
                400,
                f"quickdraft.method: {method!r} is not a method this server runs ({runs})",
                "quickdraft.method",
            )
        if option.reason is not None:
            self._unavailable(method, option.reason, option.status)
        assert self.others is not None  # the served method is the only option without
        async with self._building:  # two first requests for one method make one engine
            if method not in self.loops:
                self.loops[method] = await self._make(method, self.others.make)
        return self.loops[method]

    async def _make(self, method: str, make: Callable[[str], Engine]) -> EngineLoop:
        if self.draining:
            raise ApiError(503, "the server is shutting down", kind="server_error")
        try:
            engine = await run_in_threadpool(make, method)
        except ValueError as error:  # it cannot run here: say why, and from now on
            self._unavailable(method, str(error))
        except Exception as error:  # out of memory, an unreadable artifact: the same, logged
            log.exception("could not make the engine of %s", method)
            self._unavailable(method, f"{type(error).__name__}: {error}", 503)
        loop = self._loop(engine, Metrics(engine.needs.depth))
        if self._grace is not None:  # drained while it was being made
            loop.drain(self._grace)
        if self._started:
            loop.start()
        return loop

    def _unavailable(self, method: str, reason: str, status: int = 400) -> None:
        """Mark ``method`` as one that cannot run here, and refuse this request."""
        old = self.options.get(method)
        description = old.description if old else ""
        self.options[method] = MethodOption(method, description, reason, status)
        kind = "invalid_request_error" if status < 500 else "server_error"
        raise ApiError(
            status, f"quickdraft.method: {method} cannot run here: {reason}",
            "quickdraft.method", kind=kind,
        )  # fmt: skip

    def listing(self) -> dict[str, Any]:
        """``GET /v1/methods``: every method, whether it runs here and why not, and which
        are running already."""
        return {
            "served": self.served,
            "methods": [
                {
                    "name": o.name,
                    "description": o.description,
                    "available": o.reason is None,
                    "reason": o.reason,
                    "loaded": o.name in self.loops,
                }
                for o in self.options.values()
            ],
        }


def registry_methods(
    target: Model,
    tokenizer: HFTokenizer,
    *,
    served: str,
    target_name: str,
    device: str,
    rows: int,
    max_model_len: int,
    prefill_chunk: int,
    seed: int | None = None,
) -> OtherMethods:
    """Every registry method as a server offers it beside ``served``: whether it can run with
    what this deployment has (the picker's own test: artifacts shipped for ``target_name`` or
    none needed), and how to make its engine: the method's defaults, over the same target,
    with ``rows`` rows. A draft model runs only as the served method: the server loads one
    draft model, for that."""
    from quickdraft.drafters import registry
    from quickdraft.pick.candidates import support
    from quickdraft.pick.context import PickContext

    context = PickContext(target=target_name, draft=None, device=device)
    options = []
    for entry in registry.entries():
        reason = None
        if entry.name == served:
            pass
        elif entry.draft_model:
            reason = "a draft model runs only as the served method (--draft)"
        elif not support(entry.name).candidates(context):
            reason = context.missing.get(entry.name, f"nothing to draft with for {target_name}")
        options.append(MethodOption(entry.name, entry.description, reason))

    def make(method: str) -> Engine:
        return Engine.from_spec(
            target, registry.make_spec(method), target_name=target_name, tokenizer=tokenizer,
            max_batch=rows, max_model_len=max_model_len, prefill_chunk=prefill_chunk, seed=seed,
        )  # fmt: skip

    return OtherMethods(tuple(options), make)
