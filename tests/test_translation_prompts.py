"""``quickdraft data translation-prompts``: the Debian Reference's German and French
paragraphs as the bench's translation prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quickdraft.train.translation_prompts import DEBIAN_REFERENCE, PROMPT, translation_prompts

PROSE = "Ein Absatz über Pakete, der lang genug ist, um übersetzt zu werden: {0}. " * 3


def page(*paragraphs: str) -> str:
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return f"<html><body><div class='section'>{body}</div></body></html>"


@pytest.fixture
def reference(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "debian-reference"
    root.mkdir()
    german = [PROSE.format(n) for n in range(3)]
    (root / "ch01.de.html").write_text(page(
        german[0],
        "Zu kurz.",
        f"{german[1]}<pre>apt-get install foo</pre>",  # a listing: not prose
        f"{german[2]}\n   <em>hervorgehoben</em>",
        german[0],  # the same paragraph twice is asked once
    ))  # fmt: skip
    french = PROSE.replace("Ein Absatz über Pakete", "Un paragraphe sur les paquets")
    (root / "ch01.fr.html").write_text(page(french.format("a"), french.format("b")))
    (root / "ch01.en.html").write_text(page(PROSE.format("english")))  # never asked
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    quoted = {"prompt": PROMPT.format(text=french.format("b"))}
    (tasks / "translation.jsonl").write_text(json.dumps(quoted) + "\n")
    return root, tasks


def test_paragraphs_of_the_bench_form_alternate_by_language(reference):
    """German and French paragraphs of the bench's lengths, in the bench's own prompt form, one
    language after the other; too short, a listing, a repeat, an English page and a paragraph a
    task set quotes are left out; the same for the same seed."""
    root, tasks = reference
    prompts = translation_prompts(10, task_dir=tasks, seed=1, root=root)
    assert [p["kind"] for p in prompts] == ["translation"] * 3
    assert [p["source"] for p in prompts] == [
        "debian-reference ch01.de.html",
        "debian-reference ch01.fr.html",
        "debian-reference ch01.de.html",
    ]
    texts = [p["prompt"] for p in prompts]
    assert all(t.startswith("Translate into English:\n\n") and t.endswith("\n\nEnglish:")
               for t in texts)  # fmt: skip
    assert "hervorgehoben" in texts[0] + texts[2] and "  " not in "".join(texts)
    assert not any("apt-get" in t or "Zu kurz" in t or ": b." in t for t in texts)
    assert translation_prompts(10, task_dir=tasks, seed=1, root=root) == prompts
    assert translation_prompts(2, task_dir=tasks, seed=1, root=root) == prompts[:2]


def test_a_missing_reference_names_its_package(reference, tmp_path):
    root, tasks = reference
    (root / "ch01.fr.html").unlink()
    with pytest.raises(ValueError, match=r"apt-get install debian-reference-fr"):
        translation_prompts(1, task_dir=tasks, root=root)
    with pytest.raises(ValueError, match=r"debian-reference-de"):
        translation_prompts(1, task_dir=tasks, root=tmp_path / "missing")


def test_the_command_writes_them(tmp_path):
    from quickdraft.cli import main

    out = tmp_path / "translation.jsonl"
    if not any(DEBIAN_REFERENCE.glob("*.de.html")) or not any(DEBIAN_REFERENCE.glob("*.fr.html")):
        assert main(["data", "translation-prompts", "--out", str(out), "--count", "4"]) != 0
        return
    assert main(["data", "translation-prompts", "--out", str(out), "--count", "4"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4 and {r["kind"] for r in records} == {"translation"}
