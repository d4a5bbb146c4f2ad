"""The medusa method's options."""

from __future__ import annotations

from dataclasses import dataclass

from quickdraft.config import MethodOptions, check_flag, check_path, parse_field
from quickdraft.drafters.medusa.tree import MedusaTree
from quickdraft.vocab.choice import FULL, ShortlistChoice

DEFAULT = MedusaTree()  # fitted to the heads' accuracies when they are known


@dataclass(frozen=True, slots=True)
class MedusaOptions(MethodOptions):
    """medusa_dir: the folder of trained heads (``quickdraft train medusa``); None uses those
        shipped for the target.
    tree: the draft tree (``MedusaTree``): ``default`` (a sparse tree fitted to the heads),
        ``fit:N`` or sibling counts per depth such as ``4,2,1``.
    draft_shortlist, shortlist_dir: the heads score these rows of the target's head
        (``ShortlistChoice``); None uses the artifacts shipped for the target.
    drafter_int8: quantized weights for the heads' rows of the target's head, on CPU
        (``ops.draft_linear``: 4-bit codes on the compiled kernels, else int8 per output
        channel); exact, only the proposals can shift. Ignored on other devices.
    """

    medusa_dir: str | None = None
    tree: MedusaTree = DEFAULT
    draft_shortlist: ShortlistChoice = FULL
    shortlist_dir: str | None = None
    drafter_int8: bool = True

    def __post_init__(self) -> None:
        check_path("medusa_dir", self.medusa_dir)
        parse_field(self, "tree", MedusaTree)
        parse_field(self, "draft_shortlist", ShortlistChoice)
        check_path("shortlist_dir", self.shortlist_dir)
        check_flag("drafter_int8", self.drafter_int8)
