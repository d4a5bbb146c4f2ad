"""Translation prompts (``quickdraft data translation-prompts``): the Debian Reference's German
and French paragraphs to put into English, in the form of the bench's translation task. The
bench's translation items quote man pages (their DESCRIPTION sections); the Debian Reference
(``apt-get install debian-reference-de debian-reference-fr``) is another text by other
authors, so no prompt here is one of the bench's or near it, and any paragraph a task set
quotes word for word is left out all the same."""

from __future__ import annotations

import json
import random
import re
from html.parser import HTMLParser
from pathlib import Path

from quickdraft.train.sources import alternate

DEBIAN_REFERENCE = Path("/usr/share/debian-reference")
LANGUAGES = {"de": "German", "fr": "French"}
# The bench's own translation prompts quote 157-632 characters: paragraphs of that length.
MIN_CHARS, MAX_CHARS = 150, 650
PROMPT = "Translate into English:\n\n{text}\n\nEnglish:"
_SPACE = re.compile(r"\s+")


class _Paragraphs(HTMLParser):
    """The text of a page's ``<p>`` elements, whitespace folded; paragraphs holding a code
    listing or a table are dropped (their text is not prose to translate)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._open = 0
        self._code = False
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "p":
            self._open += 1
            self._text, self._code = [], False
        elif tag in ("pre", "table") and self._open:
            self._code = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "p" and self._open:
            self._open -= 1
            if not self._code:
                self.found.append(_SPACE.sub(" ", "".join(self._text)).strip())

    def handle_data(self, data: str) -> None:
        if self._open:
            self._text.append(data)


def paragraphs(page: Path) -> list[str]:
    parser = _Paragraphs()
    parser.feed(page.read_text(encoding="utf-8", errors="replace"))
    return parser.found


def _quoted(task_dir: Path) -> str:
    """Every prompt of the task sets in ``task_dir``, one string to search."""
    prompts = []
    for file in sorted(Path(task_dir).glob("*.jsonl")):
        for line in file.read_text(encoding="utf-8").splitlines():
            if line.strip():
                prompts.append(str(json.loads(line).get("prompt", "")))
    return "\n".join(prompts)


def translation_prompts(
    count: int, *, task_dir: Path, seed: int = 0, root: Path = DEBIAN_REFERENCE
) -> list[dict]:
    """``count`` requests to translate a German or French paragraph of the Debian Reference
    into English (``PROMPT``, the bench's form), the two languages alternately, each
    paragraph once; paragraphs outside the bench's lengths, or quoted by a task set in
    ``task_dir``, are left out. Records are ``{"kind": "translation", "prompt", "source"}`` for
    ``data regenerate``; a seeded shuffle picks them."""
    quoted = _quoted(task_dir)
    rng = random.Random(seed)
    by_language = []
    for code in LANGUAGES:
        pages = sorted(root.glob(f"*.{code}.html")) if root.is_dir() else []
        if not pages:
            raise ValueError(f"{root}: no {LANGUAGES[code]} Debian Reference there (apt-get "
                             f"install debian-reference-{code})")  # fmt: skip
        seen: dict[str, dict] = {}
        for page in pages:
            for text in paragraphs(page):
                if MIN_CHARS <= len(text) <= MAX_CHARS and text not in quoted:
                    seen.setdefault(text, {"kind": "translation",
                                           "prompt": PROMPT.format(text=text),
                                           "source": f"debian-reference {page.name}"})  # fmt: skip
        records = list(seen.values())
        rng.shuffle(records)
        by_language.append(records)
    german, french = by_language
    return alternate(german, french)[:count]
