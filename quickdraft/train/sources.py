"""A text corpus from what this machine already has, for frequency lists (FR-Spec).

``quickdraft data corpus`` writes ``corpus.jsonl``, plain-text records (``text``, ``kind``,
``source``) drawn from offline sources:

* ``code``: the Python standard library's modules (``.py``; ``site-packages`` left out);
* ``manual``: the English man pages (``/usr/share/man/man1`` ... ``man8``) as plain text, at
  most ``MAN_PER_FAMILY`` pages of one family (the name up to its first ``_``): one SDK can
  install thousands of near-identical pages (``gcloud_*``: 16,631 of 17,847 here).

Files that the task sets in ``task_dir`` quote (their records name them in ``source``; the
command line passes ``quickdraft bench``'s, ``bench.tasks.TASK_DIR``), and
the man pages of the same name in every language, are left out, so a list counted over the
corpus has not seen the bench's prompts. Each source is capped at ``max_chars`` characters:
its files are shuffled with a fixed seed and taken whole in that order until the cap, so the
sample spreads over the whole source instead of its first letters of the alphabet. The same
machine and arguments give the same bytes; ``corpus.json`` beside it records the
files taken and the output's sha256.

``quickdraft data code-prompts`` makes code-completion prompts from the same standard library
(``code_prompts``), and ``data doc-prompts`` summarization and passage-question prompts over
its docstrings and the man pages (``document_prompts``), for ``data regenerate`` to have the
target answer.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import random
import re
import sysconfig
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from quickdraft.artifacts import remove_stale_partials, written_whole
from quickdraft.train.roff import page_text

MAN_ROOT = Path("/usr/share/man")
MAN_PER_FAMILY = 40
SOURCES = ("code", "manual")
_TASK_FILE = re.compile(r"cpython==\S+ Lib/(?P<lib>\S+\.py)|(?P<man>/usr/share/man/\S+\.gz)")


@dataclass(frozen=True, slots=True)
class Excluded:
    """What the task sets quote: standard-library paths (relative to ``Lib``) and man page
    names (``dpkg.1``), in any language."""

    stdlib: frozenset[str]
    manual: frozenset[str]


def task_files(task_dir: Path) -> Excluded:
    """The files the task sets in ``task_dir`` quote."""
    stdlib: set[str] = set()
    manual: set[str] = set()
    for file in sorted(task_dir.glob("*.jsonl")):
        for line in file.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            for match in _TASK_FILE.finditer(str(json.loads(line).get("source", ""))):
                if match["lib"]:
                    stdlib.add(match["lib"])
                else:
                    manual.add(Path(match["man"]).name.removesuffix(".gz"))
    return Excluded(frozenset(stdlib), frozenset(manual))


def stdlib_files(excluded: Excluded, root: Path | None = None) -> list[Path]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    return [
        path
        for path in sorted(root.rglob("*.py"))
        if "site-packages" not in path.parts
        and path.relative_to(root).as_posix() not in excluded.stdlib
    ]


def man_files(excluded: Excluded, seed: int, root: Path = MAN_ROOT) -> list[Path]:
    families: dict[str, list[Path]] = {}
    for section in range(1, 9):
        for path in sorted((root / f"man{section}").glob("*.gz")):
            if path.name.removesuffix(".gz") not in excluded.manual and not path.is_symlink():
                families.setdefault(path.name.split("_")[0], []).append(path)
    rng = random.Random(seed)
    kept: list[Path] = []
    for name in sorted(families):
        pages = families[name]
        rng.shuffle(pages)
        kept.extend(sorted(pages[:MAN_PER_FAMILY]))
    return kept


def _read_code(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _read_manual(path: Path) -> str:
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as handle:
        source = handle.read()
    if source.lstrip().startswith(".so "):  # a pointer to another page
        return ""
    return page_text(source)


def sample(
    files: list[Path], read: Callable[[Path], str], max_chars: int, seed: int
) -> Iterator[tuple[Path, str]]:
    """Whole files in a seeded shuffle of ``files`` until ``max_chars`` characters."""
    order = list(files)
    random.Random(seed).shuffle(order)
    total = 0
    for path in order:
        if total >= max_chars:
            return
        text = read(path)
        if text.strip():
            total += len(text)
            yield path, text


def build_corpus(
    out: Path,
    sources: tuple[str, ...] = SOURCES,
    max_chars: int = 24_000_000,
    *,
    task_dir: Path,
    seed: int = 0,
    progress: Callable[[str, int], None] | None = None,
    roots: dict[str, Path] | None = None,
) -> dict:
    """Write ``corpus.jsonl`` and its manifest ``corpus.json`` into the folder ``out``;
    returns the manifest. ``roots`` replaces a source's folder (``code``: the standard
    library, ``manual``: ``/usr/share/man``)."""
    unknown = [s for s in sources if s not in SOURCES]
    if unknown:
        raise ValueError(f"sources: unknown {', '.join(unknown)} (choose from {SOURCES})")
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    excluded = task_files(Path(task_dir))
    roots = roots or {}
    listings = {
        "code": (lambda: stdlib_files(excluded, roots.get("code")), _read_code),
        "manual": (lambda: man_files(excluded, seed, roots.get("manual", MAN_ROOT)), _read_manual),
    }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    manifest: dict = {"seed": seed, "max_chars": max_chars, "sources": {}}
    # Written aside and renamed when whole, so an interrupted run leaves the previous corpus
    # as it was, never a part of a new one.
    remove_stale_partials(out, "corpus.jsonl.partial-*")
    with (
        written_whole(out / "corpus.jsonl") as partial,
        partial.open("w", encoding="utf-8") as handle,
    ):
        for kind in sources:
            listing, read = listings[kind]
            files = listing()
            if not files:
                raise ValueError(f"sources: no {kind} files on this machine")
            chars = taken = 0
            for path, text in sample(files, read, max_chars, seed):
                line = json.dumps({"text": text, "kind": kind, "source": str(path)}) + "\n"
                handle.write(line)
                digest.update(line.encode())
                chars, taken = chars + len(text), taken + 1
                if progress is not None:
                    progress(kind, taken)
            manifest["sources"][kind] = {"files": taken, "of": len(files), "chars": chars}
    manifest["excluded"] = {"stdlib": sorted(excluded.stdlib), "manual": sorted(excluded.manual)}
    manifest["sha256"] = digest.hexdigest()
    (out / "corpus.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


CODE_PROMPT = "Complete the following Python function:\n\n{header}\n"


def _function_headers(path: Path, root: Path) -> Iterator[tuple[str, str]]:
    """(where, header) for each public function of ``path`` with a docstring of 40 characters
    or more: its signature and docstring as written, dedented, under 1,500 characters."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    lines = source.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node, clean=False)
        if not doc or len(doc) < 40 or not node.body:
            continue
        header = "\n".join(lines[node.lineno - 1 : node.body[0].end_lineno])
        header = textwrap.dedent(header)
        if len(header) < 1500:
            yield f"{path.relative_to(root).as_posix()}:{node.lineno} {node.name}", header


