"""Medusa's draft trees: the default sparse trees, trees fitted to the heads' measured rank
accuracies (Medusa's construction), and the ``tree`` option's syntax (``default``, ``fit:N``,
sibling counts per depth such as ``4,2,1``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from quickdraft.config import MAX_DRAFT_TOKENS, MAX_TREE_DEPTH, MAX_TREE_WIDTH, show_value
from quickdraft.tree import TreeShape

DEFAULT_NODES = 16

# Default trees (Medusa's sparse "choices"): wide where the heads are accurate (depth 1), narrow
# deeper. 3 heads: 4 + 6 + 4 = 14 nodes.
DEFAULT_PATHS: dict[int, tuple[tuple[int, ...], ...]] = {
    1: ((0,), (1,), (2,), (3,)),
    2: ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0)),
    3: (
        (0,), (1,), (2,), (3,),
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0),
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
    ),
}  # fmt: skip


def default_tree(num_heads: int) -> TreeShape:
    """The default tree for ``num_heads`` heads: the 3-head tree cut, or extended by one top
    candidate per further head."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    if num_heads in DEFAULT_PATHS:
        return TreeShape.from_paths(DEFAULT_PATHS[num_heads])
    paths = list(DEFAULT_PATHS[3])
    for depth in range(4, num_heads + 1):
        paths.append((0,) * depth)
    return TreeShape.from_paths(paths)


def fit_tree(rank_accuracy: Sequence[Sequence[float]], nodes: int) -> TreeShape:
    """Medusa's tree construction: the ``nodes`` paths most likely to be accepted, taking head
    d's r-th candidate to be right with probability rank_accuracy[d][r] independently of the
    others. A path's probability is the product along it, so it never exceeds its prefix's
    (nor, with accuracies falling with rank, its elder sibling's): the best paths always form
    a tree. Its expected accepted length is 1 + the sum of the chosen paths' probabilities."""
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    if not rank_accuracy or not all(rank_accuracy):
        raise ValueError("rank_accuracy: one non-empty list of accuracies per head")
    chosen: list[tuple[int, ...]] = []
    # (probability of the path, the path, probability of its parent path)
    frontier = [(float(rank_accuracy[0][0]), (0,), 1.0)]
    while frontier and len(chosen) < nodes:
        frontier.sort(key=lambda item: -item[0])
        probability, path, parent = frontier.pop(0)
        chosen.append(path)
        depth, rank = len(path), path[-1]
        accuracy = rank_accuracy[depth - 1]
        if rank + 1 < len(accuracy):  # the next sibling
            frontier.append((parent * accuracy[rank + 1], (*path[:-1], rank + 1), parent))
        if depth < len(rank_accuracy):  # the first child
            frontier.append((probability * rank_accuracy[depth][0], (*path, 0), probability))
    return TreeShape.from_paths(chosen)


@dataclass(frozen=True, slots=True)
class MedusaTree:
    """The ``tree`` option of Medusa: ``default`` (fitted to the heads' measured accuracies
    when they are known), ``fit:N`` (fitted with N nodes) or sibling counts per depth such as
    ``4,2,1`` (``widths``). Checked by arithmetic alone: nothing is built, so a typo such as
    300,300,300 fails at once. ``parse(str(x)) == x``."""

    fit: int | None = None
    widths: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.fit is not None and self.widths:
            raise ValueError("tree: fit:N or widths, not both")
        if self.fit is not None and (
            isinstance(self.fit, bool)
            or not isinstance(self.fit, int)
            or not 1 <= self.fit <= MAX_DRAFT_TOKENS
        ):
            raise ValueError(f"tree: expected fit:N with N in 1..{MAX_DRAFT_TOKENS}, got {self}")
        widths = self.widths
        if not isinstance(widths, tuple) or not all(
            isinstance(w, int) and not isinstance(w, bool) for w in widths
        ):
            raise ValueError(f"tree: widths must be a tuple of integers, got {widths!r}")
        if len(widths) > MAX_TREE_DEPTH or not all(1 <= w <= MAX_TREE_WIDTH for w in widths):
            raise ValueError(
                f"tree: at most {MAX_TREE_DEPTH} levels of 1..{MAX_TREE_WIDTH} children, got {self}"
            )
        nodes, level = 0, 1
        for width in widths:
            level *= width
            nodes += level
            if nodes > MAX_DRAFT_TOKENS:
                raise ValueError(
                    f"tree: {self} has more than {MAX_DRAFT_TOKENS} nodes; use fewer or "
                    "narrower levels, or fit:N"
                )

    @classmethod
    def parse(cls, text: str) -> MedusaTree:
        if text == "default":
            return cls()
        # ASCII digits, no spaces, each number capped in length before it is converted.
        if isinstance(text, str) and text.startswith("fit:"):
            if not re.fullmatch(r"[0-9]{1,4}", text[4:]):
                raise ValueError(
                    f"tree: expected fit:N with N in 1..{MAX_DRAFT_TOKENS}, got {show_value(text)}"
                )
            return cls(fit=int(text[4:]))
        parts = text.split(",") if isinstance(text, str) else [""]
        if len(parts) > MAX_TREE_DEPTH or not all(re.fullmatch(r"[0-9]{1,4}", p) for p in parts):
            raise ValueError(
                f"tree: expected default, fit:N or at most {MAX_TREE_DEPTH} widths like "
                f"4,2,1; got {show_value(text)}"
            )
        return cls(widths=tuple(int(part) for part in parts))

    def __str__(self) -> str:
        if self.fit is not None:
            return f"fit:{self.fit}"
        return ",".join(map(str, self.widths)) if self.widths else "default"


def parse_tree(
    tree: MedusaTree | str | None,
    num_heads: int,
    rank_accuracy: Sequence[Sequence[float]] | None = None,
) -> TreeShape:
    """The tree shape of ``tree`` (a ``MedusaTree`` or its text; None is ``default``) for
    ``num_heads`` heads: ``default`` is fitted to the heads' measured accuracies with 16 nodes
    when they are known, else ``default_tree``; ``fit:N`` fitted with N nodes; widths give a
    full tree of those widths, at most one depth per head."""
    tree = MedusaTree.parse(tree) if isinstance(tree, str) else tree or MedusaTree()
    if tree.fit is None and not tree.widths:
        if rank_accuracy:
            return fit_tree(rank_accuracy, DEFAULT_NODES)
        return default_tree(num_heads)
    if tree.fit is not None:
        if not rank_accuracy:
            raise ValueError("tree: fit:N needs heads with measured rank accuracies")
        return fit_tree(rank_accuracy, tree.fit)
    if len(tree.widths) > num_heads:
        raise ValueError(f"tree: {len(tree.widths)} levels but the heads predict only {num_heads}")
    return TreeShape.from_branching(list(tree.widths))
