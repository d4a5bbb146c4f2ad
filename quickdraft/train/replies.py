"""A model's own replies to prompts: training text in the style the model actually writes.

Drafters learn best from the target's own output (Medusa-2's self-distillation, EAGLE's
regenerated ShareGPT): heads trained on reference answers learn those answers' continuations,
not the model's. ``quickdraft data regenerate`` writes, for each prompt, a chat record whose
assistant turn is the target's reply, ready for ``train eagle``, ``train medusa`` and
``train router``.

Prompts: ``.jsonl`` records with ``messages`` (the turns before the first assistant turn are
the prompt) or ``prompt`` (a user turn), with an optional ``kind``; any other file is one
prompt per line. Records are taken with their kinds in turn, so a run stopped early still
covers every kind. Replies are generated in batches (``generate_batch``) and each batch is
appended as it finishes: a run started again skips the prompts already answered (a line cut
off mid-write is dropped) and continues.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from quickdraft.config import SamplingParams
from quickdraft.engine import generate_batch
from quickdraft.models.base import Model
from quickdraft.train.corpus import jsonl_objects

Progress = Callable[[int, int], None]


def read_prompts(path: Path) -> list[dict]:
    """Prompt records ``{"index", "messages", "kind"}`` in the order they will be answered."""
    if not path.is_file():
        raise ValueError(f"prompts: {path} is not a file")
    by_kind: dict[str, list[dict]] = {}
    if path.suffix == ".jsonl":
        for number, record in jsonl_objects(path, "prompts"):
            if "messages" in record:
                turns = list(record["messages"])
                first = next(
                    (i for i, m in enumerate(turns) if m.get("role") == "assistant"), len(turns)
                )
                messages = turns[:first]
            elif "prompt" in record:
                messages = [{"role": "user", "content": str(record["prompt"])}]
            else:
                raise ValueError(f"prompts: {path}:{number} has neither 'messages' nor 'prompt'")
            if not messages:
                raise ValueError(f"prompts: {path}:{number} starts with an assistant turn")
            kind = str(record.get("kind", "text"))
            by_kind.setdefault(kind, []).append(
                {"line": number, "messages": messages, "kind": kind}
            )
    else:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                messages = [{"role": "user", "content": line}]
                by_kind.setdefault("text", []).append(
                    {"line": number, "messages": messages, "kind": "text"}
                )
    if not by_kind:
        raise ValueError(f"prompts: {path} holds no prompts")
    groups = [by_kind[kind] for kind in sorted(by_kind)]
    ordered = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
    return [{**record, "index": i} for i, record in enumerate(ordered)]


def answered(out: Path) -> set[int]:
    """Indices already written to ``out``; a last line cut off mid-write is removed."""
    if not out.exists():
        return set()
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    done, kept = set(), []
    for line in lines:
        if not line.endswith("\n"):
            break  # no newline: cut off mid-write, even if it parses
        try:
            done.add(int(json.loads(line)["index"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            break  # a cut-off line: it and anything after it are answered again
        kept.append(line)
    if len(kept) != len(lines):
        out.write_text("".join(kept), encoding="utf-8")
    return done


def regenerate(
    model: Model,
    tokenizer,
    prompts: list[dict],
    out: Path,
    sampling: SamplingParams,
    *,
    name: str,
    batch_size: int = 8,
    progress: Progress | None = None,
) -> dict:
    """Answer every prompt not yet in ``out`` and append the chats; returns counts."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    done = answered(out)
    todo = [p for p in prompts if p["index"] not in done]
    out.parent.mkdir(parents=True, exist_ok=True)
    tokens = 0
    if progress is not None:
        progress(len(prompts) - len(todo), len(prompts))
    for start in range(0, len(todo), batch_size):
        chunk = todo[start : start + batch_size]
        rows = [tokenizer.apply_chat(p["messages"]) for p in chunk]
        result = generate_batch(model, rows, sampling=sampling)
        lines = []
        for prompt, ids in zip(chunk, result.token_ids, strict=True):
            tokens += len(ids)
            reply = {"role": "assistant", "content": tokenizer.decode(ids)}
            lines.append(json.dumps({
                "index": prompt["index"],
                "kind": f"{prompt['kind']}/generated",
                "messages": [*prompt["messages"], reply],
                "source": f"{name} reply (T={sampling.temperature:g}) to prompt line "
                f"{prompt['line']}",
            }) + "\n")  # fmt: skip
        with out.open("a", encoding="utf-8") as sink:
            sink.write("".join(lines))
        if progress is not None:
            progress(len(prompts) - len(todo) + start + len(chunk), len(prompts))
    return {"prompts": len(prompts), "skipped": len(done), "answered": len(todo), "tokens": tokens}