def code_prompts(
    count: int, *, task_dir: Path, seed: int = 0, root: Path | None = None
) -> list[dict]:
    """``count`` code-completion prompts in HumanEval's form ("Complete the following Python
    function:", a signature and its docstring) made from the standard library's public
    functions, as ``{"kind": "code", "prompt", "source"}`` records for ``data regenerate``.
    Tests, IDLE and the files the task sets quote are left out; a seeded shuffle picks them."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    found = [
        (where, header)
        for path in stdlib_files(task_files(Path(task_dir)), root)
        if not {"test", "tests", "idlelib"} & set(path.relative_to(root).parts)
        for where, header in _function_headers(path, root)
    ]
    random.Random(seed).shuffle(found)
    # One prompt per header: some functions are written out the same in several modules.
    first = {header: where for where, header in reversed(found)}
    found = [(first[header], header) for header in dict.fromkeys(h for _, h in found)]
    return [
        {"kind": "code", "prompt": CODE_PROMPT.format(header=header), "source": f"Lib/{where}"}
        for where, header in found[:count]
    ]


SUMMARY_PROMPT = "Summarise the following text in two sentences:\n\n{text}\n\nSummary:"
PASSAGE_PROMPT = (
    "Answer the question using only the passage.\n\nPassage:\n{text}\n\n"
    "Question: {question}\n\nAnswer:"
)
_SECTION = re.compile(r"^[A-Z][A-Z ]+$")
_OPTION = re.compile(r"^(-{1,2}[A-Za-z][\w-]*)")


def clip(text: str, max_chars: int) -> str:
    """``text``'s whole paragraphs from the start while they fit in ``max_chars``; a first
    paragraph longer than that is cut at ``max_chars``."""
    kept: list[str] = []
    for paragraph in (p.strip() for p in re.split(r"\n\s*\n", text)):
        if paragraph and kept and sum(map(len, kept)) + len(paragraph) > max_chars:
            break
        if paragraph:
            kept.append(paragraph)
    return "\n\n".join(kept)[:max_chars]


def _docstring_passages(path: Path, root: Path) -> Iterator[tuple[str, str, str]]:
    """(where, passage, question) for a module's docstring and its public functions'."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    where = path.relative_to(root).as_posix()
    module = where.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    doc = ast.get_docstring(tree)
    if doc and len(doc) >= 300:
        yield f"{where}, module docstring", doc, f"What is the purpose of the module `{module}`?"
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= 200:
                question = f"What does `{module}.{node.name}` do?"
                yield f"{where}, docstring of {node.name}", doc, question


