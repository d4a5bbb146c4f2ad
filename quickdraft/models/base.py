"""The Model protocol every target and draft model implements, and the cache it writes into.

A forward pass writes the entries of its T new tokens at the positions right after each row's
committed length, but does not advance that length: the engine decides afterwards how many of them
to keep (``commit``). Rejected tokens are then simply never committed, and ``rollback`` moves the
pointer back when a caller wants to recompute entries it had kept.

A row of the cache is a *slot*: the engine gives each request one for its whole life, and a batch
names the slots it covers (``Slots``), so requests joining and leaving never move anything.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True, slots=True)
class ModelOutput:
    """logits: [B, T, V] float; hidden: [B, T, D] final hidden states; taps: chosen
    intermediate layers' outputs [B, T, D] by layer index (empty unless the model was asked)."""

    logits: torch.Tensor
    hidden: torch.Tensor
    taps: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Slots:
    """Slots in batch order: the rows of every per-row table (a cache, the engine's token
    table, a drafter's state) that a batch covers. A request keeps one slot for its life.

    index: [B] long, on the device of the tables it addresses.
    host:  the same slots on the host, for host-side state and for ``first`` (no sync).
    first: the first slot when they are first, first + 1, .. (tables then give views, no
           copies); None when they have holes or are out of order.
    """

    index: torch.Tensor
    host: tuple[int, ...]
    first: int | None = field(init=False)

    def __post_init__(self) -> None:
        host = self.host
        if self.index.shape != (len(host),):
            raise ValueError(f"slots: index of shape {list(self.index.shape)} for {len(host)}")
        contiguous = bool(host) and host == tuple(range(host[0], host[0] + len(host)))
        object.__setattr__(self, "first", host[0] if contiguous else None)

    @staticmethod
    def of(host: Sequence[int], device: torch.device | str = "cpu") -> Slots:
        host = tuple(int(s) for s in host)
        return Slots(torch.tensor(host, dtype=torch.long, device=device), host)

    def __len__(self) -> int:
        return len(self.host)

    def _index_on(self, device: torch.device) -> torch.Tensor:
        if self.index.device == device:
            return self.index
        return torch.tensor(self.host, dtype=torch.long, device=device)  # a host-side table

    def take(self, table: torch.Tensor) -> torch.Tensor:
        """These rows of ``table`` [slots, ...] as [B, ...]: a view when the slots are
        contiguous, else a copy. Write rows back with ``put``, never through the result."""
        if self.first is not None:
            return table[self.first : self.first + len(self)]
        return table.index_select(0, self._index_on(table.device))

    def put(self, table: torch.Tensor, values: torch.Tensor | float) -> None:
        """Write ``values`` ([B, ...], or a number for every entry) into these rows."""
        if self.first is not None:
            table[self.first : self.first + len(self)] = values
        else:
            table[self._index_on(table.device)] = values


