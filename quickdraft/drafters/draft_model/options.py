"""The draft_model method's options."""

from __future__ import annotations

from dataclasses import dataclass

from quickdraft.config import MethodOptions, check_flag, check_path, check_temperature, parse_field
from quickdraft.vocab.choice import FULL, ShortlistChoice


@dataclass(frozen=True, slots=True)
class DraftModelOptions(MethodOptions):
    """draft_temperature: the draft model's own sampling temperature; None means the
        target's. Any value keeps the output exact (the draft's probabilities are what the
        rule divides by); a cooler draft is often accepted more often.
    draft_shortlist: the draft model's head shortlist (``ShortlistChoice``: ``full``,
        ``fr:K``, ``dyna-pa:K``, ...); exact, the target always verifies over the full
        vocabulary.
    shortlist_dir: the folder of the shortlist's artifacts; None uses those shipped for the
        draft model.
    suffix_first: suffix decoding in front (``drafters.suffix.hybrid``): a step whose suffix
        draft is expected to beat this drafter's uses it alone. Exact like any draft.
    """

    draft_temperature: float | None = None
    draft_shortlist: ShortlistChoice = FULL
    shortlist_dir: str | None = None
    suffix_first: bool = False

    def __post_init__(self) -> None:
        check_flag("suffix_first", self.suffix_first)
        if self.draft_temperature is not None:
            check_temperature("draft_temperature", self.draft_temperature)
            object.__setattr__(self, "draft_temperature", float(self.draft_temperature))
        parse_field(self, "draft_shortlist", ShortlistChoice)
        check_path("shortlist_dir", self.shortlist_dir)
