"""Drafters, one file per method, built from a SpecConfig through one registry."""

from __future__ import annotations

from quickdraft.config import Method, SpecConfig
from quickdraft.drafters.base import Batch, Draft, Drafter, Needs, StepResult
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.eagle import EagleDrafter, build_eagle, eagle_folder
from quickdraft.drafters.eagle_tree import DEFAULT_LOOKUP
from quickdraft.drafters.lookahead import LookaheadDrafter, build_lookahead
from quickdraft.drafters.medusa import MedusaDrafter, build_medusa, heads_folder
from quickdraft.drafters.ngram import NGramDrafter
from quickdraft.models.base import Model
from quickdraft.vocab import artifact_folder, build_shortlist


def _draft_model(
    spec: SpecConfig,
    target: Model,
    draft: Model | None,
    same_tokenizer: bool | None,
    draft_name: str | None,
    target_name: str | None,
) -> Drafter:
    if draft is None:
        raise ValueError("draft: method draft_model needs a draft model")
    if same_tokenizer is False:
        raise ValueError(
            "draft: the draft model's tokenizer differs from the target's; "
            "draft and target must share one vocabulary"
        )
    if draft.vocab_size != target.vocab_size and not same_tokenizer:
        raise ValueError(
            f"draft: its vocabulary ({draft.vocab_size}) differs from the target's "
            f"({target.vocab_size}); pass both tokenizers to check they agree"
        )
    shortlist = None
    if spec.draft_shortlist != "full":
        folder = artifact_folder(draft_name, spec.shortlist_dir)
        shortlist = build_shortlist(spec.draft_shortlist, folder, spec.num_speculative_tokens)
    return DraftModelDrafter(
        draft,
        spec.num_speculative_tokens,
        spec.draft_temperature,
        vocab_size=target.vocab_size,
        shortlist=shortlist,
    )


def _ngram(
    spec: SpecConfig,
    target: Model,
    draft: Model | None,
    same_tokenizer: bool | None,
    draft_name: str | None,
    target_name: str | None,
) -> Drafter:
    return NGramDrafter(
        target.vocab_size,
        spec.num_speculative_tokens,
        spec.prompt_lookup_min,
        spec.prompt_lookup_max,
    )


def _medusa(
    spec: SpecConfig,
    target: Model,
    draft: Model | None,
    same_tokenizer: bool | None,
    draft_name: str | None,
    target_name: str | None,
) -> Drafter:
    return build_medusa(
        target, heads_folder(target_name, spec.medusa_dir), spec.tree, int8=spec.drafter_int8
    )


def _eagle(
    spec: SpecConfig,
    target: Model,
    draft: Model | None,
    same_tokenizer: bool | None,
    draft_name: str | None,
    target_name: str | None,
) -> Drafter:
    return build_eagle(
        target,
        eagle_folder(target_name, spec.eagle_dir),
        spec.tree,
        int8=spec.drafter_int8,
        lookup=DEFAULT_LOOKUP if spec.eagle_lookup is None else spec.eagle_lookup,
        lookup_ngram=(spec.prompt_lookup_min, spec.prompt_lookup_max),
    )


def _lookahead(
    spec: SpecConfig,
    target: Model,
    draft: Model | None,
    same_tokenizer: bool | None,
    draft_name: str | None,
    target_name: str | None,
) -> Drafter:
    return build_lookahead(spec, target)


_BUILDERS = {
    Method.DRAFT_MODEL: _draft_model,
    Method.NGRAM: _ngram,
    Method.MEDUSA: _medusa,
    Method.EAGLE: _eagle,
    Method.LOOKAHEAD: _lookahead,
}


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
    if spec.method is Method.AR:
        return None
    target_name = target_name or target.name
    if draft is not None:
        draft_name = draft_name or draft.name
    if draft is not None and spec.method is not Method.DRAFT_MODEL:
        raise ValueError(f"draft: method {spec.method.value} drafts without a draft model")
    return _BUILDERS[spec.method](spec, target, draft, same_tokenizer, draft_name, target_name)


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
]
