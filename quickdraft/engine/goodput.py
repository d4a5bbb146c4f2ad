"""Adaptive draft length: each step drafts the k that maximises expected goodput.

Goodput is tokens per second: ``sum_r E_r(k) / (draft(k) + verify(B * (k + 1)))``, where a
running request r accepts each next draft token with probability ``alpha_r`` (its own running
acceptance, a geometric model as in the speculative decoding papers), so a verify of k drafts
gives it ``E_r(k) = (1 - alpha_r^(k+1)) / (1 - alpha_r)`` tokens, and the costs are what this
engine's last steps measured: a line through the verify pass's seconds against the tokens it
held, and through the drafter's seconds against k. k = 0 is plain decoding: no draft, a
one-token pass. A request whose drafts keep failing drives its alpha towards 0; when no k beats
plain decoding for the batch, the step drafts nothing, and every ``PROBE_EVERY`` such steps
one short draft (``PROBE_K``) checks whether drafting pays again.

One k serves the whole batch: the verify pass is one padded [B, k + 1] forward, so a row
drafting less than its neighbours would save no arithmetic; the rule weighs every request's
acceptance instead. Exactness does not depend on k (any prefix of a draft is a draft), and
each request's ``Stats.drafted`` records the k its steps used.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from quickdraft.drafters.base import Batch, Draft, Drafter

DECAY = 0.9  # per step a request drafts: its older evidence weighs less
COST_DECAY = 0.95  # per step: older cost measurements weigh less
PROBE_EVERY = 8
PROBE_K = 2
PRIOR = 1.0  # pseudo-counts of accepted and rejected drafts a request starts with


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a verify of k chained drafts gives at acceptance alpha (the bonus included)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass(slots=True)
class _Line:
    """A decayed least-squares line y = a + b x, with a, b >= 0."""

    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, x: float, y: float) -> None:
        for name in ("w", "x", "y", "xx", "xy"):
            setattr(self, name, getattr(self, name) * COST_DECAY)
        self.w += 1.0
        self.x += x
        self.y += y
        self.xx += x * x
        self.xy += x * y

    def spread(self) -> float:
        """Variance of the x seen (0 while every point had the same x)."""
        return self.xx / self.w - (self.x / self.w) ** 2 if self.w else 0.0

    def __call__(self, x: float) -> float:
        if not self.w:
            return 0.0
        mean_x, mean_y = self.x / self.w, self.y / self.w
        if self.spread() <= 1e-9 * max(1.0, mean_x * mean_x):
            return mean_y * x / mean_x if mean_x else mean_y  # one x seen: proportional
        slope = max(0.0, (self.xy / self.w - mean_x * mean_y) / self.spread())
        return max(0.0, mean_y - slope * mean_x) + slope * x


class GoodputRule:
    """Chooses each step's k (0..max_k) for the requests in ``slots``; ``update`` after the
    step with what it drafted, accepted and cost."""

    @classmethod
    def for_drafter(cls, drafter: Drafter, rows: int) -> GoodputRule:
        """The rule for ``drafter`` over ``rows`` slots; ValueError for a drafter whose drafts
        cannot be cut short between steps (``Needs.shortens``)."""
        if not drafter.needs.shortens:
            raise ValueError(
                f"adaptive_k: {type(drafter).__name__} cannot cut its drafts short between "
                "steps; use it with draft_model, ngram or suffix"
            )
        return cls(drafter.needs.depth, rows)

    def __init__(self, max_k: int, rows: int):
        self.max_k = max_k
        self.accepted = [PRIOR] * rows
        self.rejected = [PRIOR] * rows
        self.verify = _Line()
        self.draft = _Line()
        self.idle = 0  # steps in a row that drafted nothing
        self.drafted = self.plain = False  # a step of each kind seen

    def begin(self, slots: list[int]) -> None:
        """New requests took these slots: they start from the prior."""
        for slot in slots:
            self.accepted[slot] = self.rejected[slot] = PRIOR

    def propose(self, drafter: Drafter, batch: Batch) -> Draft:
        """The drafter's draft at this step's k (``Batch.limit``); k = 0 drafts nothing."""
        k = self.choose(batch.slots.host)
        if k == 0:
            return Draft.empty(batch.size, batch.tokens.device)
        return drafter.propose(dataclasses.replace(batch, limit=k)).cut(k)

    def alpha(self, slot: int) -> float:
        accepted = self.accepted[slot]
        return accepted / (accepted + self.rejected[slot])

    def choose(self, slots: list[int]) -> int:
        # Until the verify cost has been seen with a draft and without one, try each.
        if not self.drafted:
            return self.max_k
        if not self.plain:
            return 0
        rows = len(slots)
        alphas = [self.alpha(slot) for slot in slots]
        best, best_rate = 0, 0.0
        for k in range(self.max_k + 1):
            seconds = self.verify(rows * (k + 1)) + (self.draft(k) if k else 0.0)
            gained = sum(expected_tokens(a, k) for a in alphas)
            rate = gained / seconds if seconds > 0 else float(k)
            if rate > best_rate:
                best, best_rate = k, rate
        if best == 0 and self.idle >= PROBE_EVERY:
            return min(PROBE_K, self.max_k)
        return best

    def update(
        self,
        slots: list[int],
        drafted: int,
        accepted: list[int],
        draft_seconds: float,
        verify_seconds: float,
    ) -> None:
        """A step verified ``drafted`` draft positions for the rows in ``slots`` (the draft's
        depth), which accepted ``accepted`` of them."""
        self.verify.add(len(slots) * (drafted + 1), verify_seconds)
        if drafted == 0:
            self.idle += 1
            self.plain = True
            return
        self.idle = 0
        self.drafted = True
        self.draft.add(drafted, draft_seconds)
        for slot, count in zip(slots, accepted, strict=True):
            self.accepted[slot] = self.accepted[slot] * DECAY + count
            self.rejected[slot] = self.rejected[slot] * DECAY + (count < drafted)
