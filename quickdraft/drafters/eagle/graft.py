"""Where an EAGLE tree and prompt lookup meet: the lookup's continuation grafted onto the tree as
one more branch, and the ancestor mask of the tree's entries."""

from __future__ import annotations

import torch

from quickdraft.drafters.base import Draft


def graft(draft: Draft, lookup: Draft) -> Draft:
    """``draft`` with prompt lookup's continuation (``lookup``: a chain of [B, L] tokens and
    their scores) as one more branch, after the drafter's nodes. With one row it follows the
    tree's nodes as long as they hold its tokens and branches off where they stop (no node is
    verified twice); in a batch, whose rows share one shape, it is a branch of its own from the
    root, each row's continuation padded like ``NGramDrafter``'s. Its tokens are point masses
    like the tree's, so the tree rules stay exact; a duplicate of a sibling's token is simply
    rejected. A branch node's score is its anchor's (the tree node it hangs from; 1 for the
    root) times the lookup's chance of the tokens from there to it."""
    continuation = lookup.tokens.to(draft.tokens.device)
    if continuation.shape[1] == 0:
        return draft
    parents = draft.parents.tolist()
    attach, start = -1, 0
    if continuation.shape[0] == 1:
        row = draft.tokens[0].tolist()
        children: dict[tuple[int, int], int] = {}
        for node, parent in enumerate(parents):
            children.setdefault((parent, row[node]), node)
        for token in continuation[0].tolist():
            node = children.get((attach, token))
            if node is None:
                break
            attach, start = node, start + 1
    branch = continuation[:, start:]
    if branch.shape[1] == 0:
        return draft
    size = len(parents)
    extra = [attach, *range(size, size + branch.shape[1] - 1)]
    scores = None
    if draft.scores is not None and lookup.scores is not None:
        chances = lookup.scores.to(draft.scores)
        if attach < 0:
            scores = torch.cat([draft.scores, chances], 1)
        else:  # the lookup's chance from its anchor on, given the anchor
            given = chances[:, start:] / chances[:, start - 1 : start].clamp_min(1e-12)
            scores = torch.cat([draft.scores, draft.scores[:, attach : attach + 1] * given], 1)
    tokens = torch.cat([draft.tokens, branch], 1)
    return Draft.from_parents(tokens, parents + extra, scores=scores)


def ancestor_mask(entry_parent: list[int]) -> torch.Tensor:
    """[E, E] bool: entry e sees entry s when s is e or one of its ancestors."""
    count = len(entry_parent)
    mask = torch.eye(count, dtype=torch.bool)
    for entry, parent in enumerate(entry_parent):
        if parent >= 0:
            mask[entry] |= mask[parent]
    return mask
