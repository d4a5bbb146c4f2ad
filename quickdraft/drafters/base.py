"""The drafter contract: what a drafter declares (``Needs``), what it reads before it drafts
(``Batch``) and after the target verified (``StepResult``), and what it returns (``Draft``).

The engine knows no drafter by name and never probes one: everything a method needs from the
target or the step is declared once in ``needs`` and arrives in these values.

Slots. The engine gives every request one slot for its whole life: one row of each of its
per-row tables (the target's cache, its token buffer), and of every drafter's per-row state. A
``Batch`` names the slots it covers (``Batch.slots``, in batch order: row b of the batch is slot
``slots.host[b]``); they need not be contiguous, as requests leave wherever they sit and join
in the lowest free slot. Nothing ever moves between slots: a drafter reads and writes its
per-row state at ``batch.slots`` (``Slots.take``/``Slots.put`` give views when the slots are
contiguous; ``Cache.select`` gives a cache view of them), prepares a slot afresh in ``begin``
and may leave what a finished request kept there, since the next ``begin`` of that slot
overwrites it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from quickdraft.config import SamplingParams
from quickdraft.models.base import Slots
from quickdraft.tree import TreeShape

if TYPE_CHECKING:
    from quickdraft.models.base import Model
    from quickdraft.vocab.shortlist import Shortlist


@dataclass(frozen=True, slots=True)
class Needs:
    """What a drafter reads from the engine and how much room its drafts take.

    tokens:      the most draft nodes one step proposes (the verify pass's width, less one).
    depth:       the most draft positions one verify step can accept (k for a chain).
    hidden:      whether it reads the target's final hidden states (``StepResult.hidden``).
    taps:        target decoder layers whose outputs it reads (``StepResult.taps``).
    side_tokens: the most side-branch tokens (``SideBranch``) it sends a step.
    shortens:    whether it honours ``Batch.limit`` (a draft of at most that many tokens),
                 so the engine may choose each step's k (adaptive k).
    scored:      whether its drafts carry scores (``Draft.scores``) from what each draft rests
                 on and cost little beside a verify step (a lookup): draft sizing then asks
                 for its whole draft every step and keeps what each one's scores say pays,
                 where for one that only ``shortens`` it chooses k beforehand from the
                 request's running acceptance.
    text_draft:  whether, asked with ``Batch.text_only``, it drafts from the text alone: a
                 scored chain at a lookup's cost (EAGLE's grafted prompt lookup without its
                 network). Draft sizing asks for one, judged by its scores, on steps where
                 the drafter's own drafts rest for not paying.
    caps_depth:  whether it honours ``Batch.max_depth`` (no node deeper than that), so the
                 engine may spare a tree drafter the levels it would cut from its drafts.
    resumes:     for a drafter that reads features (``hidden``, ``taps``): whether it keeps,
                 per slot, what it made of the slot's last text, so the engine may reuse a
                 slot's cached prefix (prefix caching) for it too. It then says how much with
                 ``resumable()`` ([slots]: the leading positions of each slot's last text it
                 holds), and a request that reuses r cached tokens joins with the features of
                 the rest only (``StepResult.kept`` = prompt - 1 - r); a drafter's state past
                 r is to be dropped at ``begin``. Drafters that read no features resume
                 always (they read the text).
    pooled:      whether its drafts may hold text of other requests (a trie or n-gram pool
                 kept across requests): a server then shows a client none of their tokens
                 the target rejected.
    """

    tokens: int
    depth: int
    hidden: bool = False
    taps: tuple[int, ...] = ()
    side_tokens: int = 0
    shortens: bool = False
    scored: bool = False
    text_draft: bool = False
    caps_depth: bool = False
    resumes: bool = False
    pooled: bool = False

    def __post_init__(self) -> None:
        if self.tokens < 0 or self.depth < 0 or self.depth > max(self.tokens, 0):
            raise ValueError(
                f"needs: 0 <= depth <= tokens, got depth {self.depth}, tokens {self.tokens}"
            )
        if self.side_tokens < 0:
            raise ValueError(f"needs: side_tokens must be >= 0, got {self.side_tokens}")


@dataclass(frozen=True, slots=True)
class Batch:
    """Some requests' rows (the running ones, for ``propose``), as a drafter reads them.

    tokens:     [B, capacity] long, each row's prompt then output; valid up to lengths[b]. The
                last valid token is *pending*: known, but not yet fed to the target, whose cache
                holds lengths - 1 entries.
    lengths:    [B] long.
    slots:      the slots of rows 0..B-1 (``Slots``): where each row's per-row state lives.
    sampling:   each row's sampling parameters.
    generators: each row's own generator (a seeded request), or None: such rows share
                ``generator``. ``sampling.sample_rows`` draws with them.
    generator:  the engine's generator for rows without their own.
    limit:      draft at most this many tokens this step (None: the drafter's own k); only
                drafters that declare ``Needs.shortens`` are handed one.
    max_depth:  draft no node deeper than this (depth 1: the pending token's children; None:
                the drafter's own depth); only drafters that declare ``Needs.caps_depth``
                are handed one.
    floor:      the least score (``Draft.scores``) a lone row's first token needs to be worth
                verifying (draft sizing's estimate; 0: any). A scored drafter may leave out
                what scores below it, sparing itself building a draft that would be refused.
    text_only:  draft from the text alone (``Needs.text_draft``): only drafters that declare
                it are asked so.
    matchers:   each row's grammar matcher (``constraints.Matcher``) when a request asks for
                structured output, else None (empty: no row does). A drafter that samples may
                draw from its own distribution masked to ``allowed()`` along its draft
                (advancing the matcher, and rolling it back before it returns); the engine
                masks the target at every node either way.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    slots: Slots
    sampling: tuple[SamplingParams, ...]
    generators: tuple[torch.Generator | None, ...]
    generator: torch.Generator
    limit: int | None = None
    max_depth: int | None = None
    floor: float = 0.0
    text_only: bool = False
    matchers: tuple[Any, ...] = ()

    @staticmethod
    def from_rows(
        rows: Sequence[Sequence[int]], sampling: SamplingParams | None = None, room: int = 64
    ) -> Batch:
        """A batch of these token rows (each row's last token pending) in slots 0..B-1, with
        ``room`` free positions after the longest, for driving a drafter by hand (tests,
        benchmarks)."""
        sampling = sampling or SamplingParams()
        tokens = torch.zeros(len(rows), max(len(r) for r in rows) + room, dtype=torch.long)
        for b, row in enumerate(rows):
            tokens[b, : len(row)] = torch.tensor(list(row), dtype=torch.long)
        lengths = torch.tensor([len(r) for r in rows])
        generator = torch.Generator().manual_seed(0 if sampling.seed is None else sampling.seed)
        slots = Slots.of(range(len(rows)))
        return Batch(
            tokens, lengths, slots, (sampling,) * len(rows), (None,) * len(rows), generator
        )

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1]


@dataclass(frozen=True, slots=True)
class StepResult:
    """What the target's last pass over some rows produced, for ``begin`` and ``observe``.

    batch:   those rows after the pass: tokens and lengths include what it committed.
    kept:    [B] long, target cache entries the pass kept per row: the tokens at positions
             lengths - 1 - kept .. lengths - 2 (after a prefill: the prompt but its last token;
             after a verify: the old pending token and the accepted drafts).
    hidden:  [B, M, D] the target's final hidden states at those tokens, in order (columns
             past kept[b] are padding); None unless ``Needs.hidden``.
    taps:    {layer: [B, M, D]}, the same positions of the declared ``Needs.taps``.
    accepted: [B] long, draft tokens the target accepted (None after a prefill).
    side_logits: [B, E, V], the target's logits at the draft's side branch; None without one.
    """

    batch: Batch
    kept: torch.Tensor
    hidden: torch.Tensor | None = None
    taps: dict[int, torch.Tensor] = field(default_factory=dict)
    accepted: torch.Tensor | None = None
    side_logits: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class SideBranch:
    """Tokens the target runs in the verify pass beside the draft, for the drafter's own use
    (lookahead decoding's Jacobi branch). They are never accepted, nothing of the draft sees
    them, and their cache entries are dropped; the target's logits at them come back in
    ``StepResult.side_logits``.

    tokens:  [B, E] long.
    offsets: [E] long, position offsets from the pending token.
    mask:    [E, E] bool, which side tokens each one attends to (itself included); every side
             token also sees the committed prefix and the pending token, never draft nodes.
    """

    tokens: torch.Tensor
    offsets: torch.Tensor
    mask: torch.Tensor


@dataclass(frozen=True, slots=True)
class Draft:
    """A proposal, batched over rows (the DESIGN contract with a leading batch dimension).

    tokens: [B, N] long.
    probs:  [B, N, V] float, the distribution each token was drawn from, or None when the
            drafter is deterministic (the acceptance rules then treat it as a point mass).
    tree:   the shape shared by the batch (``tree.TreeShape``: parents, mask, paths); None
            for a chain d_1 .. d_N.
    side:   a side branch for the drafter's own use, or None.
    scores: [B, N] float, the drafter's estimate of the chance the target accepts each node
            (its path: EAGLE's path probabilities), or None where it has none. Only draft
            sizing reads it (``engine.goodput``); no rule does.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    tree: TreeShape | None = None
    side: SideBranch | None = None
    scores: torch.Tensor | None = None

    @staticmethod
    def chain(tokens: torch.Tensor, probs: torch.Tensor | None = None) -> Draft:
        return Draft(tokens, probs)

    @staticmethod
    def empty(rows: int, device: torch.device | str = "cpu") -> Draft:
        return Draft(torch.zeros(rows, 0, dtype=torch.long, device=device))

    @staticmethod
    def from_parents(
        tokens: torch.Tensor,
        parents: Sequence[int] | torch.Tensor,
        probs: torch.Tensor | None = None,
        side: SideBranch | None = None,
        scores: torch.Tensor | None = None,
    ) -> Draft:
        """A tree draft from each node's parent (-1 for the root's children)."""
        return Draft(tokens, probs, TreeShape.from_parents(parents), side, scores)

    @property
    def parents(self) -> torch.Tensor:
        """[N] long, each node's parent, -1 for children of the pending token."""
        if self.tree is not None:
            return self.tree.parents
        return torch.arange(-1, self.tokens.shape[1] - 1)

    @property
    def depth(self) -> int:
        """Draft positions a verify of this draft can accept."""
        return self.tokens.shape[1] if self.tree is None else self.tree.max_depth

    def keep(self, nodes: torch.Tensor) -> Draft:
        """The draft with only the nodes ``nodes`` [N] bool marks (a kept node's parent is
        kept too) and its side branch. Exact for point-mass drafts, whose verify judges each
        node alone; a sampled tree's siblings are judged together, so it is not for them."""
        if bool(nodes.all()):
            return self
        if not bool(nodes.any()):  # a side branch needs a draft beside it: it stays whole
            return (
                self
                if self.side is not None
                else Draft.empty(self.tokens.shape[0], self.tokens.device)
            )
        index = nodes.nonzero().flatten()
        probs = None if self.probs is None else self.probs[:, index.to(self.tokens.device)]
        scores = self._scores_at(index)
        if self.tree is None:  # a chain keeps a prefix
            return Draft(self.tokens[:, : index.numel()], probs, None, self.side, scores)
        new_index = torch.full((self.tree.num_nodes,), -1, dtype=torch.long)
        new_index[index] = torch.arange(index.numel())
        old_parents = self.tree.parents[index]
        parents = torch.where(old_parents < 0, -1, new_index[old_parents.clamp_min(0)])
        tokens = self.tokens[:, index.to(self.tokens.device)]
        return Draft.from_parents(tokens, parents, probs, self.side, scores)

    def _scores_at(self, index: torch.Tensor) -> torch.Tensor | None:
        return None if self.scores is None else self.scores[:, index.to(self.scores.device)]

    def cut(self, depth: int) -> Draft:
        """The draft without its nodes deeper than ``depth`` (a chain's first ``depth``
        tokens), and without a side branch. Exact like any draft: the verify judges what is
        left."""
        if depth >= self.depth and self.side is None:
            return self
        if self.tree is None:
            probs = None if self.probs is None else self.probs[:, :depth]
            scores = None if self.scores is None else self.scores[:, :depth]
            return Draft(self.tokens[:, :depth], probs, scores=scores)
        keep = (self.tree.depth <= depth).nonzero().flatten()
        if keep.numel() == 0:
            return Draft.empty(self.tokens.shape[0], self.tokens.device)
        new_index = torch.full((self.tree.num_nodes,), -1, dtype=torch.long)
        new_index[keep] = torch.arange(keep.numel())
        old_parents = self.tree.parents[keep]
        parents = torch.where(old_parents < 0, -1, new_index[old_parents.clamp_min(0)])
        index = keep.to(self.tokens.device)
        probs = None if self.probs is None else self.probs[:, index]
        tokens = self.tokens[:, index]
        return Draft.from_parents(tokens, parents, probs, scores=self._scores_at(keep))


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What a method's builder may use besides its options: the target, a draft model
    (methods registered with ``draft_model=True``), whether the draft's tokenizer is the
    target's (None: unknown), and the aliases that find shipped artifacts."""

    target: Model
    draft: Model | None = None
    same_tokenizer: bool | None = None
    draft_name: str | None = None
    target_name: str | None = None


class Drafter(Protocol):
    """Proposes tokens for the target to verify; one fixed signature for every method.

    needs:             declared once (``Needs``).
    reserve(rows, capacity): allocate per-row state for ``rows`` slots of up to ``capacity``
                       tokens (the engine calls it once, before any begin).
    begin(start):      requests joined, in the slots ``start.batch.slots``; ``start`` covers
                       them with their prompt's prefill (``StepResult`` with kept = prompt - 1,
                       less the cached tokens a feature drafter that ``resumes`` keeps).
                       Whatever a slot held for an earlier request is to be overwritten.
    propose(batch):    a Draft for the running requests, in the slots ``batch.slots``.
    observe(result):   after the verify step committed, for every running request (in the
                       slots ``result.batch.slots``: the batch ``propose`` had, or would have
                       had on a step the batch policy left undrafted), before finished
                       requests leave.
    release(slot, completed): the request in ``slot`` left, ``completed`` (a stop or its
                       length) or not (aborted); before the slot's next ``begin``. What a
                       drafter learns across requests keeps only completed ones.
    """

    vocab_size: int
    needs: Needs
    head_rows: int | None  # vocabulary rows its head scores a token (0: no head; None: unknown)

    def reserve(self, rows: int, capacity: int) -> None: ...

    def begin(self, start: StepResult) -> None: ...

    def propose(self, batch: Batch) -> Draft: ...

    def describe(self) -> str:
        """The draft's shape in a few words, for the command line (``k=4``, a tree's size)."""
        ...

    def observe(self, result: StepResult) -> None: ...

    def release(self, slot: int, completed: bool) -> None: ...


def text_since(batch: Batch, seen: torch.Tensor) -> torch.Tensor:
    """The tokens each row gained past ``seen`` [B] (how much of its text a drafter read
    already), as one flat tensor: what a shortlist's context is extended with."""
    lo, hi = int(seen.min()), int(batch.lengths.max())  # host sync: the span to read
    index = torch.arange(lo, hi, device=seen.device)
    gained = (index >= seen.unsqueeze(1)) & (index < batch.lengths.unsqueeze(1))
    return batch.tokens[:, lo:hi][gained]


class ShortlistContext:
    """Keeps a shortlist's context (the running requests' text, for shortlists that add the
    sequence's own tokens) in step with the engine: a drafter calls ``begin`` when requests
    join and ``catch_up`` before it drafts. The context is shared by the running requests; a
    batch of requests that all joined since the last draft (a lone request, say) resets it.

    seen: per slot, the text length already read (0 for a request that joined since)."""

    def __init__(self, shortlist: Shortlist):
        self.shortlist = shortlist
        self.seen = torch.zeros(0, dtype=torch.long)
        self._joined: set[int] = set()  # slots that joined since the last catch_up

    def reserve(self, rows: int, device: torch.device) -> None:
        self.seen = torch.zeros(rows, dtype=torch.long, device=device)

    def begin(self, batch: Batch) -> None:
        """New requests in ``batch.slots``: their whole text joins at the next catch_up."""
        batch.slots.put(self.seen, 0)
        self._joined.update(batch.slots.host)

    def catch_up(self, batch: Batch) -> None:
        fresh = self._joined.issuperset(batch.slots.host)  # nobody read before is running
        text = text_since(batch, batch.slots.take(self.seen))
        (self.shortlist.begin if fresh else self.shortlist.extend)(text)
        batch.slots.put(self.seen, batch.lengths)
        self._joined.clear()


def pad_rows(chunks: list[list[torch.Tensor]]) -> torch.Tensor:
    """Each row's chunks of [M, D] features -> [B, max M, D], zero padded; a row may have
    none (a one-token prompt's prefill: [B, 0, 0] when no row has any)."""
    parts = [part for row in chunks for part in row]
    if not parts:
        return torch.zeros(len(chunks), 0, 0)
    empty = parts[0][:0]
    rows = [torch.cat(row) if row else empty for row in chunks]
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)


