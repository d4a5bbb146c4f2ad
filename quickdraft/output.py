"""What ``generate`` and ``generate_batch`` return."""

from __future__ import annotations

from dataclasses import dataclass

from quickdraft.stats import Stats


@dataclass(frozen=True, slots=True)
class Generation:
    """One prompt's output. from_draft[i] says whether token i was a draft token the target
    accepted (True) or the target's own corrected, bonus or plain token (False)."""

    token_ids: list[int]
    text: str | None
    finish_reason: str  # "stop" (stop token or string) or "length" (max_new_tokens)
    from_draft: list[bool]
    stats: Stats


@dataclass(frozen=True, slots=True)
class BatchGeneration:
    """A batch's outputs, row by row, with the statistics of the whole batch."""

    token_ids: list[list[int]]
    texts: list[str] | None
    finish_reasons: list[str]
    from_draft: list[list[bool]]
    stats: Stats
