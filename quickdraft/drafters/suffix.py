"""Suffix decoding (Oliaro et al., SuffixDecoding, NeurIPS 2025): drafts from what the text
and earlier requests' outputs continued with, no model at all.

Two count tries of every substring up to ``max_depth`` tokens long:

* a request's own (its prompt and its output so far), made when it joins and extended as it
  decodes;
* a global one over the outputs of every request of this engine, running ones included, so
  a later request (the next turn of an agentic loop, the same query pattern) drafts from what
  earlier ones wrote. Its size is capped in tokens (``cache_tokens``): the oldest requests'
  outputs are taken out first.

Each step, for each trie, the longest suffix of the row's text that occurred before with a
continuation is found (up to ``max_depth - 1`` tokens); from there the trie's most frequent
continuations grow a tree best-first, a node's probability being its count over its
siblings' times its parent's. Nodes below ``min_prob`` are not drafted, and a match of m
tokens drafts at most ``spec_factor * m`` nodes (never more than k): a short match is
weak evidence. Of the two tries' trees the one with the larger expected accepted length (the
sum of its nodes' probabilities) is drafted. The drafts are deterministic, point masses, so
the tree rules accept them exactly at any temperature.

A batch of several rows drafts each row's most probable chain (grown with the whole budget,
padded by repeating its last token), since rows share one tree shape in a verify pass; a lone
request drafts its whole tree. The match leaves k tokens of the trie's depth below it, so a
long repetition still drafts k deep.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

import torch

from quickdraft.config import MethodOptions, SpecConfig, check_range
from quickdraft.drafters.base import Batch, BuildContext, Draft, Needs, StepResult

MAX_DEPTH = 64


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
        depth = self.depth
        for token in tokens:
            grown = [self.root]
            for length, node in enumerate(cursor):
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = Node()
                child.count += 1
                if length + 1 < depth:
                    grown.append(child)
            cursor = grown
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


@dataclass(frozen=True, slots=True)
class Proposal:
    """A draft tree: tokens and parents (-1: the pending token's children), best first, and
    the sum of the nodes' probabilities (the expected accepted length, if the counts were
    the target's probabilities)."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    score: float = 0.0


def chain(node: Node, budget: int, min_prob: float) -> Proposal:
    """The most probable continuation of ``node``, a token at a time, up to ``budget`` tokens
    and while its probability stays at least ``min_prob``."""
    tokens: list[int] = []
    score = 0.0
    prob = 1.0
    while node.children and len(tokens) < budget:
        total = sum(child.count for child in node.children.values())
        token, child = max(node.children.items(), key=lambda item: item[1].count)
        prob *= child.count / total
        if prob < min_prob:
            break
        tokens.append(token)
        score += prob
        node = child
    return Proposal(tuple(tokens), tuple(range(-1, len(tokens) - 1)), score)


def grow(node: Node, budget: int, min_prob: float) -> Proposal:
    """Up to ``budget`` continuations of ``node``, most probable first, none below
    ``min_prob``; parents before children."""
    tokens: list[int] = []
    parents: list[int] = []
    score = 0.0
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
        score -= neg
        push(child, len(tokens) - 1, -neg)
    return Proposal(tuple(tokens), tuple(parents), score)


@dataclass(frozen=True, slots=True)
class SuffixOptions(MethodOptions):
    """suffix_max_depth: the longest substring counted (the match is at most one less);
    suffix_spec_factor: draft nodes per matched token (the paper's ``max_spec_factor``);
    suffix_min_prob: the least probability a drafted node may have (``min_token_prob``);
    suffix_cache_tokens: the global trie's cap in output tokens, oldest requests out first.
    ``num_speculative_tokens`` caps the nodes a step drafts."""

    suffix_max_depth: int = 24
    suffix_spec_factor: float = 1.0
    suffix_min_prob: float = 0.1
    suffix_cache_tokens: int = 1_000_000

    def __post_init__(self) -> None:
        check_range("suffix_max_depth", self.suffix_max_depth, 2, MAX_DEPTH, integer=True)
        check_range("suffix_spec_factor", self.suffix_spec_factor, 0.1, 64.0)
        check_range("suffix_min_prob", self.suffix_min_prob, 0.0, 1.0)
        check_range("suffix_cache_tokens", self.suffix_cache_tokens, 0, 10**9, integer=True)


class SuffixDrafter:
    """Suffix decoding as a drafter. The global trie lives on the drafter, so it spans every
    request of the engine; per slot it keeps the request's own trie, cursors and what of the
    text they have read."""

    head_rows = 0  # no head: counts of earlier text

    def __init__(self, vocab_size: int, num_tokens: int, options: SuffixOptions | None = None):
        options = options or SuffixOptions()
        check_range("num_speculative_tokens", num_tokens, 1, 256, integer=True)
        self.vocab_size = vocab_size
        self.num_tokens = num_tokens
        self.options = options
        self.needs = Needs(tokens=num_tokens, depth=num_tokens)
        self.shared = SuffixTrie(options.suffix_max_depth)
        self.retired: deque[list[int]] = deque()  # outputs of requests that left, oldest first
        self.own: list[SuffixTrie | None] = []
        self.own_cursor: list[list[Node]] = []
        self.shared_cursor: list[list[Node]] = []
        self.output: list[list[int]] = []  # each slot's output in the shared trie
        self.seen: list[int] = []  # text length each slot's tries have read

    def describe(self) -> str:
        options = self.options
        return (
            f"k<={self.num_tokens} depth={options.suffix_max_depth} "
            f"factor={options.suffix_spec_factor:g} p>={options.suffix_min_prob:g}"
        )

    def reserve(self, rows: int, capacity: int) -> None:
        """Fresh per-slot state (a new engine); the outputs the slots held stay in the shared
        trie as retired ones, evicted in turn."""
        self.retired.extend(output for output in self.output if output)
        self._evict()
        self.own = [None] * rows
        self.own_cursor = [[] for _ in range(rows)]
        self.shared_cursor = [[] for _ in range(rows)]
        self.output = [[] for _ in range(rows)]
        self.seen = [0] * rows

    def begin(self, start: StepResult) -> None:
        """Each joining request gets a trie of its prompt; whatever output the slot's last
        request left in the shared trie is retired (evicted oldest first past the cap)."""
        batch = start.batch
        texts, lengths = batch.tokens.cpu(), batch.lengths.tolist()
        for b, slot in enumerate(batch.slots.host):
            if self.output[slot]:
                self.retired.append(self.output[slot])
            trie = SuffixTrie(self.options.suffix_max_depth)
            prompt = texts[b, : lengths[b]].tolist()
            self.own[slot] = trie
            self.own_cursor[slot] = trie.extend(trie.cursor(), prompt)
            self.shared_cursor[slot] = self.shared.cursor()
            self.output[slot] = []
            self.seen[slot] = lengths[b]
        self._evict()

    def observe(self, result: StepResult) -> None:
        """The tokens each row kept go into its own trie and the shared one."""
        batch = result.batch
        lengths = batch.lengths.tolist()
        lo = min(self.seen[slot] for slot in batch.slots.host)
        texts = batch.tokens[:, lo : max(lengths)].cpu()
        for b, slot in enumerate(batch.slots.host):
            new = texts[b, self.seen[slot] - lo : lengths[b] - lo].tolist()
            if not new:
                continue
            trie = self.own[slot]
            assert trie is not None  # begin came first
            self.own_cursor[slot] = trie.extend(self.own_cursor[slot], new)
            self.shared_cursor[slot] = self.shared.extend(self.shared_cursor[slot], new)
            self.output[slot].extend(new)
            self.seen[slot] = lengths[b]
        self._evict()

    def _evict(self) -> None:
        cap = self.options.suffix_cache_tokens
        while self.shared.tokens > cap and self.retired:
            self.shared.remove(self.retired.popleft())

    @property
    def cached_tokens(self) -> int:
        return self.shared.tokens

    def proposal(self, slot: int, text: list[int], tree: bool = True) -> Proposal:
        """The better of the request's and the shared trie's drafts for a row's text: a
        tree, or (``tree=False``) the most probable chain."""
        options = self.options
        best = Proposal()
        trie = self.own[slot]
        room = min(self.num_tokens, options.suffix_max_depth - 1)
        for source in (trie, self.shared):
            if source is None:
                continue
            node, length = source.match(text, room)
            if node is None:
                continue
            budget = min(self.num_tokens, int(options.suffix_spec_factor * length))
            if budget < 1:
                continue
            found = (grow if tree else chain)(node, budget, options.suffix_min_prob)
            if found.score > best.score:
                best = found
        return best

    def propose(self, batch: Batch) -> Draft:
        lengths = batch.lengths.tolist()
        depth = self.options.suffix_max_depth
        lo = max(0, min(lengths) - depth)
        texts = batch.tokens[:, lo : max(lengths)].cpu()
        found = [
            self.proposal(
                slot,
                texts[b, max(0, lengths[b] - depth - lo) : lengths[b] - lo].tolist(),
                tree=batch.size == 1,
            )
            for b, slot in enumerate(batch.slots.host)
        ]
        device = batch.tokens.device
        if batch.size == 1:
            tree = found[0]
            if not tree.tokens:
                return Draft.empty(1, device)
            tokens = torch.tensor([tree.tokens], dtype=torch.long, device=device)
            return Draft.from_parents(tokens, list(tree.parents))
        paths = [list(p.tokens) for p in found]  # chains
        width = max(map(len, paths))
        if width == 0:
            return Draft.empty(batch.size, device)
        rows = []
        for b, path in enumerate(paths):
            # Any deterministic filler keeps the output exact; the target rejects it.
            last = path[-1] if path else int(texts[b, lengths[b] - 1 - lo])
            rows.append(path + [last] * (width - len(path)))
        return Draft.chain(torch.tensor(rows, dtype=torch.long, device=device))


def build(spec: SpecConfig, context: BuildContext) -> SuffixDrafter:
    """The registry's builder: ``spec.options`` are ``SuffixOptions``."""
    options = spec.options
    assert isinstance(options, SuffixOptions)
    return SuffixDrafter(context.target.vocab_size, spec.num_speculative_tokens, options)
