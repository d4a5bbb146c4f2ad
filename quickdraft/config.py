"""User-facing configuration: how to sample, and how to speculate.

Both are frozen, slotted dataclasses checked in ``__post_init__``; every invalid value raises
``ValueError`` naming the field, so a bad request fails at the boundary and never deep inside a
tensor operation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any


class Method(StrEnum):
    """How draft tokens are proposed. ``AR`` proposes none: plain autoregressive decoding."""

    AR = "ar"
    DRAFT_MODEL = "draft_model"
    NGRAM = "ngram"
    MEDUSA = "medusa"
    EAGLE = "eagle"
    LOOKAHEAD = "lookahead"


class AcceptRule(StrEnum):
    """How the target judges a draft (``accept.py``). Rejection sampling and greedy are
    lossless; typical (Medusa-2) is lossy and never a default."""

    REJECTION_SAMPLING = "rejection_sampling"
    GREEDY = "greedy"
    TYPICAL = "typical"

    @property
    def lossless(self) -> bool:
        return self is not AcceptRule.TYPICAL


LOSSLESS_RULES = tuple(rule for rule in AcceptRule if rule.lossless)


def _check_number(name: str, value: Any, *, integer: bool = False) -> None:
    """Reject wrong types (bool included), NaN and infinities, naming the field."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{name} must be {kind}, got {value!r} ({type(value).__name__})")
    if not integer and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")


