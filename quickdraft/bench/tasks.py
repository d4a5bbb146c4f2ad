"""The task kinds of ``quickdraft bench``, stored as JSONL beside this file.

Each item has a plain ``prompt`` and the same request as chat ``messages``, with its ``source``
and ``license``. ``tools/build_task_sets.py`` rebuilds the seven classic kinds from their
offline sources. ``agentic`` (``benchmarks/data/build_agentic.py``) is a set of sessions: its
items are turns, each holding only what the user adds at that turn; the bench builds a turn's
request from the session so far and the model's own replies. ``structured``
(``benchmarks/data/build_structured.py``) carries a JSON ``schema`` per item: the bench asks
for replies valid against it (``SamplingParams.json_schema``) and checks each. Both run when
named (``--tasks agentic,structured``), not in ``all``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TASK_KINDS = ("translation", "conversation", "rag", "math", "qa", "summarization", "code")
SESSION_KINDS = ("agentic",)
SCHEMA_KINDS = ("structured",)
TASK_DIR = Path(__file__).parent / "tasks"


@dataclass(frozen=True, slots=True)
class TaskItem:
    id: str
    task: str
    prompt: str
    messages: tuple[dict[str, str], ...]
    source: str
    license: str
    session: str | None = None  # turns of one session share it, in order
    turn: int = 0
    schema: dict | None = None  # the reply must be JSON valid against it


def parse_tasks(text: str) -> tuple[str, ...]:
    """'all' (the seven classic kinds) or a comma-separated list of task kinds."""
    if text.strip() == "all":
        return TASK_KINDS
    kinds = tuple(kind.strip() for kind in text.split(",") if kind.strip())
    known = (*TASK_KINDS, *SESSION_KINDS, *SCHEMA_KINDS)
    unknown = [kind for kind in kinds if kind not in known]
    if unknown or not kinds:
        raise ValueError(
            f"tasks: unknown {unknown or text!r}; choose 'all' or from {', '.join(known)}"
        )
    return kinds


def load_tasks(
    kinds: tuple[str, ...] = TASK_KINDS, per_task: int | None = None
) -> dict[str, list[TaskItem]]:
    """The first ``per_task`` items of each kind (all when None); of a session kind, every
    turn of the first ``per_task`` sessions."""
    if per_task is not None and per_task < 1:
        raise ValueError(f"prompts_per_task must be >= 1, got {per_task}")
    loaded = {}
    for kind in kinds:
        lines = (TASK_DIR / f"{kind}.jsonl").read_text(encoding="utf-8").splitlines()
        items = [_item(json.loads(line)) for line in lines if line.strip()]
        if per_task and kind in SESSION_KINDS:
            sessions = list(dict.fromkeys(item.session for item in items))[:per_task]
            loaded[kind] = [item for item in items if item.session in sessions]
        else:
            loaded[kind] = items[:per_task] if per_task else items
    return loaded


def _item(data: dict) -> TaskItem:
    return TaskItem(
        data["id"],
        data["task"],
        data["prompt"],
        tuple(data["messages"]),
        data["source"],
        data["license"],
        data.get("session"),
        data.get("turn", 0),
        data.get("schema"),
    )
