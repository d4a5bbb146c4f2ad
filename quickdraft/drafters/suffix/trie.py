"""Count tries of every substring up to a depth, and the drafts they grow: a best-first tree
of the most frequent continuations, or the most probable chain."""

from __future__ import annotations

import heapq
from dataclasses import dataclass


class Node:
    """A substring's occurrences (``count``) and the tokens that followed it."""

    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, Node] = {}


class SuffixTrie:
    """Counts of every substring of at most ``depth`` tokens of the texts added. A text is
    added a token at a time through a cursor (the nodes of its suffixes shorter than
    ``depth``), so a growing text costs ``depth`` updates a token; ``remove`` takes a text
    out again."""

    def __init__(self, depth: int):
        self.depth = depth
        self.root = Node()
        self.tokens = 0  # tokens added and not removed

    def cursor(self) -> list[Node]:
        return [self.root]

    def extend(self, cursor: list[Node], tokens: list[int]) -> list[Node]:
        """Add ``tokens`` after the text ``cursor`` stands at; the cursor after them."""
        depth, root = self.depth, self.root
        for token in tokens:  # every step of a request runs this: kept lean
            grown = [root]
            append = grown.append
            for node in cursor:
                children = node.children
                child = children.get(token)
                if child is None:
                    child = children[token] = Node()
                child.count += 1
                append(child)
            # The cursor holds the suffixes shorter than depth: the deepest one grew past it.
            cursor = grown if len(grown) <= depth else grown[:depth]
        self.tokens += len(tokens)
        return cursor

    def remove(self, tokens: list[int]) -> None:
        """Take out a text added before (all of it, from an empty cursor)."""
        cursor = [self.root]
        for token in tokens:
            grown = [self.root]
            for length, node in enumerate(cursor):
                child = node.children[token]
                child.count -= 1
                if child.count == 0:
                    del node.children[token]
                elif length + 1 < self.depth:
                    grown.append(child)
            cursor = grown
        self.tokens -= len(tokens)

    def match(self, text: list[int], room: int = 1) -> tuple[Node | None, int]:
        """The node of the longest suffix of ``text`` that has a continuation and leaves
        ``room`` tokens of the trie's depth below it (a match as deep as the trie could draft
        one token only), and its length; (None, 0) when no suffix has one."""
        for length in range(min(self.depth - max(room, 1), len(text)), 0, -1):
            node = self.root
            for token in text[len(text) - length :]:
                node = node.children.get(token)
                if node is None:
                    break
            if node is not None and node.children:
                return node, length
        return None, 0


def longest(cursor: list[Node], top: int) -> tuple[Node | None, int]:
    """``SuffixTrie.match`` from a cursor that stands at the text's end: the node of its
    longest suffix of at most ``top`` tokens that has a continuation, and its length."""
    for length in range(min(top, len(cursor) - 1), 0, -1):
        node = cursor[length]
        if node.children:
            return node, length
    return None, 0


@dataclass(frozen=True, slots=True)
class Proposal:
    """A draft tree: tokens and parents (-1: the pending token's children), best first, each
    node's probability by the counts (its path's), their sum (the expected accepted length,
    if the counts were the target's probabilities), and the length of the match it grew from
    (set by the drafter)."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    score: float = 0.0
    probs: tuple[float, ...] = ()
    matched: int = 0


def chain(node: Node, budget: int, min_prob: float) -> Proposal:
    """The most probable continuation of ``node``, a token at a time, up to ``budget`` tokens
    and while its probability stays at least ``min_prob``."""
    tokens: list[int] = []
    probs: list[float] = []
    prob = 1.0
    while node.children and len(tokens) < budget:
        total = sum(child.count for child in node.children.values())
        token, child = max(node.children.items(), key=lambda item: item[1].count)
        prob *= child.count / total
        if prob < min_prob:
            break
        tokens.append(token)
        probs.append(prob)
        node = child
    parents = tuple(range(-1, len(tokens) - 1))
    return Proposal(tuple(tokens), parents, sum(probs), tuple(probs))


def grow(node: Node, budget: int, min_prob: float) -> Proposal:
    """Up to ``budget`` continuations of ``node``, most probable first, none below
    ``min_prob``; parents before children."""
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    heap: list[tuple[float, int, int, int, Node]] = []
    order = 0  # ties: the earlier pushed first, so equal counts keep insertion order

    def push(parent_node: Node, parent_index: int, prob: float) -> None:
        nonlocal order
        total = sum(child.count for child in parent_node.children.values())
        for token, child in parent_node.children.items():
            p = prob * child.count / total
            if p >= min_prob:
                heapq.heappush(heap, (-p, order, parent_index, token, child))
                order += 1

    push(node, -1, 1.0)
    while heap and len(tokens) < budget:
        neg, _, parent, token, child = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        probs.append(-neg)
        push(child, len(tokens) - 1, -neg)
    return Proposal(tuple(tokens), tuple(parents), sum(probs), tuple(probs))
