"""Follow-up prompts over a target's own chats (``quickdraft data followups``): a second user
turn after a reply ``data regenerate`` wrote, so the target answers again with its own first
reply as context.

Why: the prompt sources on disk run out (every standard-library function with a docstring, every
man page and documentation section has been asked), while drafters keep gaining from more of
the target's replies, and a conversation's later turns are what chat traffic is made of. A
follow-up reply is new text in the target's own style, conditioned on a context no single-turn
prompt gives (its own earlier answer). The forms are the requests users make next, by the
first turn's kind: tests or an explanation after code, a shorter version after a summary,
the supporting sentence after an answer from a passage.

Records are ``{"kind", "messages": [user, assistant, user], "source"}``; ``data regenerate``
answers them and marks its reply (``reply_turn``), so training scores only the new reply.
Chats longer than ``max_chars`` are skipped: the first exchange plus the reply must fit a
training sequence (``train eagle --max-tokens``, 512 by default).
"""

from __future__ import annotations

import random
from pathlib import Path

from quickdraft.train.corpus import jsonl_objects
from quickdraft.train.replies import in_turn

# By the first turn's kind (before ``/generated``); other kinds take the conversation forms.
FORMS: dict[str, tuple[str, ...]] = {
    "code": (
        "Write a few pytest tests for it.",
        "Explain how it works, step by step.",
        "Add type hints and a short docstring to it.",
        "What edge cases does it miss? Fix them.",
        "Can you make it shorter or clearer? Say what you changed.",
        "Show an example of calling it, with the output.",
    ),
    "summarization": (
        "Now say it in one sentence.",
        "Turn that into three bullet points.",
        "What is the most important point, and why?",
        "Explain it to someone new to the topic.",
    ),
    "rag": (
        "Which part of the passage supports that?",
        "What else does the passage say about it?",
        "Answer again in one short sentence.",
        "Is there anything the passage leaves unclear?",
    ),
    "math": (
        "Can you check the answer another way?",
        "Explain the steps more simply.",
    ),
    "translation": (
        "Now translate the same text into French.",
        "Explain two of your word choices.",
    ),
    "conversation": (
        "Can you give another example?",
        "What are common mistakes with this?",
        "Summarize that in three bullet points.",
        "Why does it work that way?",
        "How would I do that in a real project?",
    ),
}
FORMS["stdlib"] = FORMS["code"]
FORMS["qa"] = FORMS["conversation"]


def followup_prompts(
    replies: list[Path], count: int, *, seed: int = 0, max_chars: int = 1200
) -> list[dict]:
    """Up to ``count`` follow-up prompts, one per chat of ``replies`` (files ``data
    regenerate`` wrote: one user turn and the reply), kinds in turn and a seeded choice of
    chats and forms. Chats of more than ``max_chars`` characters, or not one user turn and
    one reply, are skipped."""
    by_kind: dict[str, list[dict]] = {}
    for path in replies:
        if not path.is_file():
            raise ValueError(f"replies: {path} is not a file")
        for number, record in jsonl_objects(path, "replies"):
            turns = record.get("messages")
            if not (isinstance(turns, list) and len(turns) == 2):
                continue
            if not all(isinstance(t, dict) and isinstance(t.get("content"), str) for t in turns):
                continue  # not text turns (null content, content parts): not a reply of ours
            if [t.get("role") for t in turns] != ["user", "assistant"]:
                continue
            if not turns[1]["content"].strip():
                continue
            if sum(len(t["content"]) for t in turns) > max_chars:
                continue
            kind = str(record.get("kind", "conversation")).split("/")[0]
            by_kind.setdefault(kind, []).append(
                {"kind": kind, "turns": turns, "source": f"{path.name}:{number}"}
            )
    if not by_kind:
        raise ValueError(
            f"replies: no chat of one user turn and one reply within {max_chars:,} characters "
            f"in {', '.join(str(p) for p in replies)}"
        )
    rng = random.Random(seed)
    for kind in sorted(by_kind):
        rng.shuffle(by_kind[kind])
    records = []
    for chat in in_turn(by_kind)[:count]:
        form = rng.choice(FORMS.get(chat["kind"], FORMS["conversation"]))
        records.append({
            "kind": chat["kind"],
            "messages": [*chat["turns"], {"role": "user", "content": form}],
            "source": f"follow-up to {chat['source']}",
        })  # fmt: skip
    return records
