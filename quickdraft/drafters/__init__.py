"""Drafters, one file per method, built from a SpecConfig through one registry."""

from __future__ import annotations

from quickdraft.config import Method, SpecConfig
from quickdraft.drafters.base import DecodeState, Draft, Drafter
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.models.base import Model


def _draft_model(spec: SpecConfig, target: Model, draft: Model | None) -> Drafter:
    if draft is None:
        raise ValueError("draft: method draft_model needs a draft model")
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft: its vocabulary ({draft.vocab_size}) differs from the target's "
            f"({target.vocab_size}); a draft model must share the target's tokenizer"
        )
    return DraftModelDrafter(draft, spec.num_speculative_tokens, spec.draft_temperature)


_BUILDERS = {
    Method.DRAFT_MODEL: _draft_model,
}


def build_drafter(spec: SpecConfig, target: Model, draft: Model | None = None) -> Drafter | None:
    """The drafter for ``spec.method``, or None for plain autoregressive decoding."""
    if spec.method is Method.AR:
        return None
    return _BUILDERS[spec.method](spec, target, draft)


__all__ = ["DecodeState", "Draft", "DraftModelDrafter", "Drafter", "build_drafter"]
