"""Build the agentic task set, ``quickdraft/bench/tasks/agentic.jsonl``: multi-turn sessions
whose turns resend the whole conversation and whose replies repeat their structure, the
workload suffix decoding is made for (vLLM's and ArcticInference's agentic benchmarks).

Three kinds of session, four of each, four turns a session, all from files on disk:

* ``tools``: an agent that answers only with JSON tool calls (``list_dir``, ``grep``,
  ``read_file``, ``finish``) looks for where a function of a standard-library package is
  defined; each later turn is the result of the call it would make (the package's real
  listing, real ``grep`` lines, the file's real lines).
* ``sql``: one schema describing the standard library (modules, functions, classes); each turn
  asks for one query about one module.
* ``edit``: one standard-library function, edited over four rounds (type hints, a renamed
  parameter, a docstring, no comments), the whole function replied each time.

A turn's item holds only what the user adds at that turn (the first turn also the system
message); the bench builds each request from the session so far and the model's own earlier
replies (``bench.harness``), so the session runs as an agent's would. Items name the files they
quote in ``source`` (``cpython==3.11.7 Lib/...``), which the training-data builders leave out;
the builder itself leaves out every file the training data already quotes, so no turn is
training text. Selection is by sorted order and a fixed seed; rerun with::

    python benchmarks/data/build_agentic.py
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "quickdraft" / "bench" / "tasks" / "agentic.jsonl"
SESSIONS = 4
LICENSE = "PSF-2.0"
_QUOTED = re.compile(r"Lib/([\w/]+\.py)")

TOOLS_SYSTEM = (
    "You are a coding agent. Answer every turn with exactly one JSON object and nothing else: "
    '{"tool": NAME, "arguments": {...}}. Tools: list_dir {"path": str}; grep '
    '{"pattern": str, "path": str}; read_file {"path": str, "start": int, "end": int}; '
    'finish {"answer": str}. Example: {"tool": "list_dir", "arguments": {"path": "json"}}'
)
SQL_SCHEMA = """CREATE TABLE modules (id INTEGER PRIMARY KEY, name TEXT, package TEXT,
  lines INTEGER);
CREATE TABLE functions (id INTEGER PRIMARY KEY, module_id INTEGER REFERENCES modules(id),
  name TEXT, arguments INTEGER, first_line INTEGER, last_line INTEGER, has_docstring BOOLEAN);
CREATE TABLE classes (id INTEGER PRIMARY KEY, module_id INTEGER REFERENCES modules(id),
  name TEXT, methods INTEGER, first_line INTEGER, bases TEXT);"""
SQL_SYSTEM = (
    "You write SQLite queries over this schema of the Python standard library:\n"
    f"{SQL_SCHEMA}\nAnswer every question with one SQL query in a ```sql block and nothing else."
)
SQL_QUESTIONS = (
    "How many functions does the module `{m}` define?",
    "List the names of the classes in `{m}`, in order of their first line.",
    "Which functions of `{m}` take more than two arguments? Give their names and argument counts.",
    "Which function of `{m}` has the most lines, and how many does it have?",
)
EDIT_STEPS = (
    "Add type hints to its parameters and return value. Reply with the complete function "
    "in a ```python block.",
    "Rename the parameter `{p}` to `{p}_value` everywhere in the function. Reply with the "
    "complete function in a ```python block.",
    "Add a one-line docstring that says what it does. Reply with the complete function in a "
    "```python block.",
    "Remove every comment. Reply with the complete function in a ```python block.",
)


def quoted_by_training_data() -> set[str]:
    """Standard-library files (relative to ``Lib``) the training data or its prompts quote."""
    quoted: set[str] = set()
    files = [*sorted((ROOT / "benchmarks" / "data").glob("*.jsonl"))]
    files += sorted((ROOT / "build" / "prompts").rglob("*.jsonl"))
    for path in files:
        quoted.update(_QUOTED.findall(path.read_text(encoding="utf-8")))
    return quoted


def functions(path: Path) -> list[ast.FunctionDef]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return []
    return [node for node in tree.body if isinstance(node, ast.FunctionDef)]


def item(session: str, turn: int, messages: list[dict], sources: list[str]) -> dict:
    plain = "\n\n".join(
        ("System: " if m["role"] == "system" else "User: ") + m["content"] for m in messages
    )
    return {
        "id": f"agentic-{session}-{turn}",
        "task": "agentic",
        "session": session,
        "turn": turn,
        "prompt": plain + "\n\nAssistant:",
        "messages": messages,
        "source": "; ".join(f"cpython==3.11.7 Lib/{s}" for s in sources),
        "license": LICENSE,
    }


def packages(lib: Path, rng: random.Random) -> list[Path]:
    """The standard library's packages (tests, IDLE and site-packages left out), shuffled."""
    found = [
        p for p in sorted(lib.iterdir())
        if (p / "__init__.py").is_file() and p.name not in {"test", "idlelib", "site-packages"}
    ]  # fmt: skip
    rng.shuffle(found)
    return found


