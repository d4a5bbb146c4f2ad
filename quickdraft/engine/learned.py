"""What a goodput rule (``engine.goodput``) learns of the host and its drafter rather than of
any one request, kept per drafter object past its engine: the verify table's corrections, the
drafter's and a step's other seconds, drafted steps' bias, whether drafting pays and the
probes' wait. The next engine over the same drafter starts where the last one stopped, as a
long-lived engine's next request does."""

from __future__ import annotations

import bisect
import weakref
from dataclasses import dataclass, field

from quickdraft.drafters.base import Drafter
from quickdraft.engine.costs import VerifyCosts

COST_DECAY = 0.95  # per step: older cost measurements weigh less
BUCKETS = (1, 2, 4, 8, 12)  # verify widths corrected together: 1, 2-3, 4-7, 8-11, 12+
PROBE_EVERY = 8  # plain steps before the first probe, once drafting stopped paying


def bucket(tokens: float) -> int:
    """The index in ``BUCKETS`` of a verify pass over ``tokens`` tokens."""
    return max(bisect.bisect_right(BUCKETS, tokens) - 1, 0)


@dataclass(slots=True)
class DecayedLine:
    """A decayed least-squares line y = a + b x, with a, b >= 0."""

    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, x: float, y: float) -> None:
        decay = COST_DECAY
        self.w = self.w * decay + 1.0
        self.x = self.x * decay + x
        self.y = self.y * decay + y
        self.xx = self.xx * decay + x * x
        self.xy = self.xy * decay + x * y

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


@dataclass(slots=True)
class Learned:
    """What a rule learns of this host and its drafter rather than of any one request: kept
    past its engine (``learned``), so that the next engine over the same drafter and target
    starts where the last one stopped, as a long-lived engine's next request does (a server's
    engine never forgets them). A fresh one is optimistic: it drafts until shown otherwise."""

    costs: VerifyCosts  # the table these were learned against
    # The engine's verify steps against the measured table, per width (``bucket``): drift,
    # contention, a table measured on a busy machine; apart for steps after the drafter ran
    # (its work slows the target's pass after it: caches, threads).
    drift: dict[bool, list[float]] = field(
        default_factory=lambda: {ran: [1.0] * len(BUCKETS) for ran in (False, True)}
    )
    # A step's seconds besides drafting and verifying (committing, the drafter's observing),
    # against the tokens a row gained; apart for steps the drafter ran (its observing of a
    # verified draft, the walk and commit of a path cost more than a plain step's: 0.55-0.95
    # ms against 0.4 on SmolLM2-135M).
    other: dict[bool, DecayedLine] = field(
        default_factory=lambda: {False: DecayedLine(), True: DecayedLine()}
    )
    # A drafter's seconds: against k for one that shortens; else against the tokens it
    # catches up with (what the rows gained since it last drafted: EAGLE and a draft
    # model read them when they next draft), whose intercept is the draft itself.
    draft: DecayedLine = field(default_factory=DecayedLine)
    # Drafted steps' real seconds against what the rule predicted for them (decayed): what
    # the model of their parts misses (a tree's depth in its draft time, attention over a
    # longer context than the table's, the caches a draft leaves cold), applied to the
    # predicted seconds of a drafted step. Measured on SmolLM2-135M (AVX2 code, EAGLE alone):
    # 1.14-1.25 before it was applied.
    bias: float = 1.0
    # Recent drafts' expected rate against plain decoding's (decayed): above 1, drafting
    # goes on.
    advantage: float = 1.1
    drafting: bool = True  # whether the last decision found drafting pays
    idle: int = 0  # steps since the drafter last ran
    wait: int = PROBE_EVERY  # plain steps before the next probe
    backoff: int = PROBE_EVERY  # the wait failed probes earned (a join may probe sooner)
    probe: float = 0.0  # a probe's seconds beyond plain decoding's for its tokens (decayed)
    landed: float = 0.5  # the share of probes whose tokens came as fast as plain ones (decayed)


# Per drafter object: what engines over it learned (``learned``).
_LEARNED: weakref.WeakKeyDictionary[Drafter, Learned] = weakref.WeakKeyDictionary()


def learned(drafter: Drafter, costs: VerifyCosts) -> Learned:
    """What earlier engines over ``drafter`` learned against ``costs`` (the target's table),
    to go on from; a fresh record for a new drafter or another target."""
    try:
        known = _LEARNED.get(drafter)
    except TypeError:  # a drafter that takes no weak reference: nothing is kept
        return Learned(costs)
    if known is None or known.costs is not costs:
        known = _LEARNED[drafter] = Learned(costs)
    return known
