"""A preallocated key/value cache with a per-row length pointer (gpt-fast's KVCache, batched).

Layout: keys and values are [layers, B, capacity, kv_heads, head_dim], so that writing the T new
entries of every row is one indexed assignment whatever each row's length is. A forward writes
at lengths .. lengths + T - 1; ``commit`` keeps a prefix of them, ``commit_path`` keeps the nodes
of an accepted tree path (moving them next to the prefix first), and anything past the pointer is
scratch that attention never reads.
"""

from __future__ import annotations

import torch

from quickdraft.models.base import Cache


class KVCache(Cache):
    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        capacity: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        super().__init__(batch_size, capacity, device)
        shape = (num_layers, batch_size, capacity, num_kv_heads, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self._rows = torch.arange(batch_size, device=device).unsqueeze(1)

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor
    ) -> None:
        """keys, values: [B, T, kv_heads, head_dim]; slots: [B, T] from ``slots_for``."""
        self.keys[layer][self._rows, slots] = keys
        self.values[layer][self._rows, slots] = values

    def view(self, layer: int, used: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``used`` slots of a layer as [B, kv_heads, used, head_dim]."""
        return (
            self.keys[layer, :, :used].transpose(1, 2),
            self.values[layer, :, :used].transpose(1, 2),
        )

    def commit_path(self, path: torch.Tensor, num_kept: torch.Tensor | None = None) -> None:
        """Keep the tree nodes ``path`` ([B, n] indices into the last forward's T tokens, root
        first) as the next entries of each row, and advance each pointer by num_kept[b] ([B],
        default n); columns past a row's num_kept are moved too, as scratch."""
        source = self.lengths.unsqueeze(1) + path  # [B, n]
        target = self.lengths.unsqueeze(1) + torch.arange(path.shape[1], device=path.device)
        self.keys[:, self._rows, target] = self.keys[:, self._rows, source]
        self.values[:, self._rows, target] = self.values[:, self._rows, source]
        self.lengths += path.shape[1] if num_kept is None else num_kept

    def _narrow_buffers(self, start: int, count: int) -> None:
        self.keys = self.keys[:, start : start + count]
        self.values = self.values[:, start : start + count]
        self._rows = torch.arange(count, device=self.keys.device).unsqueeze(1)

    def _copy_rows(self, src: torch.Tensor, dst: torch.Tensor, count: int) -> None:
        for buffer in (self.keys, self.values):
            buffer[:, dst, :count] = buffer[:, src, :count]