class Stateless:
    """The protocol's bookkeeping for drafters that keep nothing per request: reserve, begin
    and observe do nothing; the head is unknown and the description says the draft's size."""

    head_rows: int | None = None

    def describe(self) -> str:
        needs: Needs = self.needs  # type: ignore[attr-defined]  # every drafter declares it
        return f"up to {needs.tokens} draft tokens"

    def reserve(self, rows: int, capacity: int) -> None:
        """Nothing per row to allocate."""

    def begin(self, start: StepResult) -> None:
        """Nothing to prepare for a new request."""

    def observe(self, result: StepResult) -> None:
        """Nothing to learn from a step."""

    def release(self, slot: int, completed: bool) -> None:
        """Nothing kept per request."""


def shipped_folder(
    artifacts: Path, target_name: str | None, folder: str | Path | None, option: str, what: str
) -> Path:
    """The explicit ``folder``, else the one shipped for ``target_name`` under ``artifacts``;
    a ValueError naming ``option`` when neither exists. ``what``: the artifact's name and the
    command that trains it, for the message (``"Medusa heads", "medusa"``)."""
    if folder is not None:
        return Path(folder)
    shipped = artifacts / target_name if target_name else None
    if shipped is not None and shipped.parent == artifacts and shipped.is_dir():
        return shipped
    names = sorted(p.name for p in artifacts.iterdir() if p.is_dir()) if artifacts.is_dir() else []
    name, command = what.split(", ")
    raise ValueError(
        f"{option}: no {name} ship for target {target_name!r} (shipped: "
        f"{', '.join(names) or 'none'}); train them with 'quickdraft train {command}' and "
        "pass the folder"
    )
