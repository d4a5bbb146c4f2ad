"""Draft trees: a shape, turned once into the frozen buffers that verification needs.

A tree hangs off the pending token (the *root*, verify-input index 0); draft node i sits at
verify-input index i + 1. Nodes are numbered in topological order, parents before children, and
siblings in the order the drafter ranks them (the first is its most likely candidate), which is
the order the acceptance rules try them in.

Shapes come three ways:

* ``TreeShape.from_paths``: Medusa's "choices", one tuple of sibling ranks per node, root to node:
  ``(0,)`` is the top candidate at depth 1, ``(0, 1)`` the second candidate below it.
* ``TreeShape.from_branching``: every node at depth d has ``widths[d]`` children (top-k expansion).
* ``TreeShape.chain``: k nodes in a line, the classic draft.

The buffers (Medusa's ``generate_medusa_buffers``): the attention mask of the verify pass, each
node's depth (its position offset from the root), the children of each node as a padded table
for the vectorised acceptance rules, and the root-to-leaf paths (retrieve indices).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class TreeShape:
    """parents:  [N] long, each node's parent, -1 for the root's children; parents[i] < i.
    depth:    [N] long, 1 for the root's children.
    ranks:    [N] long, each node's index among its siblings.
    mask:     [N+1, N+1] bool, verify-input t may attend to s: s is t or an ancestor of t
              (index 0 is the root, which every node sees).
    children: [N+1, W] long, the children of the root (row 0) and of node i (row i + 1) in rank
              order, padded with -1; W is the widest sibling group.
    paths:    [leaves, max_depth] long, the nodes of every root-to-leaf path, padded with -1.
    """

    parents: torch.Tensor
    depth: torch.Tensor
    ranks: torch.Tensor
    mask: torch.Tensor
    children: torch.Tensor
    paths: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return self.parents.shape[0]

    @property
    def max_depth(self) -> int:
        # The paths' width (read on every step: no tensor reduction each time).
        return self.paths.shape[1] if self.num_nodes else 0

    @property
    def is_chain(self) -> bool:
        return bool(torch.equal(self.parents, torch.arange(-1, self.num_nodes - 1)))

    @property
    def position_offsets(self) -> torch.Tensor:
        """[N+1] long: the root at offset 0, each node at its depth."""
        return torch.cat([torch.zeros(1, dtype=torch.long), self.depth])

    # -- constructors -------------------------------------------------------------------

    @staticmethod
    def from_parents(parents: Sequence[int] | torch.Tensor) -> TreeShape:
        """The shape of a tree given each node's parent (validated, then cached)."""
        values = tuple(int(p) for p in torch.as_tensor(parents).flatten().tolist())
        for i, parent in enumerate(values):
            if not -1 <= parent < i:
                raise ValueError(
                    f"parents: node {i} has parent {parent}; parents must precede their "
                    "children (-1 is the root)"
                )
        return _build(values)

    @staticmethod
    def from_paths(paths: Sequence[Sequence[int]]) -> TreeShape:
        """Medusa's tree "choices": each path is the sibling rank at every depth, root first.
        Every proper prefix of a path must be a path too, and the ranks under one parent must
        be 0, 1, 2, ... without gaps (rank r is the drafter's (r+1)-th candidate)."""
        if not paths:
            raise ValueError("paths: a tree needs at least one node")
        keys = []
        for path in paths:
            key = tuple(int(r) for r in path)
            if not key or any(r < 0 for r in key):
                raise ValueError(f"paths: {list(path)} must be a non-empty list of ranks >= 0")
            keys.append(key)
        unique = sorted(set(keys), key=lambda key: (len(key), key))
        if len(unique) != len(keys):
            raise ValueError("paths: a path appears twice")
        index = {key: i for i, key in enumerate(unique)}
        for key in unique:
            parent = key[:-1]
            if parent and parent not in index:
                raise ValueError(f"paths: {list(key)} needs its prefix {list(parent)} too")
            if key[-1] > 0 and (*parent, key[-1] - 1) not in index:
                raise ValueError(f"paths: {list(key)} needs its elder sibling, rank {key[-1] - 1}")
        return TreeShape.from_parents([index[key[:-1]] if len(key) > 1 else -1 for key in unique])

    @staticmethod
    def from_branching(widths: Sequence[int]) -> TreeShape:
        """A full tree: every node at depth d + 1 has widths[d + 1] children; widths[0] at the
        root. (2, 2, 1) has 2 + 4 + 4 = 10 nodes."""
        if not widths or any(int(w) < 1 for w in widths):
            raise ValueError(f"widths must be positive sibling counts, got {list(widths)}")
        parents: list[int] = []
        level = [-1]
        for width in widths:
            next_level = []
            for parent in level:
                for _ in range(int(width)):
                    parents.append(parent)
                    next_level.append(len(parents) - 1)
            level = next_level
        return TreeShape.from_parents(parents)

    @staticmethod
    def chain(num_nodes: int) -> TreeShape:
        if num_nodes < 0:
            raise ValueError(f"num_nodes must be >= 0, got {num_nodes}")
        return TreeShape.from_parents(range(-1, num_nodes - 1))


# Suffix decoding's trees take many shapes (a few hundred over a long run).
@functools.lru_cache(maxsize=512)
def _build(parents: tuple[int, ...]) -> TreeShape:
    """The buffers of one shape; cached, so a drafter that repeats its shape builds them once."""
    num = len(parents)
    depth = [0] * num
    ranks = [0] * num
    kids: list[list[int]] = [[] for _ in range(num + 1)]
    for i, parent in enumerate(parents):
        depth[i] = 1 if parent < 0 else depth[parent] + 1
        ranks[i] = len(kids[parent + 1])
        kids[parent + 1].append(i)
    mask = torch.zeros(num + 1, num + 1, dtype=torch.bool)
    mask[:, 0] = True
    for i in range(num):
        mask[i + 1, i + 1] = True
        node = parents[i]
        while node >= 0:
            mask[i + 1, node + 1] = True
            node = parents[node]
    width = max((len(k) for k in kids), default=0)
    children = torch.full((num + 1, max(width, 1)), -1, dtype=torch.long)
    for row, group in enumerate(kids):
        children[row, : len(group)] = torch.tensor(group, dtype=torch.long)
    leaves = [i for i in range(num) if not kids[i + 1]]
    max_depth = max(depth, default=0)
    paths = torch.full((len(leaves), max(max_depth, 1)), -1, dtype=torch.long)
    for row, leaf in enumerate(leaves):
        chain = []
        node = leaf
        while node >= 0:
            chain.append(node)
            node = parents[node]
        paths[row, : len(chain)] = torch.tensor(chain[::-1], dtype=torch.long)
    return TreeShape(
        parents=torch.tensor(parents, dtype=torch.long),
        depth=torch.tensor(depth, dtype=torch.long),
        ranks=torch.tensor(ranks, dtype=torch.long),
        mask=mask,
        children=children,
        paths=paths,
    )