def _enum_value(name: str, enum: type[Enum], value: Any) -> Enum:
    if isinstance(value, enum):
        return value
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(m.value for m in enum)  # type: ignore[attr-defined]
        raise ValueError(f"{name} must be one of {allowed}; got {value!r}") from None


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How the target's distribution is shaped and sampled; drafts use the same function.

    temperature: 0 means greedy (argmax, ties to the lowest token id).
    top_k: keep the k most likely tokens; 0 turns it off.
    top_p: keep the smallest most-likely set whose mass reaches top_p; 1.0 turns it off.
    max_new_tokens: generation stops after this many new tokens.
    seed: seeds the generator for drafts, acceptance and sampling; None draws a fresh seed.
    stop_token_ids: generation ends at the first of these (it is kept in token_ids).
    stop: strings that end generation; the text is cut before the match. Needs a tokenizer.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        _check_number("top_k", self.top_k, integer=True)
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 turns it off), got {self.top_k}")
        _check_number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_number("max_new_tokens", self.max_new_tokens, integer=True)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.seed is not None:
            _check_number("seed", self.seed, integer=True)
            if self.seed < 0:
                raise ValueError(f"seed must be >= 0, got {self.seed}")
        object.__setattr__(self, "stop_token_ids", _as_tuple("stop_token_ids", self.stop_token_ids))
        for token in self.stop_token_ids:
            _check_number("stop_token_ids", token, integer=True)
            if token < 0:
                raise ValueError(f"stop_token_ids must be token ids >= 0, got {token}")
        object.__setattr__(self, "stop", _as_tuple("stop", self.stop))
        for text in self.stop:
            if not isinstance(text, str) or not text:
                raise ValueError(f"stop must hold non-empty strings, got {text!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _as_tuple(name: str, value: Any) -> tuple:
    if isinstance(value, str | bytes) or not isinstance(value, tuple | list):
        raise ValueError(f"{name} must be a list or tuple, got {value!r}")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """How to speculate.

    method: which drafter proposes tokens (``Method``).
    num_speculative_tokens: draft tokens per verify step (k), 1..64; ignored by ``ar``.
    acceptance: the acceptance rule (``AcceptRule``); rejection sampling is the default.
    draft_temperature: draft_model only: the draft model's own sampling temperature; None means
        the target's. Any value keeps the output exact (the draft's probabilities are what the
        rule divides by); a cooler draft is often accepted more often.
    draft_shortlist: draft_model only: the draft head's vocabulary shortlist, ``full`` or
        ``fr:K``, ``fr-pa:K``, ``dyna:K``, ``dyna-pa:K`` (``quickdraft.vocab``). Exact: the
        target always verifies over the full vocabulary.
    shortlist_dir: the folder of the shortlist's artifacts; None uses those shipped for the
        draft model.
    medusa_dir: medusa only: the folder of trained heads (``quickdraft train medusa``); None
        uses those shipped for the target.
    tree: medusa and eagle: the draft tree; num_speculative_tokens is then unused. Medusa:
        ``default`` (a sparse tree fitted to the heads), ``fit:N`` or sibling counts per depth
        such as ``4,2,1``. EAGLE: ``default`` or ``DEPTH,TOPK,TOKENS`` of its dynamic tree
        (EAGLE-2), such as ``4,4,12``; TOPK 1 drafts a chain.
    eagle_dir: eagle only: the folder of a trained EAGLE drafter (``quickdraft train eagle``);
        None uses the one shipped for the target.
    eagle_lookup: eagle only: the most tokens of prompt lookup (``prompt_lookup_min``..
        ``prompt_lookup_max``-gram matches, as method ngram) grafted onto each draft tree as
        one more branch; 0 drafts with the EAGLE network alone, None (the default) uses
        ``drafters.eagle_tree.DEFAULT_LOOKUP``. Exact like any tree: the branch's tokens are
        verified with the rest, and cost only where the text repeats itself.
    drafter_int8: medusa and eagle: int8 weights (per output channel) for the trained
        drafter's layers and its LM-head rows, on CPU. The output stays exact, only the
        proposals can shift; about half the draft time on CPU, where drafting streams
        weights. Ignored on other devices and by other methods (a draft model's int8 is
        ``load_model(int8=...)``).
    lookahead_window, lookahead_ngram, lookahead_candidates: lookahead only: the Jacobi
        window W, the n-gram size N and the cap G on verified candidates; None picks the
        defaults measured for the target's device (``drafters.lookahead.DEFAULTS``).
    """

    method: Method = Method.DRAFT_MODEL
    num_speculative_tokens: int = 4
    acceptance: AcceptRule = AcceptRule.REJECTION_SAMPLING
    draft_temperature: float | None = None
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3
    draft_shortlist: str = "full"
    shortlist_dir: str | None = None
    medusa_dir: str | None = None
    tree: str = "default"
    eagle_dir: str | None = None
    eagle_lookup: int | None = None
    drafter_int8: bool = True
    lookahead_window: int | None = None
    lookahead_ngram: int | None = None
    lookahead_candidates: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", _enum_value("method", Method, self.method))
        object.__setattr__(
            self, "acceptance", _enum_value("acceptance", AcceptRule, self.acceptance)
        )
        _check_number("num_speculative_tokens", self.num_speculative_tokens, integer=True)
        if not 1 <= self.num_speculative_tokens <= 64:
            raise ValueError(
                f"num_speculative_tokens must be in 1..64, got {self.num_speculative_tokens}"
            )
        if self.draft_temperature is not None:
            if self.method is not Method.DRAFT_MODEL:
                raise ValueError("draft_temperature applies to method draft_model only")
            _check_number("draft_temperature", self.draft_temperature)
            if self.draft_temperature < 0:
                raise ValueError(f"draft_temperature must be >= 0, got {self.draft_temperature}")

        from quickdraft.vocab import parse_shortlist

        if not isinstance(self.draft_shortlist, str):
            raise ValueError(f"draft_shortlist must be a string, got {self.draft_shortlist!r}")
        try:
            parse_shortlist(self.draft_shortlist)
        except ValueError as error:
            raise ValueError(f"draft_{error}") from None
        if self.draft_shortlist != "full" and self.method is not Method.DRAFT_MODEL:
            raise ValueError("draft_shortlist applies to method draft_model only")

        if not isinstance(self.tree, str):
            raise ValueError(f"tree must be a string such as default or 4,2,1; got {self.tree!r}")
        if self.method not in (Method.MEDUSA, Method.EAGLE) and self.tree != "default":
            raise ValueError("tree applies to methods medusa and eagle only")
        if self.method is not Method.MEDUSA and self.medusa_dir is not None:
            raise ValueError("medusa_dir applies to method medusa only")
        if self.method is not Method.EAGLE and self.eagle_dir is not None:
            raise ValueError("eagle_dir applies to method eagle only")
        if self.eagle_lookup is not None:
            _check_number("eagle_lookup", self.eagle_lookup, integer=True)
            if not 0 <= self.eagle_lookup <= 64:
                raise ValueError(f"eagle_lookup must be in 0..64, got {self.eagle_lookup}")
            if self.method is not Method.EAGLE:
                raise ValueError("eagle_lookup applies to method eagle only")
        if not isinstance(self.drafter_int8, bool):
            raise ValueError(f"drafter_int8 must be True or False, got {self.drafter_int8!r}")
        if self.method is Method.MEDUSA and self.tree != "default":
            from quickdraft.drafters.medusa import check_tree

            check_tree(self.tree)  # the syntax; the depth is checked against the heads on load
        if self.method is Method.EAGLE:
            from quickdraft.drafters.eagle_tree import DynamicTree

            DynamicTree.parse(self.tree)
        names = ("lookahead_window", "lookahead_ngram", "lookahead_candidates")
        given = {name[len("lookahead_") :]: getattr(self, name) for name in names}
        given = {name: value for name, value in given.items() if value is not None}
        if given and self.method is not Method.LOOKAHEAD:
            raise ValueError("lookahead_* settings apply to method lookahead only")
        if given:
            from quickdraft.drafters.lookahead import LookaheadConfig

            LookaheadConfig(**given)  # each value's range

        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            _check_number(name, getattr(self, name), integer=True)
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must not exceed "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )

    @property
    def k(self) -> int:
        """Draft tokens per step: 0 for plain autoregressive decoding."""
        return 0 if self.method is Method.AR else self.num_speculative_tokens
