"""Drafters, one module per method, built from a SpecConfig through the method registry
(``quickdraft.methods``; the built-in entries are in ``drafters.registry``)."""

from __future__ import annotations

from quickdraft import methods
from quickdraft.config import Method, SpecConfig
from quickdraft.drafters.base import Batch, Draft, Drafter, Needs, StepResult
from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
from quickdraft.drafters.eagle.drafter import EagleDrafter
from quickdraft.drafters.lookahead import LookaheadDrafter
from quickdraft.drafters.medusa.drafter import MedusaDrafter
from quickdraft.drafters.ngram import NGramDrafter
from quickdraft.models.base import Model, Tokenizer
from quickdraft.models.tokenizer import HFTokenizer


def build_drafter(
    spec: SpecConfig,
    target: Model,
    draft: Model | None = None,
    *,
    same_tokenizer: bool | None = None,
    draft_name: str | None = None,
    target_name: str | None = None,
) -> Drafter | None:
    """The drafter for ``spec.method``, or None for plain autoregressive decoding.

    same_tokenizer: whether the draft's tokenizer equals the target's, when the caller knows
    (``HFTokenizer.same_vocabulary``); it lets padded vocabulary sizes differ.
    draft_name: the draft model's alias, which finds the shortlist artifacts shipped for it.
    target_name: the target's alias, which finds the Medusa heads and EAGLE drafter shipped
    for it; None takes the alias the target was loaded from (``Model.name``).
    """
    entry = methods.get(spec.method)
    if not entry.drafts:
        return None
    if draft is not None and not entry.draft_model:
        raise ValueError(f"draft: method {entry.name} drafts without a draft model")
    context = methods.BuildContext(
        target,
        draft,
        same_tokenizer,
        draft_name or (draft.name if draft is not None else None),
        target_name or target.name,
    )
    return entry.build(spec, context)


def same_vocabulary(a: Tokenizer, b: Tokenizer) -> bool:
    """Whether two tokenizers map text to the same ids (padded model vocabularies may differ)."""
    if a is b:
        return True
    if isinstance(a, HFTokenizer) and isinstance(b, HFTokenizer):
        return a.same_vocabulary(b)
    return False


def drafter_for(
    target: Model,
    spec: SpecConfig | None,
    draft: Model | Drafter | None,
    tokenizer: Tokenizer | None = None,
    draft_tokenizer: Tokenizer | None = None,
) -> tuple[Drafter | None, SpecConfig]:
    """(the drafter ``spec`` asks for, the spec) for ``generate``'s arguments: a drafter given
    as ``draft`` is used as it is; no spec means plain decoding, or draft-model speculation
    when a draft model is given."""
    if spec is None:
        spec = SpecConfig(method=Method.AR if draft is None else Method.DRAFT_MODEL)
    if draft is not None and not isinstance(draft, Model):
        return draft, spec
    same = None
    if tokenizer is not None and draft_tokenizer is not None:
        same = same_vocabulary(tokenizer, draft_tokenizer)
    return build_drafter(spec, target, draft, same_tokenizer=same), spec


__all__ = [
    "Batch",
    "Draft",
    "DraftModelDrafter",
    "Drafter",
    "EagleDrafter",
    "LookaheadDrafter",
    "MedusaDrafter",
    "NGramDrafter",
    "Needs",
    "StepResult",
    "build_drafter",
    "drafter_for",
    "same_vocabulary",
]
