"""The suffix-decoding drafter: a trie per request and one shared by the engine's requests
(the method's description is the package's docstring)."""

from __future__ import annotations

import dataclasses
from collections import deque

import torch

from quickdraft.config import SpecConfig, check_range
from quickdraft.drafters.base import Batch, BuildContext, Draft, Needs, StepResult
from quickdraft.drafters.suffix.options import SuffixOptions
from quickdraft.drafters.suffix.trie import Node, Proposal, SuffixTrie, chain, grow, longest

# A suffix draft's chance to land: its first token's by the length of the match it grew from
# (1 .. 6 or more), each later token's given its parent LATER, where the text went on that way
# every time; times the square of the node's share of its parent's count where it did not
# (those land a quarter to a third as often). Measured on SmolLM2-135M's greedy text for
# held-out prompts (benchmarks/lookup_odds.py, benchmarks/results/lookup_odds.md); draft
# sizing scales them by what a request's drafts land.
MATCHED = (0.34, 0.61, 0.72, 0.75, 0.87, 0.92)
LATER = 0.92


def best_first(node: Node, matched: int) -> float:
    """The chance of the likeliest first token a match of ``matched`` tokens at ``node``
    drafts (``chances``'s first node), without drafting it."""
    counts = [child.count for child in node.children.values()]
    share = max(counts) / sum(counts)
    return MATCHED[min(max(matched, 1), len(MATCHED)) - 1] * share * share


def chances(proposal: Proposal) -> list[float]:
    """Each node's chance to land with its path (``Draft.scores``), as ``MATCHED`` says."""
    first = MATCHED[min(max(proposal.matched, 1), len(MATCHED)) - 1]
    found: list[float] = []
    for parent, prob in zip(proposal.parents, proposal.probs, strict=True):
        above, share = (1.0, prob) if parent < 0 else (found[parent], prob / proposal.probs[parent])
        found.append(above * (first if parent < 0 else LATER) * share * share)
    return found


