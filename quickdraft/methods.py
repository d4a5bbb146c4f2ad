"""The method registry: one entry per way of drafting, read by config validation, the CLI, the
bench and the picker. Adding a method is one module with its drafter and one ``register`` call.

This module imports no drafter (so ``config.py``, which validates against it, does not either):
the built-in entries live in ``drafters/registry.py``, imported the first time an entry is
looked up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quickdraft.config import SpecConfig
    from quickdraft.drafters.base import Drafter
    from quickdraft.interop.launch import EngineConfig
    from quickdraft.models.base import Model


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What a builder may use besides the spec: the target, a draft model (methods that
    declare ``draft_model``), whether the draft's tokenizer is the target's (None: unknown),
    and the aliases that find shipped artifacts."""

    target: Model
    draft: Model | None = None
    same_tokenizer: bool | None = None
    draft_name: str | None = None
    target_name: str | None = None


@dataclass(slots=True)
class PickContext:
    """What ``quickdraft pick`` knows of the deployment: the target and draft (aliases or
    paths), the device, folders the user gave (None: those shipped for the target, if any),
    where drafters are exported for other engines, and ``missing``: why a method offers no
    candidate (filled in by the hooks)."""

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
    verifies; and ``source``, the measurement the figures come from."""

    expected_tokens: float
    draft_cost: float
    verify_cost: float
    verified_tokens: int
    source: str
    temperature: float = 0.0


@dataclass(frozen=True, slots=True)
class PickSupport:
    """How ``quickdraft pick`` weighs a method.

    candidates: (context) -> [(label, spec)]: the configurations worth trying with what the
        context has (k values, tree shapes, shortlists, draft temperatures); [] when the method
        cannot run there, with the reason in ``context.missing[name]``.
    prior: (spec, task kind) -> StepPrior, for picking without measuring.
    engines: (spec, context) -> the config each other serving engine takes for it
        (``quickdraft.interop.launch``): vLLM's speculative_config, SGLang's flags, or why not.
    chain: one calibration run at the largest k predicts every smaller k (chains of draft
        tokens, whose acceptance by position carries over); tree shapes are measured each.
    """

    candidates: Callable[[PickContext], list[tuple[str, SpecConfig]]]
    prior: Callable[[SpecConfig, str], StepPrior]
    engines: Callable[[SpecConfig, PickContext], list[EngineConfig]] | None = None
    chain: bool = False


def k_label(name: str, text: str, k: int | None, default_k: int) -> tuple[str, dict[str, Any]]:
    """The usual bench label, ``name[@K]``: k from the label, else ``k``, else the default."""
    try:
        chosen = int(text) if text else (default_k if k is None else k)
    except ValueError:
        raise ValueError(f"the number after @ must be an integer, got {text!r}") from None
    return f"{name} k={chosen}", {"num_speculative_tokens": chosen}


@dataclass(frozen=True, slots=True)
class MethodEntry:
    """One method.

    name:        its name in SpecConfig.method, the CLI's --method and bench labels.
    description: one line for --help and the docs.
    build:       (spec, context) -> the drafter (None only for plain decoding).
    default_k:   draft tokens per step when none is given (bench labels, the CLI).
    options:     the SpecConfig fields only this method reads; setting one for another method
                 is an error naming it.
    check:       validates this method's options in a SpecConfig (raises ValueError).
    parse_label: (text after the name, k) -> (bench label, SpecConfig fields), for bench
                 method lists such as ``eagle@6.4.10p0.1+5``; by default ``name[@K]``.
    describe:    (spec, drafter) -> a short description of the draft's shape, for the CLI.
    draft_model: whether the method drafts with a separate draft model (--draft).
    drafts:      False for plain decoding: no drafter is built (a draft model given is unused).
    head_rows:   (drafter, target) -> the vocabulary rows its head scores a draft token
                 (bench reports; 0 for a drafter with no head, None when unknown).
    pick:        how ``quickdraft pick`` considers it (``PickSupport``); None: never picked.
    """

    name: str
    description: str
    build: Callable[[SpecConfig, BuildContext], Drafter | None]
    default_k: int = 4
    options: tuple[str, ...] = ()
    check: Callable[[SpecConfig], None] | None = None
    parse_label: Callable[[str, int | None], tuple[str, dict[str, Any]]] | None = None
    describe: Callable[[SpecConfig, Any], str] | None = None
    draft_model: bool = False
    drafts: bool = True
    head_rows: Callable[[Any, Model], int | None] | None = None
    pick: PickSupport | None = None

    def label(self, text: str, k: int | None) -> tuple[str, dict[str, Any]]:
        if self.parse_label is not None:
            return self.parse_label(text, k)
        return k_label(self.name, text, k, self.default_k)

    def shape(self, spec: SpecConfig, drafter: Any) -> str:
        return self.describe(spec, drafter) if self.describe is not None else f"k={spec.k}"


_REGISTRY: dict[str, MethodEntry] = {}
_BUILT_INS = "quickdraft.drafters.registry"


def register(entry: MethodEntry) -> None:
    """Add a method (replacing one of the same name: a re-run notebook cell, say)."""
    if not entry.name or not entry.name.replace("_", "").isalnum():
        raise ValueError(f"method name must be letters, digits and _, got {entry.name!r}")
    _REGISTRY[entry.name] = entry


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def _load_built_ins() -> None:
    importlib.import_module(_BUILT_INS)  # registers them on import


def names() -> tuple[str, ...]:
    _load_built_ins()
    return tuple(_REGISTRY)


def get(name: Any) -> MethodEntry:
    """The entry of ``name``; a ValueError listing the methods when there is none."""
    _load_built_ins()
    entry = _REGISTRY.get(str(name)) if isinstance(name, str) else None
    if entry is None:
        shown = repr(name) if isinstance(name, str) else type(name).__name__
        raise ValueError(f"method must be one of {', '.join(_REGISTRY)}; got {shown}")
    return entry


def entries() -> tuple[MethodEntry, ...]:
    _load_built_ins()
    return tuple(_REGISTRY.values())