class Cache:
    """A preallocated cache with a length pointer per slot (row).

    lengths: [B] long, the committed entries of each row; positions at and past it hold scratch
    that a forward pass may have written and nobody has kept. Subclasses hold the actual buffers.

    Views. ``narrow`` and ``select`` give a cache over some rows that forwards and commits
    write through. A narrow view (contiguous rows) shares the buffers and the lengths. A
    gathered view (``select`` of slots with holes) addresses the full buffers by slot index:
    forwards write entries straight into the slots' rows and read them gathered; its lengths
    are a copy, written back to the slots' lengths by every ``commit``, ``commit_path`` and
    ``rollback`` (the only ways to change them through a view).
    """

    def __init__(self, batch_size: int, capacity: int, device: torch.device | str = "cpu"):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        # A gathered view's (lengths of the cache it came from, its slots there); else None.
        self._gathered_from: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    def slots_for(self, num_new: int) -> torch.Tensor:
        """The positions a forward of num_new tokens writes: [B, T] = lengths + 0..T-1."""
        if int(self.lengths.max()) + num_new > self.capacity:
            raise ValueError(
                f"cache capacity {self.capacity} exceeded: a row holds "
                f"{int(self.lengths.max())} entries and {num_new} more were written"
            )
        return self.lengths.unsqueeze(1) + torch.arange(num_new, device=self.lengths.device)

    def commit(self, num_kept: torch.Tensor | int) -> None:
        """Keep the first num_kept ([B] or scalar) entries the last forward wrote."""
        self.lengths += num_kept
        self._store_lengths()

    def commit_path(self, path: torch.Tensor, num_kept: torch.Tensor | None = None) -> None:
        """Keep the tree nodes ``path`` ([B, n] indices into the last forward's T tokens, root
        first) as the next entries of each row and advance each pointer by num_kept[b] ([B],
        default n); columns past a row's num_kept are moved too, as scratch. Caches of models
        that verify trees."""
        self._keep_path(path)
        self.lengths += path.shape[1] if num_kept is None else num_kept
        self._store_lengths()

    def _keep_path(self, path: torch.Tensor) -> None:
        """Subclasses move the entries at lengths + path to lengths + 0..n-1."""
        raise ValueError(f"{type(self).__name__}: this model's cache keeps chain drafts only")

    def rollback(self, lengths: torch.Tensor | int) -> None:
        """Move each row's pointer back to ``lengths`` ([B] or scalar); never forward."""
        target = torch.as_tensor(lengths, device=self.lengths.device).expand_as(self.lengths)
        if bool((target > self.lengths).any()) or bool((target < 0).any()):
            raise ValueError("rollback: lengths must lie between 0 and the committed length")
        self.lengths.copy_(target)
        self._store_lengths()

    # -- views: the rows of some slots ------------------------------------------------------

    def narrow(self, start: int, count: int) -> Cache:
        """A view of rows start..start+count-1 sharing this cache's storage: forwards and
        commits through it write here."""
        if self._gathered_from is not None:
            raise ValueError("narrow: a gathered view has no contiguous rows")
        view = copy.copy(self)
        view.lengths = self.lengths[start : start + count]
        view._narrow_buffers(start, count)
        return view

    def select(self, slots: Slots) -> Cache:
        """A view of the rows ``slots`` that forwards and commits write through: ``narrow``
        (no copy) when they are contiguous, else a gathered view (see the class)."""
        if slots.first is not None:
            return self.narrow(slots.first, len(slots))
        if self._gathered_from is not None:
            raise ValueError("select: a gathered view cannot be gathered again")
        index = slots.index.to(self.lengths.device)
        view = copy.copy(self)
        view.lengths = self.lengths.index_select(0, index)
        view._gathered_from = (self.lengths, index)
        view._select_buffers(index)
        return view

    def _store_lengths(self) -> None:
        """A gathered view's lengths back to its slots' (a narrow view shares them)."""
        if self._gathered_from is not None:
            lengths, index = self._gathered_from
            lengths.index_copy_(0, index, self.lengths)

    def _narrow_buffers(self, start: int, count: int) -> None:
        """Subclasses narrow their buffers to the rows of a view."""
        raise ValueError(f"{type(self).__name__}: this model's cache holds one row")

    def _select_buffers(self, index: torch.Tensor) -> None:
        """Subclasses keep their full buffers and address the rows ``index`` ([B] long)."""
        raise ValueError(f"{type(self).__name__}: this model's cache holds one row")


@runtime_checkable
class Model(Protocol):
    """What the engine needs from a language model, whatever its family or backend.

    name: the alias the model was loaded from (``load_model``), which finds the drafters
    shipped for it; None for any other model. device: where its weights and caches live; the
    engine keeps every tensor of its loop there."""

    vocab_size: int
    max_positions: int
    name: str | None
    device: torch.device

    def new_cache(self, batch_size: int, capacity: int) -> Cache:
        """An empty cache for ``batch_size`` rows of at most ``capacity`` tokens."""
        ...

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: Cache,
        tree_mask: torch.Tensor | None = None,
    ) -> ModelOutput:
        """tokens, positions: [B, T] long; tree_mask: [T, L+T] bool or None for causal."""
        ...


@runtime_checkable
class FeatureModel(Model, Protocol):
    """A model whose parts feature-level drafters (EAGLE, Medusa, shortlists) read: the native
    runner and the models pruned from it. Declared, so that nothing probes with hasattr.

    embed:       [V, D] the input embedding (row i embeds token i).
    head_weight: [V, D] the output head's rows (the embedding when tied).
    int8:        whether its projections run in int8 (shortlists pack their rows alike).
    head(hidden [.., D]) -> logits [.., V].
    body(tokens, positions, cache, tree_mask) -> (final hidden [B, T, D], taps): ``forward``
        without the head.
    with_taps(layers) -> a view of the same weights that also returns those decoder layers'
        outputs in ``ModelOutput.taps``.
    """

    embed: torch.Tensor
    head_weight: torch.Tensor
    int8: bool

    def head(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def body(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: Cache,
        tree_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]: ...

    def with_taps(self, layers: tuple[int, ...]) -> FeatureModel: ...


@runtime_checkable
class Tokenizer(Protocol):
    """Text to token ids and back. ``eos_token_ids``: the ids that end a reply (generation
    stops at them unless ``SamplingParams.ignore_eos``); empty when there are none."""

    eos_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...
