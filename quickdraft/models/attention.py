"""Attention over a cache with a length pointer: the prefix-plus-tree mask, attention masked
(``attend``) or batch-invariant one query group at a time (``attend_each``), and the cache
slots each query sees (``seen_slots``), found once a pass."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quickdraft import kernels


def prefix_tree_mask(
    lengths: torch.Tensor, used: int, visible: torch.Tensor | None, num_new: int
) -> torch.Tensor:
    """[B, 1, T, used] bool, the attention mask of T new entries over a cache: every row's
    committed prefix (slots below lengths[b]), then the scratch entries written from
    lengths[b] on as ``visible`` says ([T, S] bool: new entry t sees scratch entry s, such as
    a draft tree's ancestors; None: causal over the T new entries)."""
    relative = torch.arange(used, device=lengths.device) - lengths.unsqueeze(1)  # [B, used]
    prefix = (relative < 0).unsqueeze(1)  # [B, 1, used]
    if visible is None:
        query = torch.arange(num_new, device=lengths.device).view(1, -1, 1)
        scratch = (relative >= 0) & (relative < num_new)
        seen = scratch.unsqueeze(1) & (relative.unsqueeze(1) <= query)
    else:
        width = visible.shape[1]
        scratch = (relative >= 0) & (relative < width)
        columns = relative.clamp(0, width - 1)  # [B, used]
        seen = scratch.unsqueeze(1) & visible.to(lengths.device)[:, columns].permute(1, 0, 2)
    return (prefix | seen).unsqueeze(1)


def attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gqa: bool
) -> torch.Tensor:
    """q [B, H, T, D] over keys/values [B, Hkv, S, D] where mask [B, 1, T, S] allows."""
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)


def attend_each(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    gqa: bool,
) -> torch.Tensor:
    """``attend``, each query over exactly the keys it sees, in cache order, so that its result
    does not depend on what else the pass holds: the same numbers as when that token is decoded
    alone (a committed path's keys are contiguous, a tree node's ancestors come in depth
    order). One call for each group of queries that see equally many keys (``seen_slots``),
    as two batched products and a softmax: each batch entry is computed by itself, so a
    query's result is the same bit for bit in a group of any size (``tests/test_quant.py``).
    Not ``scaled_dot_product_attention``: with more than one thread PyTorch's CPU kernel
    splits its work by the batch's size, and a query's result then depends on how many others
    share its call (measured on torch 2.13: a tree's siblings, or batch rows of equal length,
    got other logits than their one-token steps). A padded, masked batch would change the
    reduction's length and order. Nor, where the compiled kernels are built, the batched
    products below: MKL's result for one batch entry changes with the batch's size too (with
    SmolLM2's head shapes in every case measured), so a tree node's attention differed from
    its one-token step; ``kernels/attention.cpp`` computes each query by itself."""
    keys, values = keys.transpose(1, 2), values.transpose(1, 2)  # [B, S, Hkv, D]
    heads, kv_heads, dim = q.shape[1], keys.shape[2], q.shape[3]
    path = kernels.attention_path() if q.device.type == "cpu" and q.dtype == torch.float32 else 0
    if path and dim <= 256:
        # The compiled kernel: one query at a time, so a batched product's dependence on the
        # batch's size (MKL's, below) cannot reach it.
        if keys.stride(-1) != 1 or keys.stride(2) != dim:
            keys, values = keys.contiguous(), values.contiguous()
        rows, queries, slots, counts = flat_slots(groups)
        scale = dim**-0.5
        if _in_order(groups, q.shape[0], q.shape[2]):  # a decode step, a chain: no gathers
            flat = q.transpose(1, 2).reshape(-1, heads, dim).contiguous()
            found = torch.ops.quickdraft_kernels.attend(
                flat, keys, values, rows, slots, counts, scale, path
            )
            return found.view(q.shape[0], q.shape[2], heads, dim).transpose(1, 2)
        out = torch.empty_like(q)
        out[rows, :, queries] = torch.ops.quickdraft_kernels.attend(
            q[rows, :, queries].contiguous(), keys, values, rows, slots, counts, scale, path
        )
        return out
    out = torch.empty_like(q)
    # GQA without copies: query head h reads kv head h // (heads / kv_heads).
    shared = heads // kv_heads if gqa else 1
    for rows, queries, slots in groups:
        group = q[rows, :, queries].view(len(rows), kv_heads, shared, dim)  # [G, Hkv, r, D]
        seen_keys, seen_values = gather_slots(rows, slots, keys, values)  # [G, n, Hkv, D]
        scores = group @ seen_keys.permute(0, 2, 3, 1)  # [G, Hkv, r, n]
        weights = torch.softmax(scores * dim**-0.5, dim=-1)
        attended = weights @ seen_values.transpose(1, 2)  # [G, Hkv, r, D]
        out[rows, :, queries] = attended.view(len(rows), heads, dim)
    return out