def package_modules(package: Path, lib: Path, avoid: set[str]) -> list[Path]:
    """A package's modules but its ``__init__`` and those in ``avoid``, in sorted order."""
    return [
        m for m in sorted(package.glob("*.py"))
        if m.relative_to(lib).as_posix() not in avoid and m.name != "__init__.py"
    ]  # fmt: skip


def tools_sessions(lib: Path, avoid: set[str], rng: random.Random) -> list[dict]:
    items: list[dict] = []
    for package in packages(lib, rng):
        modules = package_modules(package, lib, avoid)
        found = [(m, f) for m in modules for f in functions(m) if not f.name.startswith("_")]
        if len(modules) < 3 or not found:
            continue
        module, function = found[len(found) // 2]
        name, rel = function.name, module.relative_to(lib).as_posix()
        session = f"tools-{len(items) // 4 + 1}"
        names = sorted(p.name for p in package.iterdir() if p.name != "__pycache__")
        more = [f"... ({len(names) - 30} more)"] if len(names) > 30 else []
        listing = "\n".join(names[:30] + more)
        lines = module.read_text(encoding="utf-8").splitlines()
        hits = [
            f"{rel}:{n}: {line.strip()}"
            for n, line in enumerate(lines, 1)
            if re.search(rf"\b{re.escape(name)}\b", line)
        ][:8]
        start = function.lineno
        end = min(start + 20, len(lines))
        body = "\n".join(f"{n}: {lines[n - 1]}" for n in range(start, end + 1))
        turns = [
            f"Task: find where `{name}` is defined in the standard library's `{package.name}` "
            "package and say what it does.",
            f"Tool result (list_dir {package.name}):\n{listing}",
            f"Tool result (grep {name} {package.name}):\n" + "\n".join(hits),
            f"Tool result (read_file {rel} {start}-{end}):\n{body}",
        ]
        for turn, text in enumerate(turns, 1):
            messages = [{"role": "user", "content": text}]
            if turn == 1:
                messages.insert(0, {"role": "system", "content": TOOLS_SYSTEM})
            items.append(item(session, turn, messages, [rel]))
        if len(items) == 4 * SESSIONS:
            return items
    raise SystemExit("agentic: too few standard-library packages for the tools sessions")


def sql_sessions(lib: Path, avoid: set[str], rng: random.Random) -> list[dict]:
    modules = [
        p for p in sorted(lib.glob("*.py"))
        if p.name not in avoid and len(functions(p)) >= 4
    ]  # fmt: skip
    rng.shuffle(modules)
    if len(modules) < 4 * SESSIONS:
        raise SystemExit("agentic: too few standard-library modules for the sql sessions")
    items = []
    for s in range(SESSIONS):
        session = f"sql-{s + 1}"
        chosen = modules[4 * s : 4 * s + 4]
        for turn, (question, module) in enumerate(zip(SQL_QUESTIONS, chosen, strict=True), 1):
            messages = [{"role": "user", "content": question.format(m=module.stem)}]
            if turn == 1:
                messages.insert(0, {"role": "system", "content": SQL_SYSTEM})
            items.append(item(session, turn, messages, [module.name]))
    return items


def edit_sessions(lib: Path, avoid: set[str], rng: random.Random) -> list[dict]:
    candidates = []
    for path in sorted(lib.glob("*.py")):
        if path.name in avoid:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for f in functions(path):
            size = (f.end_lineno or f.lineno) - f.lineno + 1
            params = [a.arg for a in f.args.args if a.arg not in {"self", "cls"}]
            if 12 <= size <= 30 and params:
                code = "\n".join(lines[f.lineno - 1 : f.end_lineno])
                candidates.append((path.name, f.name, params[0], code))
    rng.shuffle(candidates)
    items = []
    used: set[str] = set()
    for file, name, param, code in candidates:
        if file in used:
            continue
        used.add(file)
        session = f"edit-{len(items) // 4 + 1}"
        for turn, step in enumerate(EDIT_STEPS, 1):
            text = step.format(p=param)
            if turn == 1:
                text = f"Here is `{name}` from `{file}`:\n```python\n{code}\n```\n{text}"
            items.append(item(session, turn, [{"role": "user", "content": text}], [file]))
        if len(items) == 4 * SESSIONS:
            return items
    raise SystemExit("agentic: too few standard-library functions for the edit sessions")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    lib = Path(sysconfig.get_paths()["stdlib"])
    avoid = quoted_by_training_data()
    rng = random.Random(args.seed)
    kinds = [tools_sessions(lib, avoid, rng), sql_sessions(lib, avoid, rng)]
    kinds.append(edit_sessions(lib, avoid, rng))
    # Sessions of the three kinds in turn, each session's turns together: the first n
    # sessions (``--prompts-per-task n``) mix the kinds.
    items = [i for s in range(SESSIONS) for kind in kinds for i in kind[4 * s : 4 * s + 4]]
    args.out.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    print(f"wrote {args.out}: {len(items)} turns in {len(items) // 4} sessions")


if __name__ == "__main__":
    main()
