"""EAGLE-2's dynamic tree settings and the defaults measured for them: how many nodes a step
drafts, how deep and wide, which nodes are worth verifying, and how much prompt lookup rides
along (``drafters.eagle`` grows the trees, ``rerank`` keeps the best of what it grew)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from quickdraft.config import MAX_DRAFT_TOKENS, MAX_TREE_DEPTH, MAX_TREE_WIDTH, show_value
from quickdraft.drafters.base import Draft


@dataclass(frozen=True, slots=True)
class DynamicTree:
    """EAGLE-2's tree settings: ``depth`` draft levels, ``topk`` nodes expanded per level with
    ``topk`` children each, ``tokens`` nodes kept after the rerank (the verify budget).

    min_prob: a node joins the draft only if its score, the product of the draft
    probabilities along its path (the drafter's estimate of the chance the target accepts
    it), is at least this; expansion stops at the first level with no such node. 0 keeps the
    fixed budget of EAGLE-2. Where every verified token costs (CPU), this spends the budget
    only on tokens likely to pay for themselves: few on hard text, up to ``tokens`` on easy.
    """

    depth: int = 4
    topk: int = 4
    tokens: int = 12
    min_prob: float = 0.0

    def __post_init__(self) -> None:
        bounds = {"depth": MAX_TREE_DEPTH, "topk": MAX_TREE_WIDTH, "tokens": MAX_DRAFT_TOKENS}
        for name, high in bounds.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
                raise ValueError(
                    f"tree: {name} must be an integer in 1..{high}, got {show_value(value)}"
                )
        if (
            isinstance(self.min_prob, bool)
            or not isinstance(self.min_prob, int | float)
            or not 0.0 <= self.min_prob < 1.0
        ):
            raise ValueError(f"tree: min_prob must be in [0, 1), got {show_value(self.min_prob)}")
        object.__setattr__(self, "min_prob", float(self.min_prob))

    @classmethod
    def parse(cls, text: str) -> DynamicTree:
        """``DEPTH,TOPK,TOKENS`` (such as ``5,4,16``) with an optional ``,MIN_PROB`` (such as
        ``6,2,8,0.2``); TOPK 1 is a chain. ``parse(str(tree)) == tree``."""
        # ASCII digits, no spaces, each number capped in length before it is converted.
        number = r"([0-9]{1,6})"
        fraction = r"((?:[0-9]{1,3}\.?[0-9]{0,20}|\.[0-9]{1,20})(?:[eE][-+]?[0-9]{1,3})?)"
        shape = rf"{number},{number},{number}(?:,{fraction})?"
        match = re.fullmatch(shape, text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(
                "tree: expected default or DEPTH,TOPK,TOKENS[,MIN_PROB] such as 4,4,12 or "
                f"6,2,8,0.2; got {show_value(text)}"
            )
        depth, topk, tokens, min_prob = match.groups()
        return cls(int(depth), int(topk), int(tokens), float(min_prob or 0.0))

    def __str__(self) -> str:
        shape = f"{self.depth},{self.topk},{self.tokens}"
        return shape + (f",{float(self.min_prob)!r}" if self.min_prob else "")


@dataclass(frozen=True, slots=True)
class EagleTree:
    """The ``tree`` option of EAGLE: ``default`` (``shape`` None: the tree measured for the
    target's device, ``DEFAULT_TREES``) or an explicit ``DynamicTree``.
    ``parse(str(x)) == x``."""

    shape: DynamicTree | None = None

    def __post_init__(self) -> None:
        if self.shape is not None and not isinstance(self.shape, DynamicTree):
            raise ValueError(f"tree: shape must be a DynamicTree or None, got {self.shape!r}")

    @classmethod
    def parse(cls, text: str) -> EagleTree:
        return cls(None if text == "default" else DynamicTree.parse(text))

    def __str__(self) -> str:
        return "default" if self.shape is None else str(self.shape)

    def resolve(self, device: str) -> DynamicTree:
        """The tree a drafter on ``device`` ("cpu", "cuda") grows."""
        if self.shape is not None:
            return self.shape
        return DEFAULT_TREES.get(device, DEFAULT_TREES["cpu"])


# Default trees by the target's device. CPU: up to 10 nodes of path probability >= 0.1, since
# every verified token costs there and the drafter's confidence is informative: about one node
# a step on hard text, up to ten on easy text (measured on SmolLM2-135M:
# benchmarks/results/defaults.md). GPU: EAGLE-2's published setting, not measured here.
DEFAULT_TREES = {"cpu": DynamicTree(6, 4, 10, 0.1), "cuda": DynamicTree(6, 10, 60)}

# Prompt-lookup tokens grafted onto each tree by default (``EagleOptions.eagle_lookup``). The
# two drafters are right in different places, the network where the text is new, lookup
# where it repeats its prompt or itself, and the graft costs verify tokens only on a match
# (measured on SmolLM2-135M: benchmarks/results/defaults.md).
DEFAULT_LOOKUP = 5


def rerank(
    tokens: list[torch.Tensor],
    scores: list[torch.Tensor],
    parents: list[torch.Tensor],
    floor: float,
    budget: int,
) -> Draft:
    """EAGLE-2's rerank: of the candidates grown level by level (per level: tokens [B, C],
    scores [B, C] (log path probabilities), parents [C] (candidate index, -1 for the root's
    children)), the ``budget`` best scoring at least ``floor``, summed over rows (one shared
    shape), as a Draft: parents before children and, among siblings, best first."""
    all_tokens = torch.cat(tokens, 1)  # [B, C]
    total = torch.cat(scores, 1).sum(0).tolist()
    all_parents = torch.cat(parents).tolist()
    depth = [d for d, level in enumerate(scores) for _ in range(level.shape[1])]
    # Higher score first; ties by depth, so a parent always precedes its child. A child
    # never outscores its parent, so the floor keeps a tree too.
    ranked = sorted(range(len(total)), key=lambda i: (-total[i], depth[i]))
    best = [i for i in ranked if total[i] >= floor and total[i] > -math.inf][:budget]
    index: dict[int, int] = {-1: -1}
    order: list[int] = []
    for level in range(len(scores)):
        nodes = [i for i in best if depth[i] == level]
        for node in sorted(nodes, key=lambda i: (index[all_parents[i]], -total[i])):
            index[node] = len(order)
            order.append(node)
    parent_ids = torch.tensor([index[all_parents[i]] for i in order], dtype=torch.long)
    # Each row's own path probabilities: the draft's sizing reads them (``Draft.scores``).
    path_probs = torch.cat(scores, 1)[:, order].exp()
    return Draft.from_parents(all_tokens[:, order], parent_ids, scores=path_probs)