# Below this many slots a gather is faster by advanced indexing: the select's setup costs more
# than it saves (measured: benchmarks/results/defaults.md).
SELECT_FROM = 128


def gather_slots(
    rows: torch.Tensor, slots: torch.Tensor, *parts: torch.Tensor
) -> list[torch.Tensor]:
    """``part[rows.unsqueeze(1), slots]`` for each of ``parts`` (a layer's keys and values): the
    cache slots [G, n] of rows [G] from part [B, S, Hkv, D], as a new contiguous
    [G, n, Hkv, D]. Where each row's slots lie end to end in memory (a cache's buffer, sliced
    to its used length) one ``index_select`` over the rows laid end to end copies them; the
    same numbers, and on CPU several times faster than advanced indexing for a pass's groups
    (``benchmarks/results/defaults.md``). Parts laid out alike share one index (keys and
    values of one cache are)."""
    if slots.numel() < SELECT_FROM:
        return [part[rows.unsqueeze(1), slots] for part in parts]
    out, index_for = [], {}
    for part in parts:
        inner = part.shape[2:]
        layout = (tuple(part.shape), part.stride())
        if layout not in index_for:
            index_for[layout] = _end_to_end(part, rows, slots)
        found = index_for[layout]
        if found is None:
            out.append(part[rows.unsqueeze(1), slots])
            continue
        index, flat_rows = found
        flat = part.as_strided((flat_rows, *inner), part.stride()[1:])
        out.append(flat.index_select(0, index).view(*slots.shape, *inner))
    return out


def _end_to_end(
    part: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor
) -> tuple[torch.Tensor, int] | None:
    """(the slots' indices among ``part``'s rows laid end to end, how many such rows), or
    None where the rows do not lie end to end."""
    batch, length, *inner = part.shape
    row_stride, slot_stride = part.stride(0), part.stride(1)
    laid_out = part.stride()[1:] == (inner[0] * inner[1], inner[1], 1)
    if not laid_out or (batch > 1 and row_stride % slot_stride):
        return None
    per_row = row_stride // slot_stride if batch > 1 else length
    index = slots if batch == 1 else slots + (rows * per_row).unsqueeze(1)
    return index.reshape(-1), (batch - 1) * per_row + length


class SlotGroups(list):
    """``seen_slots``' groups, with their flat form (``flat_slots``) kept once made: every
    layer of a pass attends with the same groups."""

    flat: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    in_order: bool | None = None  # ``_in_order``'s answer, once found


def _in_order(groups: list, batch: int, num_new: int) -> bool:
    """Whether ``flat_slots(groups)`` lists the pass's queries row by row in their order (a
    decode step or a chain verify: every query sees one key more than the one before), so
    the queries go to the kernel as they lie, without a gather and a scatter."""
    known = getattr(groups, "in_order", None)
    if known is not None:
        return known
    rows, queries, _, _ = flat_slots(groups)
    expected = torch.arange(batch * num_new, device=rows.device)
    found = len(rows) == batch * num_new and bool(torch.equal(rows * num_new + queries, expected))
    if isinstance(groups, SlotGroups):
        groups.in_order = found
    return found


def flat_slots(
    groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every query of ``groups`` in one table: rows [Q], queries [Q], slots [Q, n] (each
    query's slots first, then padding) and counts [Q], contiguous int64."""
    cached = getattr(groups, "flat", None)
    if cached is not None:
        return cached
    width = max(slots.shape[1] for _, _, slots in groups)
    rows = torch.cat([r for r, _, _ in groups]).contiguous()
    queries = torch.cat([t for _, t, _ in groups]).contiguous()
    padded = [torch.nn.functional.pad(s, (0, width - s.shape[1])) for _, _, s in groups]
    counts = torch.cat([torch.full((len(r),), s.shape[1]) for r, _, s in groups])
    flat = (rows, queries, torch.cat(padded).contiguous(), counts)
    if isinstance(groups, SlotGroups):
        groups.flat = flat
    return flat


def seen_slots(mask: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """mask [B, 1, T, S] -> the queries grouped by how many keys they see: (rows [G],
    queries [G], slots [G, n], each query's visible cache slots in order). Found once a pass
    (every layer has the same mask)."""
    seen = mask[:, 0]
    counts = seen.sum(-1)  # [B, T]
    groups = SlotGroups()
    for count in counts.unique().tolist():
        rows, queries = (counts == count).nonzero(as_tuple=True)
        slots = seen[rows, queries].nonzero()[:, 1].view(len(rows), count)
        groups.append((rows, queries, slots))
    return groups
