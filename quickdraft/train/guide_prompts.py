"""Prompts over the Python documentation (``quickdraft data guide-prompts``): the FAQ's own
questions and requests to explain the tutorial's, HOWTOs' and library pages' sections, read
from the reST sources ``apt-get install python3.11-doc`` puts on disk. The bench's task sets
quote none of it; the library pages of modules they quote are left out all the same."""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path

from quickdraft.train.sources import alternate, task_files

PYTHON_DOCS = Path("/usr/share/doc/python3.11/html/_sources")
# Section underlines as the documentation writes them (not quotes: a docstring's """ in an
# example is no underline).
_UNDERLINE = re.compile(r"^([=\-~^*#+])\1{2,}$")
_ROLE = re.compile(r":[\w:]+:`[~!]?([^`<]*?)(?:\s*<[^>]*>)?`")
_MODULE = re.compile(r":mod:`[~!]?([\w.]+)`")
_GENERIC = {"introduction", "footnotes", "example", "examples", "notes", "see also", "overview",
            "summary", "references", "acknowledgements", "contents", "what now", "usage",
            "functions", "classes", "constants", "exceptions", "module contents"}  # fmt: skip
CHAT_FORMS = (
    "Can you explain {topic} in Python? Keep it short and give an example.",
    "I'm learning Python. What should I know about {topic}?",
    "How do I use {topic}? Show me a small example.",
)


def _plain(title: str) -> str:
    """A reST title as plain text: roles to their text, markup dropped, a subtitle after a
    dash cut off."""
    text = _ROLE.sub(r"\1", title).replace("``", "").replace("**", "")
    for dash in (" --- ", " -- ", " — "):
        text = text.split(dash)[0]
    return re.sub(r"\s+", " ", text).strip(" .:")


def _titles(path: Path) -> list[str]:
    """A reST page's section titles in order, as written: a line at the margin over an
    underline at the margin, one repeated punctuation character at least as long. Indented
    lines (examples, comments) are never titles."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return [
        line.strip()
        for line, under in itertools.pairwise(lines)
        if line.strip() and not line[:1].isspace() and not under[:1].isspace()
        and _UNDERLINE.match(under.rstrip()) and len(under.rstrip()) >= len(line.rstrip())
        and not _UNDERLINE.match(line.strip()) and not line.startswith("..")
    ]  # fmt: skip


def _topic(title: str) -> str:
    """A section title as the object of a sentence: an ordinary capitalised first word in
    lower case (names such as ArgumentParser or I/O keep theirs), no question mark."""
    text = _plain(title).rstrip("?")
    first = text.split(" ")[0]
    ordinary = first.isalpha() and (len(first) == 1 or first[1:].islower())
    return text[0].lower() + text[1:] if ordinary else text


def guide_prompts(
    count: int, *, task_dir: Path, seed: int = 0, root: Path = PYTHON_DOCS
) -> list[dict]:
    """``count`` questions over the Python documentation (``apt-get install python3.11-doc``):
    the FAQ's own questions asked as they are (kind ``qa``), and requests to explain a
    section of the tutorial, the HOWTOs or a library page in one of ``CHAT_FORMS`` (kind
    ``conversation``), alternately; generic sections (Introduction, Examples) are skipped and
    the library pages of modules the task sets in ``task_dir`` quote are left out. Records are
    ``{"kind", "prompt", "source"}`` for ``data regenerate``; a seeded shuffle picks them."""
    pages = sorted(root.rglob("*.rst.txt")) if root.is_dir() else []
    if not pages:
        raise ValueError(f"{root}: no Python documentation there (apt-get install "
                         "python3.11-doc)")  # fmt: skip
    quoted = {Path(p).parts[0].removesuffix(".py") for p in task_files(Path(task_dir)).stdlib}
    questions, topics = [], []
    for path in pages:
        where = path.relative_to(root).as_posix()
        titles = _titles(path)
        if not titles or where.removesuffix(".rst.txt").split("/")[-1] in quoted:
            continue
        if where.startswith("faq/"):
            questions += [(where, q) for t in titles if (q := _plain(t)).endswith("?")
                          and len(q) > 15]  # fmt: skip
        elif where.startswith(("tutorial/", "howto/", "library/")):
            module = _MODULE.search(titles[0])
            home = f"the {module[1]} module" if module else _topic(titles[0])
            topics.append((where, home))
            for title in titles[1:]:
                topic = _topic(title)
                if len(topic) > 3 and topic.lower() not in _GENERIC:
                    topics.append((where, f"{topic} in {home}" if module else topic))
    rng = random.Random(seed)
    rng.shuffle(questions)
    rng.shuffle(topics)
    asked = {q: {"kind": "qa", "prompt": q, "source": f"Doc/{w}"} for w, q in questions}
    chats: dict[str, dict] = {}
    for where, topic in topics:
        prompt = CHAT_FORMS[len(chats) % len(CHAT_FORMS)].format(topic=topic)
        chats.setdefault(prompt, {"kind": "conversation", "prompt": prompt,
                                  "source": f"Doc/{where}"})  # fmt: skip
    return alternate(list(asked.values()), list(chats.values()))[:count]
