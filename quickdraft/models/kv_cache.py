"""A preallocated key/value cache with a per-row length pointer (gpt-fast's KVCache, batched).

Layout: keys and values are [layers, B, capacity, kv_heads, head_dim], so that writing the T new
entries of every row is one indexed assignment whatever each row's length is. A forward writes
at positions lengths .. lengths + T - 1; ``commit`` keeps a prefix of them, ``commit_path`` keeps
the nodes of an accepted tree path (moving them next to the prefix first), and anything past the
pointer is scratch that attention never reads. A gathered view (``Cache.select`` of slots with
holes) writes by slot index into the full buffers and reads its rows with one ``index_select``
per layer.
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
        # The rows this cache (or view) writes, [B, 1]: its own for a narrow view; its slots in
        # the full buffers for a gathered view, which then reads them through ``_gather``.
        self._rows = torch.arange(batch_size, device=device).unsqueeze(1)
        self._gather: torch.Tensor | None = None

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor
    ) -> None:
        """keys, values: [B, T, kv_heads, head_dim]; positions: [B, T] from ``slots_for``."""
        self.keys[layer][self._rows, positions] = keys
        self.values[layer][self._rows, positions] = values

    def view(self, layer: int, used: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``used`` positions of a layer as [B, kv_heads, used, head_dim]: views of
        the buffers, or for a gathered view a copy of its rows."""
        keys, values = self.keys[layer, :, :used], self.values[layer, :, :used]
        if self._gather is not None:
            keys, values = keys.index_select(0, self._gather), values.index_select(0, self._gather)
        return keys.transpose(1, 2), values.transpose(1, 2)

    def _keep_path(self, path: torch.Tensor) -> None:
        source = self.lengths.unsqueeze(1) + path  # [B, n]
        target = self.lengths.unsqueeze(1) + torch.arange(path.shape[1], device=path.device)
        self.keys[:, self._rows, target] = self.keys[:, self._rows, source]
        self.values[:, self._rows, target] = self.values[:, self._rows, source]

    def _narrow_buffers(self, start: int, count: int) -> None:
        self.keys = self.keys[:, start : start + count]
        self.values = self.values[:, start : start + count]
        self._rows = torch.arange(count, device=self.keys.device).unsqueeze(1)

    def _select_buffers(self, index: torch.Tensor) -> None:
        self._rows, self._gather = index.unsqueeze(1), index
