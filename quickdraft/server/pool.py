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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from quickdraft.engine.core import Engine
from quickdraft.server.loop import EngineLoop
from quickdraft.server.metrics import Metrics
from quickdraft.server.protocol import ApiError


@dataclass(frozen=True, slots=True)
class MethodOption:
    """A registry method as the server offers it: ``reason`` says why it cannot run here
    (a drafter with no artifacts for this target, no draft model), None when it can."""

    name: str
    description: str
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class OtherMethods:
    """The methods a request may name besides the served one: ``options``, every method
    with whether it can run here, and ``make``, which builds the engine of one that can (it
    may take seconds: it runs on a worker thread; a ValueError it raises answers 400)."""

    options: tuple[MethodOption, ...]
    make: Callable[[str], Engine]


class EnginePool:
    """served: the served method's name; others: what else requests may name (None: only
    the served method). max_queue: requests each engine takes beyond its rows."""

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

    @property
    def main(self) -> EngineLoop:
        return self.loops[self.served]

    def _loop(self, engine: Engine) -> EngineLoop:
        return EngineLoop(engine, self.metrics, engine.scheduler.num_rows + self.max_queue)

    def start(self) -> None:
        """On the event loop: start the engines' threads."""
        self._started = True
        for loop in self.loops.values():
            loop.start()

    def stop(self) -> None:
        for loop in self.loops.values():
            loop.stop()

    def drain(self, grace: float) -> None:
        for loop in self.loops.values():
            loop.drain(grace)

    @property
    def error(self) -> str | None:
        return next((loop.error for loop in self.loops.values() if loop.error), None)

    @property
    def draining(self) -> bool:
        return self.main.draining

    async def loop_for(self, method: str | None) -> EngineLoop:
        """The engine loop of ``method`` (None: the served one), made on first use; a 400
        naming ``quickdraft.method`` when this server cannot run it."""
        if method is None or method == self.served:
            return self.main
        if method in self.loops:
            return self.loops[method]
        option = self.options.get(method)
        if option is None:
            names = ", ".join(self.options)
            raise ApiError(
                400,
                f"quickdraft.method: {method!r} is not a method this server runs ({names})",
                "quickdraft.method",
            )
        if option.reason is not None:
            raise ApiError(
                400,
                f"quickdraft.method: {method} cannot run here: {option.reason}",
                "quickdraft.method",
            )
        assert self.others is not None  # the served method is the only option without
        async with self._building:  # two first requests for one method make one engine
            if method not in self.loops:
                try:
                    engine = await run_in_threadpool(self.others.make, method)
                except ValueError as error:
                    self.options[method] = MethodOption(method, option.description, str(error))
                    raise ApiError(
                        400, f"quickdraft.method: {method}: {error}", "quickdraft.method"
                    ) from None
                loop = self._loop(engine)
                if self._started:
                    loop.start()
                self.loops[method] = loop
        return self.loops[method]

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
