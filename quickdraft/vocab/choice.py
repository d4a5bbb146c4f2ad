"""Which shortlist a drafter head scores: the ``draft_shortlist`` option, parsed once.

``full`` scores every row; ``KIND:K`` names a kind and its size (``fr:38818``, ``dyna-pa:4``):
FR-Spec's most frequent K tokens (``fr``, ``fr-pa`` position-aware), or DynaSpec's K routed
clusters (``dyna``, ``dyna-pa``; ``dyna-hybrid`` adds the sequence's own tokens). What each
kind builds is ``vocab.build_shortlist``'s; this module only reads and writes the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from quickdraft.config import parsed, show_value

KINDS = ("full", "fr", "fr-pa", "dyna", "dyna-pa", "dyna-hybrid", "dyna-hybrid-pa")
# DynaSpec kinds may route no cluster at all (K = 0: the always-kept core alone).
_ZERO_ALLOWED = ("dyna", "dyna-hybrid")


@dataclass(frozen=True, slots=True)
class ShortlistChoice:
    """kind: one of ``KINDS``; size: K (0 for ``full``). ``parse(str(x)) == x``."""

    kind: str = "full"
    size: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"draft_shortlist: unknown kind {show_value(self.kind)}; choose from "
                f"{', '.join(KINDS)}"
            )
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size >= 10**9:
            raise ValueError(
                f"draft_shortlist: size must be an integer below 10**9, got {show_value(self.size)}"
            )
        if self.kind == "full" and self.size:
            raise ValueError("draft_shortlist: 'full' takes no size")
        if self.kind != "full" and self.size < (0 if self.kind in _ZERO_ALLOWED else 1):
            raise ValueError(
                f"draft_shortlist: {self.kind}:{self.size} needs a positive size, as in "
                f"'{self.kind}:32'"
            )

    @classmethod
    def parse(cls, text: str) -> ShortlistChoice:
        """``full`` or ``KIND:K``; a ValueError naming ``draft_shortlist`` otherwise."""
        if not isinstance(text, str):
            raise ValueError(f"draft_shortlist must be a string, got {show_value(text)}")
        kind, colon, size = text.partition(":")
        if kind not in KINDS:
            raise ValueError(
                f"draft_shortlist: unknown kind {show_value(kind)}; choose from {', '.join(KINDS)}"
            )
        if kind == "full":
            if colon:
                raise ValueError("draft_shortlist: 'full' takes no size")
            return cls()
        if not re.fullmatch(r"[0-9]{1,9}", size):  # ASCII digits only, no spaces, capped
            raise ValueError(
                f"draft_shortlist: {show_value(text)} needs a positive size in ASCII digits, "
                f"as in '{kind}:32'"
            )
        return cls(kind, int(size))

    def __str__(self) -> str:
        return self.kind if self.kind == "full" else f"{self.kind}:{self.size}"

    @property
    def full(self) -> bool:
        return self.kind == "full"


FULL = ShortlistChoice()


def as_shortlist(value: ShortlistChoice | str) -> ShortlistChoice:
    """A shortlist as given: the parsed choice, or its text."""
    return parsed("draft_shortlist", value, ShortlistChoice)
