"""The Model protocol every target and draft model implements, and the cache it writes into.

A forward pass writes the entries of its T new tokens into the cache slots right after each row's
committed length, but does not advance that length: the engine decides afterwards how many of them
to keep (``commit``). Rejected tokens are then simply never committed, and ``rollback`` moves the
pointer back when a caller wants to recompute entries it had kept.
"""

from __future__ import annotations

import copy
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


class Cache:
    """A preallocated per-row cache with a length pointer.

    lengths: [B] long, the committed entries of each row; slots at and past it hold scratch that a
    forward pass may have written and nobody has kept. Subclasses hold the actual buffers.
    """

    def __init__(self, batch_size: int, capacity: int, device: torch.device | str = "cpu"):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    def slots_for(self, num_new: int) -> torch.Tensor:
        """The slots a forward of num_new tokens writes: [B, T] = lengths + 0..T-1."""
        if int(self.lengths.max()) + num_new > self.capacity:
            raise ValueError(
                f"cache capacity {self.capacity} exceeded: a row holds "
                f"{int(self.lengths.max())} entries and {num_new} more were written"
            )
        return self.lengths.unsqueeze(1) + torch.arange(num_new, device=self.lengths.device)

    def commit(self, num_kept: torch.Tensor | int) -> None:
        """Keep the first num_kept ([B] or scalar) entries the last forward wrote."""
        self.lengths += num_kept

    def commit_path(self, path: torch.Tensor, num_kept: torch.Tensor) -> None:
        """Keep the tree nodes ``path`` ([B, n] indices into the last forward's T tokens, root
        first) as the next entries of each row and advance each pointer by num_kept[b] ([B]);
        columns past a row's num_kept are scratch. Caches of models that verify trees."""
        raise ValueError(f"{type(self).__name__}: this model's cache keeps chain drafts only")

    # -- rows: the engine keeps one request per row and moves requests between rows --------

    def narrow(self, start: int, count: int) -> Cache:
        """A view of rows start..start+count-1 sharing this cache's storage: forwards and
        commits through it write here."""
        view = copy.copy(self)
        view.lengths = self.lengths[start : start + count]
        view._narrow_buffers(start, count)
        return view

    def _narrow_buffers(self, start: int, count: int) -> None:
        """Subclasses narrow their buffers to the rows of a view."""
        raise ValueError(f"{type(self).__name__}: this model's cache holds one row")

    def permute(self, first: int, order: torch.Tensor) -> None:
        """Rows first..first+n-1 take the entries and lengths of rows ``order`` ([n] long,
        absolute row indices; all are read before any is written, so any mapping works, a
        permutation of those rows or a gather from others). Only rows that change are copied,
        and only their committed entries."""
        rows = torch.arange(first, first + order.shape[0], device=order.device)
        moved = order != rows
        if not bool(moved.any()):
            return
        dst, src = rows[moved], order[moved]
        count = int(self.lengths[src].max())
        if count:
            self._copy_rows(src, dst, count)
        self.lengths[dst] = self.lengths[src].clone()

    def _copy_rows(self, src: torch.Tensor, dst: torch.Tensor, count: int) -> None:
        """Subclasses copy the first ``count`` entries of rows src into rows dst (at once:
        the two may overlap as a permutation does)."""
        raise ValueError(f"{type(self).__name__}: this model's cache holds one row")

    def rollback(self, lengths: torch.Tensor | int) -> None:
        """Move each row's pointer back to ``lengths`` ([B] or scalar); never forward."""
        target = torch.as_tensor(lengths, device=self.lengths.device).expand_as(self.lengths)
        if bool((target > self.lengths).any()) or bool((target < 0).any()):
            raise ValueError("rollback: lengths must lie between 0 and the committed length")
        self.lengths.copy_(target)


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
