"""Training text for shortlists: chats or plain text, tokenized with the target's tokenizer.

Accepted files: ``.jsonl`` with one record a line, each a chat (``messages``) or plain
``text`` (an optional ``kind`` groups records for balanced sampling); ``.txt``/``.md``/``.py``
and other text files, read whole. A directory is read recursively.

A chat is tokenized with its template; only the positions from the first assistant turn on are
``scored`` (drafting happens in replies, not in prompts). Plain text is scored throughout.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from quickdraft.models.base import Tokenizer

TEXT_SUFFIXES = {".txt", ".md", ".rst", ".py", ".json", ".yaml", ".yml", ".toml", ".c", ".h"}


@dataclass(frozen=True, slots=True)
class Sequence:
    """One tokenized training sequence; positions >= ``start`` are scored."""

    tokens: list[int]
    start: int
    kind: str


def read_records(paths: list[str | Path]) -> list[dict]:
    """Every record of the given files and folders, in a deterministic order."""
    if not paths:
        raise ValueError("data: give at least one file or folder")
    records: list[dict] = []
    for path in map(Path, paths):
        if not path.exists():
            raise ValueError(f"data: {path} does not exist")
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            records.extend(_file_records(file))
    if not records:
        raise ValueError(f"data: no text found in {', '.join(map(str, paths))}")
    return records


def _file_records(file: Path) -> Iterator[dict]:
    if file.suffix == ".jsonl":
        for number, record in jsonl_objects(file, "data"):
            check_record(record, f"{file}:{number}")
            yield record
    elif file.suffix in TEXT_SUFFIXES:
        text = file.read_text(encoding="utf-8", errors="replace")
        if file.suffix == ".json" and _records_in_json(text):
            raise ValueError(
                f"data: {file} is a JSON array of records; write them one a line as .jsonl to "
                "train on them (a .json file is otherwise read as text)"
            )
        yield {"text": text, "kind": file.suffix}


def _records_in_json(text: str) -> bool:
    """Whether a .json file holds training records (a list of chats or texts), which would
    otherwise be trained on as the JSON text itself."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, dict) and ("messages" in v or "text" in v) for v in value)
    )


ROLES = ("system", "user", "assistant", "tool")


def check_record(record: dict, where: str, option: str = "data") -> None:
    """A training record: ``text`` (a string) or ``messages`` (a list of objects, each with a
    ``role`` among ``ROLES`` and string ``content``); a ValueError naming the option, file,
    line and field otherwise."""
    if "messages" not in record and "text" not in record:
        raise ValueError(f"{option}: {where} has neither 'messages' nor 'text'")
    if "messages" not in record:
        if not isinstance(record["text"], str):
            raise ValueError(f"{option}: {where}: 'text' must be a string")
        return
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{option}: {where}: 'messages' must be a non-empty list of messages")
    for index, message in enumerate(messages):
        field = f"{option}: {where}: messages[{index}]"
        if not isinstance(message, dict):
            raise ValueError(f"{field} must be an object with 'role' and 'content'")
        if message.get("role") not in ROLES:
            raise ValueError(f"{field}.role must be one of {', '.join(ROLES)}")
        if not isinstance(message.get("content"), str):
            raise ValueError(f"{field}.content must be a string")


def text_lines(text: str) -> list[str]:
    """A text's lines, split at newlines only: ``str.splitlines`` also splits at U+0085,
    U+2028, U+2029 and form feeds, which JSON strings may hold raw (``ensure_ascii=False``
    writes them), so a valid record would read as two broken ones."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def read_utf8(path: Path, field: str) -> str:
    """A text file's content; a ValueError naming ``field`` and the file where it is not
    UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{field}: {path} is not UTF-8 text") from None


def jsonl_objects(path: Path, field: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSONL file; a line that is not a
    JSON object, or a file that is not UTF-8, is a ValueError naming ``field``, the file and
    the line."""
    for number, line in enumerate(text_lines(read_utf8(path, field)), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{field}: {path}:{number} is not JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{field}: {path}:{number} is not a JSON object")
        yield number, record


def tokenize(record: dict, tokenizer: Tokenizer, max_tokens: int) -> Sequence:
    """A record as token ids, cut to ``max_tokens``, with the first scored position: a chat's
    first assistant turn, or the turn ``reply_turn`` names (the reply ``data regenerate`` wrote
    to a follow-up prompt; the turns before it are context, already scored in their own
    record or not the model's)."""
    kind = str(record.get("kind", "text"))
    if "messages" in record:
        messages = list(record["messages"])
        first_reply = next(
            (i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages)
        )
        if "reply_turn" in record:
            first_reply = record["reply_turn"]
            if not (isinstance(first_reply, int) and 0 < first_reply < len(messages)
                    and messages[first_reply].get("role") == "assistant"):  # fmt: skip
                raise ValueError(
                    f"reply_turn: {first_reply!r} is not the index of an assistant turn"
                )
        tokens = tokenizer.apply_chat(messages, add_generation_prompt=False)
        start = len(tokenizer.apply_chat(messages[:first_reply])) if first_reply else 0
    else:
        tokens, start = tokenizer.encode(record["text"]), 1
    # A chat with no assistant turn (the prompt with its generation prefix outruns the
    # tokens), or a prompt longer than max_tokens, scores nothing: start at the end.
    tokens = tokens[:max_tokens]
    return Sequence(tokens, min(max(start, 1), len(tokens)), kind)


def balanced_sample(sequences: list[Sequence], budget: int, seed: int = 0) -> list[Sequence]:
    """About ``budget`` scored positions, split evenly across kinds (a kind with less text
    gives all it has and the rest go to the others), sequences shuffled within each kind.
    A sequence repeated (the same tokens scored from the same position) is taken once: a copy
    teaches nothing new and would sit on both sides of a held-out split. A sequence with
    nothing to score (a chat without an assistant turn) is left out; a ValueError when no
    sequence has anything."""
    by_kind: dict[str, list[Sequence]] = {}
    seen: set[tuple[tuple[int, ...], int]] = set()
    scoring = [s for s in sequences if len(s.tokens) > s.start]
    if sequences and not scoring:
        raise ValueError(
            "data: no record has text to learn from (a chat needs an assistant turn, a text "
            "at least two tokens)"
        )
    for sequence in scoring:
        identity = (tuple(sequence.tokens), sequence.start)
        if identity not in seen:
            seen.add(identity)
            by_kind.setdefault(sequence.kind, []).append(sequence)
    rng = random.Random(seed)
    for group in by_kind.values():
        rng.shuffle(group)
    chosen: list[Sequence] = []
    remaining, kinds = budget, sorted(by_kind, key=lambda k: _scored(by_kind[k]))
    for index, kind in enumerate(kinds):
        share = remaining // (len(kinds) - index)
        taken = 0
        for sequence in by_kind[kind]:
            if taken >= share:
                break
            chosen.append(sequence)
            taken += len(sequence.tokens) - sequence.start
        remaining -= taken
    return chosen


def _scored(group: list[Sequence]) -> int:
    return sum(len(s.tokens) - s.start for s in group)
