"""``runs.jsonl``: a bench's finished runs, so an interrupted bench resumes where it stopped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quickdraft.bench.harness import RunRecord


class RunLog:
    """``runs.jsonl`` in a bench's output folder: a header with the bench's settings, then one
    line per finished run. The same bench run again resumes from it; a bench with other
    settings starts a new log (``replaced`` says so)."""

    def __init__(self, folder: Path, settings: dict[str, Any]):
        self.path = Path(folder) / "runs.jsonl"
        self.header = {"bench": settings}
        self.replaced = False

    def resume(self) -> list[RunRecord]:
        """The runs this bench already finished. Reading stops at the first line that does
        not parse (a run cut off mid-write), keeping the ones before it."""
        records: list[RunRecord] = []
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        if lines and _parse(lines[0]) == self.header:
            for line in lines[1:]:
                try:
                    records.append(RunRecord.from_json(json.loads(line)))
                except (json.JSONDecodeError, TypeError, KeyError):
                    break
        self.replaced = bool(lines) and not records and _parse(lines[0]) != self.header
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        with temporary.open("w") as log:
            log.write(json.dumps(self.header) + "\n")
            for record in records:
                log.write(json.dumps(record.to_json()) + "\n")
        temporary.replace(self.path)
        return records

    def append(self, record: RunRecord) -> None:
        with self.path.open("a") as log:
            log.write(json.dumps(record.to_json()) + "\n")


def _parse(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None
