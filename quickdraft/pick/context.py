"""What the picker knows of a deployment (``PickContext``), what it assumes of one step of a
configuration (``StepPrior``), and how it sees a method (``PickSupport``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from quickdraft.config import SpecConfig
from quickdraft.pick.costs import REFERENCE


@dataclass(slots=True)
class PickContext:
    """What ``quickdraft pick`` knows of the deployment: the target and draft (aliases or
    paths), the device, folders the user gave (None: those shipped for the target, if any),
    where drafters are exported for other engines, and ``missing``: why a method offers no
    candidate (filled in by the candidate functions)."""

    target: str
    draft: str | None = None
    device: str = "cpu"
    eagle_dir: Path | None = None
    medusa_dir: Path | None = None
    shortlist_dir: Path | None = None
    export_dir: Path = Path("exported")
    missing: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepPrior:
    """One draft-and-verify step of a configuration, before measuring anything: expected
    tokens per target forward (accepted drafts + 1) on the task kind at ``temperature``; the
    drafter's and the verify pass's time, in target decode steps; the tokens the pass
    verifies; ``source``, the measurement the figures come from; and the target (alias) and
    weights it was measured on, whose steps the costs count (``pick.costs`` carries them to
    the deployment's)."""

    expected_tokens: float
    draft_cost: float
    verify_cost: float
    verified_tokens: int
    source: str
    temperature: float = 0.0
    target: str | None = REFERENCE
    weights: str = "float"


@dataclass(frozen=True, slots=True)
class PickSupport:
    """How ``quickdraft pick`` weighs a method.

    candidates: (context) -> [(label, spec)]: the configurations worth trying with what the
        context has (k values, tree shapes, shortlists, draft temperatures); [] when the method
        cannot run there, with the reason in ``context.missing[name]``.
    prior: (spec, task kind) -> StepPrior, for picking without measuring.
    chain: one calibration run at the largest k predicts every smaller k (chains of draft
        tokens, whose acceptance by position carries over); tree shapes are measured each.
    """

    candidates: Callable[[PickContext], list[tuple[str, SpecConfig]]]
    prior: Callable[[SpecConfig, str], StepPrior]
    chain: bool = False
