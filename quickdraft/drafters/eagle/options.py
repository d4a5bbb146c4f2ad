"""The eagle method's options."""

from __future__ import annotations

from dataclasses import dataclass

from quickdraft.config import (
    MAX_DRAFT_TOKENS,
    MAX_SPECULATIVE_TOKENS,
    MethodOptions,
    check_flag,
    check_path,
    check_range,
    parse_field,
)
from quickdraft.drafters.eagle.tree import DEFAULT_LOOKUP, DEFAULT_TREES, EagleTree
from quickdraft.drafters.ngram import check_lookup_ngram
from quickdraft.vocab.choice import ShortlistChoice

DEFAULT = EagleTree()  # the device's measured tree


@dataclass(frozen=True, slots=True)
class EagleOptions(MethodOptions):
    """eagle_dir: the folder of a trained EAGLE drafter (``quickdraft train eagle``); None
        uses the one shipped for the target.
    tree: EAGLE-2's dynamic tree (``EagleTree``): ``default`` or ``DEPTH,TOPK,TOKENS
        [,MIN_PROB]`` such as ``4,4,12``; TOPK 1 drafts a chain.
    eagle_lookup: the most tokens of prompt lookup (``prompt_lookup_min``..``_max``-gram
        matches, as method ngram) grafted onto each draft tree as one more branch; 0 drafts
        with the network alone, None uses ``DEFAULT_LOOKUP``. Exact like any tree.
    draft_shortlist: the drafter scores these rows of the target's head (``ShortlistChoice``);
        None (the default) the one its ``eagle.json`` names (``shipped_shortlist``: where a
        bench measured one faster than the full head), else the full head.
    shortlist_dir: the shortlist's artifacts; None uses the drafter's own, else the target's.
    drafter_int8: quantized weights for the drafter's layers and head rows on CPU
        (``ops.draft_linear``: 4-bit codes on the compiled kernels, else int8); exact, only
        the proposals can shift. Ignored on other devices.
    suffix_first: suffix decoding in front (``drafters.suffix.hybrid``): a step whose suffix
        draft is expected to beat this drafter's uses it alone. Exact like any draft.
    """

    eagle_dir: str | None = None
    tree: EagleTree = DEFAULT
    eagle_lookup: int | None = None
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3
    draft_shortlist: ShortlistChoice | None = None
    shortlist_dir: str | None = None
    drafter_int8: bool = True
    suffix_first: bool = False

    def __post_init__(self) -> None:
        check_path("eagle_dir", self.eagle_dir)
        check_flag("suffix_first", self.suffix_first)
        parse_field(self, "tree", EagleTree)
        if self.eagle_lookup is not None:
            check_range("eagle_lookup", self.eagle_lookup, 0, MAX_SPECULATIVE_TOKENS, integer=True)
        check_lookup_ngram(self.prompt_lookup_min, self.prompt_lookup_max)
        if self.draft_shortlist is not None:
            parse_field(self, "draft_shortlist", ShortlistChoice)
        check_path("shortlist_dir", self.shortlist_dir)
        check_flag("drafter_int8", self.drafter_int8)
        tokens = max(self.tree.resolve(device).tokens for device in DEFAULT_TREES)
        if tokens + self.lookup > MAX_DRAFT_TOKENS:
            raise ValueError(
                f"tree: {tokens} tokens plus eagle_lookup {self.lookup} exceed the "
                f"{MAX_DRAFT_TOKENS} tokens of one verify pass"
            )

    @property
    def lookup(self) -> int:
        """The prompt-lookup tokens grafted on (``eagle_lookup``, or the default)."""
        return DEFAULT_LOOKUP if self.eagle_lookup is None else self.eagle_lookup
