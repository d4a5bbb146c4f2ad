"""Build the structured-output task set, ``quickdraft/bench/tasks/structured.jsonl``: requests
whose reply must be JSON valid against a schema the item carries (``schema``), the workload of
``response_format`` and tool calls.

Three kinds, eight items each, all from files on disk:

* ``signature``: a standard-library function's header and docstring; extract its name, its
  parameters and what it returns.
* ``class``: a standard-library class's header and its methods' names; extract its name, its
  bases and its methods.
* ``tool``: an agent's tool call (``list_dir``, ``grep``, ``read_file``) for a request about a
  standard-library package, answered as ``{"tool": ..., "arguments": {...}}``.

Every string in the schemas has a ``maxLength`` and every array a ``maxItems``, so a reply
always closes within the bench's token budget and the grammar, not the model, decides when it
ends; whitespace is compact (``x-guidance``), as a client asking for machine-read JSON wants.
Items name the files they quote in ``source``; files the training data quotes are left out.
Selection is by sorted order and a fixed seed; rerun with::

    python benchmarks/data/build_structured.py
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from build_agentic import (
    LICENSE,
    ROOT,
    functions,
    package_modules,
    packages,
    quoted_by_training_data,
)

OUT = ROOT / "quickdraft" / "bench" / "tasks" / "structured.jsonl"
PER_KIND = 8
COMPACT = {"x-guidance": {"whitespace_flexible": False}}


def text(length: int) -> dict:
    return {"type": "string", "maxLength": length}


def names(length: int, most: int) -> dict:
    return {"type": "array", "items": text(length), "maxItems": most}


def obj(properties: dict, required: list[str] | None = None) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


SIGNATURE = {**obj({"name": text(40), "parameters": names(24, 8), "returns": text(80)}), **COMPACT}
CLASS = {**obj({"name": text(40), "bases": names(40, 4), "methods": names(32, 12)}), **COMPACT}
TOOL = {
    **obj(
        {
            "tool": {"enum": ["list_dir", "grep", "read_file"]},
            "arguments": obj(
                {
                    "path": text(60),
                    "pattern": text(40),
                    "start": {"type": "integer", "minimum": 1, "maximum": 99999},
                    "end": {"type": "integer", "minimum": 1, "maximum": 99999},
                },
                required=["path"],
            ),
        }
    ),
    **COMPACT,
}
TOOL_SYSTEM = (
    "You are a coding agent. Answer with exactly one JSON tool call: "
    '{"tool": NAME, "arguments": {...}}. Tools: list_dir {"path"}; grep {"pattern", "path"}; '
    'read_file {"path", "start", "end"}.'
)
TOOL_REQUESTS = (
    "List the files of the `{pkg}` package.",
    "Find where `{name}` is defined in the `{pkg}` package.",
    "Show lines {a} to {b} of `{pkg}/{file}`.",
)


def item(kind: str, index: int, messages: list[dict], schema: dict, sources: list[str]) -> dict:
    plain = "\n\n".join(
        ("System: " if m["role"] == "system" else "User: ") + m["content"] for m in messages
    )
    return {
        "id": f"structured-{kind}-{index}",
        "task": "structured",
        "prompt": plain + "\n\nAssistant:",
        "messages": messages,
        "schema": schema,
        "source": "; ".join(f"cpython==3.11.7 Lib/{s}" for s in sources),
        "license": LICENSE,
    }


def modules(lib: Path, avoid: set[str], rng: random.Random) -> list[Path]:
    found = [
        p for p in sorted(lib.glob("*.py"))
        if p.relative_to(lib).as_posix() not in avoid and not p.name.startswith("_")
    ]  # fmt: skip
    rng.shuffle(found)
    return found


def signature_items(lib: Path, avoid: set[str], rng: random.Random) -> list[dict]:
    items: list[dict] = []
    for path in modules(lib, avoid, rng):
        source = path.read_text(encoding="utf-8").splitlines()
        documented = [f for f in functions(path) if ast.get_docstring(f) and f.args.args]
        for func in documented[:1]:
            doc = ast.get_docstring(func) or ""
            head = "\n".join(source[func.lineno - 1 : func.body[0].lineno - 1])
            passage = f'{head}\n    """{doc[:500]}"""'
            ask = (
                "Extract the function's name, its parameters and what it returns, as JSON.\n\n"
                f"```python\n{passage}\n```"
            )
            rel = path.relative_to(lib).as_posix()
            items.append(item("signature", len(items) + 1, [{"role": "user", "content": ask}],
                              SIGNATURE, [rel]))  # fmt: skip
        if len(items) == PER_KIND:
            return items
    return items


def class_items(lib: Path, avoid: set[str], rng: random.Random) -> list[dict]:
    items: list[dict] = []
    for path in modules(lib, avoid, rng):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        classes = [
            n for n in tree.body
            if isinstance(n, ast.ClassDef) and n.bases and 2 <= len(_methods(n)) <= 10
        ]  # fmt: skip
        for cls in classes[:1]:
            bases = ", ".join(ast.unparse(b) for b in cls.bases)
            listing = "\n".join(f"    def {m}(...)" for m in _methods(cls))
            ask = (
                "Extract the class's name, its bases and its methods, as JSON.\n\n"
                f"```python\nclass {cls.name}({bases}):\n{listing}\n```"
            )
            rel = path.relative_to(lib).as_posix()
            items.append(item("class", len(items) + 1, [{"role": "user", "content": ask}],
                              CLASS, [rel]))  # fmt: skip
        if len(items) == PER_KIND:
            return items
    return items


def _methods(cls: ast.ClassDef) -> list[str]:
    return [n.name for n in cls.body if isinstance(n, ast.FunctionDef)]


def tool_items(lib: Path, avoid: set[str], rng: random.Random) -> list[dict]:
    items: list[dict] = []
    for package in packages(lib, rng):
        files = package_modules(package, lib, avoid)
        defined = [f for m in files for f in functions(m)]
        if not files or not defined:
            continue
        form = TOOL_REQUESTS[len(items) % len(TOOL_REQUESTS)]
        chosen = rng.choice(files)
        lines = len(chosen.read_text(encoding="utf-8").splitlines())
        a = rng.randint(1, max(1, lines - 40))
        ask = form.format(pkg=package.name, name=rng.choice(defined).name, file=chosen.name,
                          a=a, b=a + 30)  # fmt: skip
        messages = [{"role": "system", "content": TOOL_SYSTEM}, {"role": "user", "content": ask}]
        rel = chosen.relative_to(lib).as_posix() if "{file}" in form else f"{package.name}/"
        items.append(item("tool", len(items) + 1, messages, TOOL, [rel]))
        if len(items) == PER_KIND:
            break
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    lib = Path(sysconfig.get_paths()["stdlib"])
    avoid = quoted_by_training_data()
    rng = random.Random(args.seed)
    kinds = [signature_items(lib, avoid, rng), class_items(lib, avoid, rng)]
    kinds.append(tool_items(lib, avoid, rng))
    # The kinds in turn: the first n items (``--prompts-per-task n``) mix them.
    items = [kind[i] for i in range(PER_KIND) for kind in kinds if i < len(kind)]
    args.out.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    print(f"wrote {args.out}: {len(items)} items")


if __name__ == "__main__":
    main()
