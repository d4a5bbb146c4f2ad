"""A request's structured output compiled and bound to the model's tokenizer before it queues,
on worker threads of its own, within a size and a time bound: a schema the server will not
compile is a 400 naming its field at once, one that takes too long a 400 after the bound, and
the event loop (``/health`` and every other request) never waits on either."""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from quickdraft.constraints import Constraint
from quickdraft.engine.core import Engine
from quickdraft.server.protocol import ApiError, ChatRequest, CompletionRequest, structured_output

log = logging.getLogger("quickdraft.server")

WORKERS = 2  # constraints compiled at once; a compile past its time bound keeps one busy


class Compiler:
    """max_bytes: the largest constraint (its JSON or text, in bytes) a request may send;
    timeout: seconds its compiling and binding may take (llguidance releases the GIL while it
    works, so the event loop runs meanwhile; a compile past the bound runs on, unawaited, and
    its worker is busy until it ends)."""

    def __init__(self, max_bytes: int, timeout: float):
        self.max_bytes, self.timeout = max_bytes, timeout
        self._executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="quickdraft-grammar")

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def bind(
        self, req: CompletionRequest | ChatRequest, engine: Engine
    ) -> tuple[str, Constraint] | None:
        """(the field that set it, the request's constraint), compiled and checked against
        ``engine``'s tokenizer (then cached there); None when it asks for none; a 400 naming
        the field when it is too large, too slow, or one this model cannot follow."""
        given = structured_output(req)
        if given is None:
            return None
        field, kind, value = given
        size = _size(value)
        if size > self.max_bytes:
            raise ApiError(
                400,
                f"{field}: {size} bytes, more than the {self.max_bytes} this server compiles",
                field,
            )

        def work() -> tuple[str, Constraint]:
            constraint = Constraint(kind, value)
            engine.constraints.matcher(constraint, held=True)  # fails here, else is kept
            return field, constraint

        future = asyncio.get_running_loop().run_in_executor(self._executor, work)
        try:
            return await asyncio.wait_for(future, self.timeout)
        except TimeoutError:
            raise ApiError(
                400,
                f"{field}: not compiled within {self.timeout:g} s; simplify the constraint",
                field,
            ) from None
        except ValueError as error:  # the library's own reason, one line naming the kind
            message = str(error).split(": ", 1)[-1]
            raise ApiError(400, f"{field}: {message}", field) from None
        except Exception:  # anything else the library raised: logged, not shown
            log.exception("compiling %s", field)
            raise ApiError(
                400, f"{field}: the grammar library could not compile it; simplify it", field
            ) from None


def _size(value: Any) -> int:
    """The constraint's size in bytes: its text, or its JSON (a schema, a list of choices)."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    try:
        return len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError, RecursionError):
        return 0  # Constraint refuses it, naming the field
