"""EAGLE-2's dynamic tree settings and the defaults measured for them: how many nodes a step
drafts, how deep and wide, which nodes are worth verifying, and how much prompt lookup rides
along (``drafters.eagle`` grows the trees)."""

from __future__ import annotations

from dataclasses import dataclass

from quickdraft.config import MAX_DRAFT_TOKENS, MAX_TREE_DEPTH, MAX_TREE_WIDTH, show_value


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

    @classmethod
    def parse(cls, text: str | None, device: str = "cpu") -> DynamicTree:
        """``default`` (``DEFAULT_TREES`` for the device) or ``DEPTH,TOPK,TOKENS`` (such as
        ``5,4,16``) with an optional ``,MIN_PROB`` (such as ``6,2,8,0.2``); TOPK 1 is a
        chain."""
        if text is None or text == "default":
            return DEFAULT_TREES.get(device, DEFAULT_TREES["cpu"])
        parts = text.split(",")
        try:
            if len(parts) not in (3, 4):
                raise ValueError
            depth, topk, tokens = (int(part) for part in parts[:3])
            min_prob = float(parts[3]) if len(parts) == 4 else 0.0
        except ValueError:
            raise ValueError(
                "tree: expected default or DEPTH,TOPK,TOKENS[,MIN_PROB] such as 4,4,12 or "
                f"6,2,8,0.2; got {text!r}"
            ) from None
        return cls(depth, topk, tokens, min_prob)


# Default trees by the target's device. CPU: measured on SmolLM2-135M with its shipped drafter
# (int8, 2 threads, greedy; benchmarks/results/smollm2_methods/), where every token of a
# verify pass costs (a 2-token pass about 1.12 one-token passes, a 13-token one 1.7) and the
# drafter's confidence is informative: a tree of up to 10 nodes of path probability >= 0.1
# (depth 6, top-4) ran 1.09x plain decoding over seven task kinds, a fixed chain of 3 1.00x;
# it drafts about one node a step on hard text and up to ten on easy text.
# GPU: EAGLE-2's published setting (depth 6, top-10, 60 tokens), not measured here.
DEFAULT_TREES = {"cpu": DynamicTree(6, 4, 10, 0.1), "cuda": DynamicTree(6, 10, 60)}

# Prompt-lookup tokens grafted onto each tree by default (``SpecConfig.eagle_lookup``). The
# two drafters are right in different places, the network where the text is new, lookup
# where it repeats its prompt or itself, and the graft costs verify tokens only on a match:
# on SmolLM2-135M's 24 code prompts the default tree alone accepts 1.4-1.5 tokens a step,
# prompt lookup 1.60, the tree with 5 lookup tokens 2.52 (1.71x plain decoding, prompt lookup
# 1.32x); over the seven tasks 2.02 (1.19x; prompt lookup 1.04x).
DEFAULT_LOOKUP = 5
