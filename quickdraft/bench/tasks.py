"""The seven task kinds of ``quickdraft bench``, stored as JSONL beside this file.

Each item has a plain ``prompt`` and the same request as chat ``messages``, with its ``source``
and ``license``. ``tools/build_task_sets.py`` rebuilds the files from their offline sources.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TASK_KINDS = ("translation", "conversation", "rag", "math", "qa", "summarization", "code")
TASK_DIR = Path(__file__).parent / "tasks"


@dataclass(frozen=True, slots=True)
class TaskItem:
    id: str
    task: str
    prompt: str
    messages: tuple[dict[str, str], ...]
    source: str
    license: str


def parse_tasks(text: str) -> tuple[str, ...]:
    """'all' or a comma-separated list of task kinds."""
    if text.strip() == "all":
        return TASK_KINDS
    kinds = tuple(kind.strip() for kind in text.split(",") if kind.strip())
    unknown = [kind for kind in kinds if kind not in TASK_KINDS]
    if unknown or not kinds:
        raise ValueError(
            f"tasks: unknown {unknown or text!r}; choose 'all' or from {', '.join(TASK_KINDS)}"
        )
    return kinds


def load_tasks(
    kinds: tuple[str, ...] = TASK_KINDS, per_task: int | None = None
) -> dict[str, list[TaskItem]]:
    """The first ``per_task`` items of each kind (all when None)."""
    if per_task is not None and per_task < 1:
        raise ValueError(f"prompts_per_task must be >= 1, got {per_task}")
    loaded = {}
    for kind in kinds:
        lines = (TASK_DIR / f"{kind}.jsonl").read_text(encoding="utf-8").splitlines()
        items = [_item(json.loads(line)) for line in lines if line.strip()]
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
    )