def _manual_passages(path: Path) -> Iterator[tuple[str, str, str]]:
    """(where, passage, question) for a man page's DESCRIPTION section: about one of its
    options where the passage lists one, else about the command."""
    lines = _read_manual(path).splitlines()
    try:
        start = lines.index("DESCRIPTION") + 1
    except ValueError:
        return
    end = next((i for i in range(start, len(lines)) if _SECTION.match(lines[i])), len(lines))
    text = clip("\n".join(lines[start:end]), 2400)
    if len(text) < 300:
        return
    name = path.name.removesuffix(".gz").rsplit(".", 1)[0]
    options = [m[1] for line in text.splitlines() if (m := _OPTION.match(line))]
    question = f"What does the option `{options[0]}` of `{name}` do?" if options else None
    yield f"{path}, section DESCRIPTION", text, question or f"What does `{name}` do?"


def document_prompts(
    count: int,
    *,
    task_dir: Path,
    seed: int = 0,
    root: Path | None = None,
    man_root: Path = MAN_ROOT,
) -> list[dict]:
    """``count`` prompts over documents, in the forms of the bench's summarization and RAG
    tasks, alternately: summarise a passage in two sentences, or answer a question about it
    from the passage alone. Passages are standard-library docstrings (a module's, or a
    public function's) and man pages' DESCRIPTION sections, at most about 2,400 characters
    of whole paragraphs; the files the task sets quote, tests and IDLE are left out. Records
    are ``{"kind": "summarization" | "rag", "prompt", "source"}`` for ``data regenerate``."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    excluded = task_files(Path(task_dir))
    found = [
        (where, clip(text, 2400), question)
        for path in stdlib_files(excluded, root)
        if not {"test", "tests", "idlelib"} & set(path.relative_to(root).parts)
        for where, text, question in _docstring_passages(path, root)
    ]
    rng = random.Random(seed)
    rng.shuffle(found)
    pages = man_files(excluded, seed, man_root)
    rng.shuffle(pages)
    # As many man pages as docstrings, read only as far as needed: reading all is minutes.
    manual: list[tuple[str, str, str]] = []
    for path in pages:
        if len(manual) >= (count + 1) // 2:
            break
        manual.extend(_manual_passages(path))
    docs = found[: count - min(len(manual), count // 2)]
    mixed = alternate(docs, manual)
    records = []
    for i, (where, text, question) in enumerate(mixed[:count]):
        kind = "summarization" if i % 4 < 2 else "rag"
        prompt = (
            SUMMARY_PROMPT.format(text=text)
            if kind == "summarization"
            else PASSAGE_PROMPT.format(text=text, question=question)
        )
        records.append({"kind": kind, "prompt": prompt, "source": where})
    return records


def alternate(first: list, second: list) -> list:
    """One of each in turn while both last, then the rest of the longer."""
    mixed = [item for pair in zip(first, second, strict=False) for item in pair]
    return mixed + first[len(mixed) // 2 :] + second[len(mixed) // 2 :]