class SuffixDrafter:
    """Suffix decoding as a drafter. The global tries live on the drafter, so they span every
    request of the engine: one per tenant (``SamplingParams.tenant``), or one for all with
    ``suffix_cross_tenant``; per slot it keeps the request's own trie, cursors and what of the
    text they have read. The cap on their tokens is one for them all."""

    head_rows = 0  # no head: counts of earlier text

    def __init__(self, vocab_size: int, num_tokens: int, options: SuffixOptions | None = None):
        options = options or SuffixOptions()
        check_range("num_speculative_tokens", num_tokens, 1, 256, integer=True)
        self.vocab_size = vocab_size
        self.num_tokens = num_tokens
        self.options = options
        self.needs = Needs(
            tokens=num_tokens, depth=num_tokens, shortens=True, scored=True, pooled=True
        )
        self.shared: dict[str | None, SuffixTrie] = {}  # tenant -> its global trie
        # (tenant, output) of requests that left, oldest first
        self.retired: deque[tuple[str | None, list[int]]] = deque()
        self.tenant: list[str | None] = []  # each slot's request's tenant (its global trie)
        self.own: list[SuffixTrie | None] = []
        self.own_cursor: list[list[Node]] = []
        self.shared_cursor: list[list[Node]] = []
        self.output: list[list[int]] = []  # each slot's output in the shared trie
        self.seen: list[int] = []  # text length each slot's tries have read
        self.lookups = self.hits = 0  # rows' proposals so far, and those that drafted

    def describe(self) -> str:
        options = self.options
        return (
            f"k<={self.num_tokens} depth={options.suffix_max_depth} "
            f"factor={options.suffix_spec_factor:g} p>={options.suffix_min_prob:g}"
        )

    def reserve(self, rows: int, capacity: int) -> None:
        """Fresh per-slot state (a new engine); the outputs the slots held stay in the shared
        trie as retired ones, evicted in turn."""
        self.retired.extend(
            (tenant, output)
            for tenant, output in zip(self.tenant, self.output, strict=True)
            if output
        )
        self._evict()
        self.tenant = [None] * rows
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
                self.retired.append((self.tenant[slot], self.output[slot]))
            trie = SuffixTrie(self.options.suffix_max_depth)
            prompt = texts[b, : lengths[b]].tolist()
            self.own[slot] = trie
            self.own_cursor[slot] = trie.extend(trie.cursor(), prompt)
            tenant = None if self.options.suffix_cross_tenant else batch.sampling[b].tenant
            self.tenant[slot] = tenant
            self.shared_cursor[slot] = self._shared(tenant).cursor()
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
            shared = self._shared(self.tenant[slot])
            self.shared_cursor[slot] = shared.extend(self.shared_cursor[slot], new)
            self.output[slot].extend(new)
            self.seen[slot] = lengths[b]
        self._evict()

    def release(self, slot: int, completed: bool) -> None:
        """A completed request's output is retired (it stays until the cap takes it); an
        aborted one's partial output leaves the shared trie now."""
        output, tenant = self.output[slot], self.tenant[slot]
        if completed and output:
            self.retired.append((tenant, output))
        elif output:
            self._remove(tenant, output)
        self.output[slot] = []
        self._evict()

    def _shared(self, tenant: str | None) -> SuffixTrie:
        """The global trie of ``tenant`` (made when it first comes)."""
        trie = self.shared.get(tenant)
        if trie is None:
            trie = self.shared[tenant] = SuffixTrie(self.options.suffix_max_depth)
        return trie

    def _remove(self, tenant: str | None, output: list[int]) -> None:
        """Take an output out of its tenant's trie (an empty trie stays: running requests'
        cursors may stand at its root)."""
        self.shared[tenant].remove(output)

    def _evict(self) -> None:
        cap = self.options.suffix_cache_tokens
        while self.cached_tokens > cap and self.retired:
            self._remove(*self.retired.popleft())

    @property
    def cached_tokens(self) -> int:
        """Tokens in the global tries, all tenants'."""
        return sum(trie.tokens for trie in self.shared.values())

    def proposal(
        self,
        slot: int,
        text: list[int],
        tree: bool = True,
        limit: int | None = None,
        whole: int | None = None,
        floor: float = 0.0,
    ) -> Proposal:
        """The better of the request's and the shared trie's drafts for a row's text (its
        last tokens; ``whole``: the length of all of it, where known): a tree, or
        (``tree=False``) the most probable chain; of at most ``limit`` tokens, none whose
        first token's chance falls below ``floor`` (``Batch.floor``)."""
        options = self.options
        best = Proposal()
        trie = self.own[slot]
        most = min(self.num_tokens, limit or self.num_tokens)
        room = min(most, options.suffix_max_depth - 1)
        # Once the tries read all of the text (``observe``), their cursors hold the nodes of
        # its suffixes: a match is a walk down a cursor, not a walk of a trie per length. The
        # shared trie's has read the output only: it serves once every suffix a match may
        # take lies in the output.
        top = options.suffix_max_depth - room
        read = whole is not None and self.seen[slot] == whole
        cursors = (
            self.own_cursor[slot] if read else None,
            self.shared_cursor[slot] if read and len(self.output[slot]) >= top else None,
        )
        for source, cursor in zip((trie, self.shared.get(self.tenant[slot])), cursors, strict=True):
            if source is None:
                continue
            if cursor is not None:
                node, length = longest(cursor, top)
            else:
                node, length = source.match(text, room)
            if node is None:
                continue
            budget = min(most, int(options.suffix_spec_factor * length))
            if budget < 1 or best_first(node, length) < floor:
                continue
            found = (grow if tree else chain)(node, budget, options.suffix_min_prob)
            if found.score > best.score:
                best = dataclasses.replace(found, matched=length)
        return best

    def proposals(self, batch: Batch) -> list[Proposal]:
        """Each row's proposal: a tree when the batch is one row, else a chain (rows share
        one draft shape)."""
        lengths = batch.lengths.tolist()
        depth = self.options.suffix_max_depth
        lo = max(0, min(lengths) - depth)
        texts = batch.tokens[:, lo : max(lengths)].cpu()
        found = [
            self.proposal(
                slot,
                texts[b, max(0, lengths[b] - depth - lo) : lengths[b] - lo].tolist(),
                tree=batch.size == 1,
                limit=batch.limit,
                whole=lengths[b],
                floor=batch.floor,
            )
            for b, slot in enumerate(batch.slots.host)
        ]
        self.lookups += len(found)
        self.hits += sum(1 for p in found if p.tokens)
        return found

    def propose(self, batch: Batch) -> Draft:
        return self.draft(batch, self.proposals(batch))

    @staticmethod
    def draft(batch: Batch, found: list[Proposal]) -> Draft:
        """The batch's draft from its rows' proposals, scored (``chances``)."""
        device = batch.tokens.device
        if batch.size == 1:
            tree = found[0]
            if not tree.tokens:
                return Draft.empty(1, device)
            tokens = torch.tensor([tree.tokens], dtype=torch.long, device=device)
            scores = torch.tensor([chances(tree)], device=device)
            return Draft.from_parents(tokens, list(tree.parents), scores=scores)
        paths = [list(p.tokens) for p in found]  # chains
        width = max(map(len, paths))
        if width == 0:
            return Draft.empty(batch.size, device)
        rows, scores = [], torch.zeros(batch.size, width)
        lengths = batch.lengths.tolist()
        for b, path in enumerate(paths):
            # Any deterministic filler keeps the output exact; the target rejects it.
            last = path[-1] if path else int(batch.tokens[b, lengths[b] - 1])
            rows.append(path + [last] * (width - len(path)))
            scores[b, : len(path)] = torch.tensor(chances(found[b]))
        tokens = torch.tensor(rows, dtype=torch.long, device=device)
        return Draft(tokens, scores=scores.to(device))

    def gauges(self) -> dict[str, float]:
        """For a server's metrics: the shared trie's size, and the rows' lookups so far and
        how many found a draft (hit rate: hits / lookups)."""
        return {
            "suffix_cache_tokens": self.cached_tokens,
            "suffix_lookups": self.lookups,
            "suffix_hits": self.hits,
        }


def build(spec: SpecConfig, context: BuildContext) -> SuffixDrafter:
    """The registry's builder: ``spec.options`` are ``SuffixOptions``."""
    options = spec.options
    assert isinstance(options, SuffixOptions)
    return SuffixDrafter(context.target.vocab_size, spec.num_speculative_tokens, options)
