"""Suffix decoding in front of a model drafter (EAGLE or a draft model), decided each step.

SuffixDecoding's hybrid: a step whose suffix draft is expected to give at least as many tokens
as the model drafter's draft uses the suffix draft alone and skips the model's network; any
other step drafts with the model. The suffix proposal's score is its expected accepted length
under the tries' counts (the sum of its nodes' probabilities), which a match seen once or
twice overstates; scores are scaled by what suffix drafts have been accepted per unit of score
(a running ratio, ``calibration``). The model's expected length is what its drafts gave on the
steps it drafted, a running mean. Both drafters follow every step (``observe``),
so each stays in step with the text whichever drafted: EAGLE keeps the target's features of
every kept token, a draft model re-reads what its cache lacks. A batch drafts one shape, so it
takes the suffix draft only where every row's beats the model's.
"""

from __future__ import annotations

import dataclasses

import torch

from quickdraft.drafters.base import Batch, Draft, Drafter, StepResult
from quickdraft.drafters.suffix.drafter import SuffixDrafter

# The model's expected accepted drafts before it has drafted: a suffix draft needs about this
# much evidence to go first.
PRIOR = 1.5
CALIBRATION = 0.6  # suffix drafts' accepted tokens per unit of score, before any is seen
DECAY = 0.9  # weight of the running mean's past
SUFFIX_K = 8  # the suffix method's default k


def suffix_first(model: Drafter, num_tokens: int = SUFFIX_K) -> SuffixFirst:
    """``model`` with suffix decoding in front, at the suffix method's defaults."""
    return SuffixFirst(model, SuffixDrafter(model.vocab_size, num_tokens))


class SuffixFirst:
    """``model`` drafts unless ``suffix``'s draft is expected to do at least as well."""

    def __init__(self, model: Drafter, suffix: SuffixDrafter):
        if suffix.vocab_size != model.vocab_size:
            raise ValueError("suffix: its vocabulary differs from the model drafter's")
        self.model, self.suffix = model, suffix
        self.vocab_size = model.vocab_size
        needs = model.needs
        self.needs = dataclasses.replace(
            needs,
            tokens=max(needs.tokens, suffix.needs.tokens),
            depth=max(needs.depth, suffix.needs.depth),
            pooled=True,
        )
        self.shortlist = getattr(model, "shortlist", None)
        self.expected = PRIOR
        self.calibration = CALIBRATION
        self._score = 0.0  # the mean score of the suffix draft this step verifies
        self.steps = {"suffix": 0, "model": 0}
        self._last: str | None = None  # who drafted the step being verified

    @property
    def head_rows(self) -> int | None:
        return self.model.head_rows

    def describe(self) -> str:
        return f"suffix decoding ({self.suffix.describe()}) when it beats {self.model.describe()}"

    def reserve(self, rows: int, capacity: int) -> None:
        self.model.reserve(rows, capacity)
        self.suffix.reserve(rows, capacity)

    def resumable(self) -> torch.Tensor:
        return self.model.resumable()  # type: ignore[attr-defined]  # as Needs.resumes says

    def begin(self, start: StepResult) -> None:
        self.model.begin(start)
        self.suffix.begin(start)

    def propose(self, batch: Batch) -> Draft:
        if batch.text_only:  # the model's text draft (EAGLE's lookup: Needs.text_draft)
            return self.model.propose(batch)
        found = self.suffix.proposals(batch)
        if all(p.tokens and p.score * self.calibration >= self.expected for p in found):
            self._last = "suffix"
            self._score = sum(p.score for p in found) / len(found)
            self.steps["suffix"] += 1
            return self.suffix.draft(batch, found)
        self._last = "model"
        self.steps["model"] += 1
        return self.model.propose(batch)

    def observe(self, result: StepResult) -> None:
        if result.accepted is not None and self._last is not None:
            mean = float(result.accepted.float().mean())
            if self._last == "model":
                self.expected = DECAY * self.expected + (1 - DECAY) * mean
            elif self._score > 0:
                ratio = mean / self._score
                self.calibration = DECAY * self.calibration + (1 - DECAY) * ratio
        self._last = None  # a step the batch policy leaves undrafted teaches nothing
        self.model.observe(result)
        self.suffix.observe(result)

    def release(self, slot: int, completed: bool) -> None:
        self.model.release(slot, completed)
        self.suffix.release(slot, completed)

    def gauges(self) -> dict[str, float]:
        return {
            **self.suffix.gauges(),
            "suffix_first_steps": self.steps["suffix"],
            "suffix_first_model_steps": self.steps["model"],
        }
