"""Kernels the models and drafters share: the packed and int8 linear layer, RMS norm, the
rotary embedding (Hugging Face's rotate-half convention), attention (masked, or batch-invariant
one query group at a time) and the prefix-plus-tree attention mask over a cache with a length
pointer."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from quickdraft import kernels
from quickdraft.kernels import groups, superblock
from quickdraft.models import int8 as int8_ops

# A layer's weights are "already 4-bit" when 4-bit codes reproduce them to this relative
# error: a GGUF's Q4_1 blocks come back exactly, its Q4_K blocks to float16 rounding of their
# scales (about 1e-4), while 4 bits lose about 0.03 of a Q6_K tensor and 0.08 of float ones.
EXACT_ERROR = 0.005
# The codes a quantized file's tensor gets when 4 bits do not reproduce it (a GGUF's Q6_K).
# 8, not 6: 6-bit codes over groups of 32 round Q6_K's groups of 16 again (relative weight
# error 0.016 against 8 bits' 0.005). Measured with the head at 6 bits too (the probe of
# ``load_model``'s check, logits' relative error from float): Qwen2.5-Coder-0.5B 0.036 against
# 0.026 for 0.41 GB against 0.52, the 1.5B 0.025 against 0.022 for 1.04 GB against 1.15. A
# form that holds Q6_K exactly (sub-scales per 16) would make 6 the better choice.
EXACT_FALLBACK_BITS = 8
# The quantized layers' layouts (``Linear.quantize_q4``), the fast one first.
LAYOUTS = ("superblock", "groups")
QuantWeights = superblock.SuperWeights | groups.GroupWeights


def layout_of(weights: QuantWeights | None) -> str | None:
    """The ``LAYOUTS`` name of a layer's quantized weights (None: not quantized)."""
    if weights is None:
        return None
    return LAYOUTS[0] if isinstance(weights, superblock.SuperWeights) else LAYOUTS[1]


class Linear:
    """y = x W^T + b. On CPU in float32 the weight is prepacked for oneDNN (exact up to float
    rounding); with ``int8`` it is quantized per output channel and run per-row by the int8
    kernels of ``models.int8``. Elsewhere plain F.linear. Once packed, the dense weight is
    dropped to save memory, unless ``prepack`` is False (a model that calibrates first:
    ``observe()`` makes each call record the largest |x| per input channel in
    ``channel_amax``, and ``quantize()`` then keeps the largest of them in float).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        int8: bool = False,
        prepack: bool = True,
    ):
        self.weight: torch.Tensor | None = weight
        self.bias = bias
        self.out_features = weight.shape[0]
        self.channel_amax: torch.Tensor | None = None
        self._observing = False
        self._packed: Any = None
        self._int8: int8_ops.Int8Weights | None = None
        self._quant: QuantWeights | None = None  # quantize_q4's
        self._dense: torch.Tensor | None = None  # the float weight it came from, until released
        if not prepack:
            return
        if int8:
            self.quantize()
            return
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            return
        try:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
            self.weight = None
        except (AttributeError, RuntimeError):  # a build without this kernel: plain F.linear
            self._packed = None

    def observe(self) -> None:
        self._observing = True

    def quantize(self, divisor: int = int8_ops.OUTLIER_DIVISOR, invariant: bool = False) -> None:
        """To int8 in place, the in // ``divisor`` input channels ``observe`` saw largest
        apart (in float, or with ``invariant`` in a batch-invariant integer product)."""
        if self.weight is None:
            raise ValueError("quantize() needs the dense weight: build with prepack=False")
        self._observing = False
        if self.weight.device.type != "cpu" or self.weight.dtype != torch.float32:
            return  # the int8 kernels are CPU float32 ones: elsewhere it stays as it is
        try:
            self._int8 = int8_ops.pack(
                self.weight, self.bias, self.channel_amax, divisor, invariant=invariant
            )
        except (AttributeError, RuntimeError):  # a build without the int8 kernels: float
            return
        self.weight = None

    def quantize_q4(
        self, bits: int = 4, exact_only: bool = False, layout: str = "superblock"
    ) -> None:
        """To 4-bit (or 8-bit) weights in place: batch-invariant by construction, and needing
        no calibration. ``layout``: "superblock" (``kernels.superblock``: activations quantized
        per row and 256 inputs, integer sub-scales; the fast one) or "groups"
        (``kernels.groups``: activations per 32 inputs, for models with outlier channels).
        ``exact_only``: weights that came from a quantized file keep 8 bits unless 4 bits
        reproduce them (within ``EXACT_ERROR``), so a GGUF's 6- and 8-bit tensors are not
        rounded again to 4. It may run again with another layout until ``release_dense``.
        CPU float32 layers only (others stay as they are); a width that is not a multiple of
        32 raises ValueError."""
        weight = self.weight if self.weight is not None else self._dense
        if weight is None:
            raise ValueError("quantize_q4() needs the dense weight: build with prepack=False")
        if layout not in LAYOUTS:
            raise ValueError(f"layout: {layout!r} is not one of {', '.join(LAYOUTS)}")
        self._observing = False
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            return
        module = superblock if layout == "superblock" else groups
        if module is groups and bits == 6:
            bits = 8  # the groups layout has no 6-bit codes
        codes = module.quantize(weight, bits)
        if exact_only and bits == 4:
            error = (codes.dequantize() - weight).norm() / weight.norm().clamp_min(1e-30)
            if error > EXACT_ERROR:
                codes = module.quantize(weight, EXACT_FALLBACK_BITS if module is superblock else 8)
        if layout == "superblock":
            self._quant = superblock.SuperWeights.build(codes, self.bias)
        else:
            self._quant = groups.GroupWeights.build(codes, self.bias)
        self._dense, self.weight = weight, None

    def release_dense(self) -> None:
        """Drop the float weight ``quantize_q4`` kept for another try."""
        self._dense = None

    @property
    def quantized_weights(self) -> QuantWeights | None:
        return self._quant

    def use_quantized(self, weights: QuantWeights) -> None:
        """Take weights ``quantize_q4`` made earlier (``models.quantized``), in place."""
        self._quant, self.weight, self._dense = weights, None, None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._observing:
            seen = x.detach().reshape(-1, x.shape[-1]).abs().amax(dim=0).float()
            self.channel_amax = seen if self.channel_amax is None else self.channel_amax.max(seen)
        if self.weight is not None:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, x.shape[-1])
        if not flat.is_contiguous():
            flat = flat.contiguous()
        if isinstance(self._quant, superblock.SuperWeights):
            out = superblock.linear(flat, self._quant)
        elif self._quant is not None:
            out = groups.linear(flat, self._quant)
        elif self._int8 is not None:
            out = int8_ops.linear(flat, self._int8)
        else:
            out = torch.ops.mkldnn._linear_pointwise(flat, self._packed, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)


def side_by_side(x: torch.Tensor, parts: Sequence[Linear]) -> torch.Tensor:
    """The outputs of several linear layers on one input x [.., in], concatenated. Int8
    layers share the scaling of x (``int8.side_by_side``): a shortlisted head calls one per
    chosen row segment, a dozen a draft level."""
    quantized = [part._int8 for part in parts if part._int8 is not None and not part._observing]
    if len(quantized) < 2 or len(quantized) < len(parts):
        return torch.cat([part(x) for part in parts], dim=-1)
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    out = int8_ops.side_by_side(flat, quantized)
    return out.view(*x.shape[:-1], out.shape[-1])


class Joined:
    """Several linear layers on one input, their outputs side by side: what a fused product
    computes, for weights that must stay where they are (a model shared with transformers)."""

    def __init__(self, *parts: Linear):
        self.parts = parts
        self.out_features = sum(part.out_features for part in parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return side_by_side(x, self.parts)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps)).to(x.dtype) * weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, Hugging Face's rotate-half convention. x: [B, T, heads, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class PackedLinear(torch.nn.Module):
    """An inference-only stand-in for an ``nn.Linear``: the runner's prepacked product, whose
    cost stays nearly flat from 1 to 16 rows on CPU where ``F.linear``'s does not."""

    def __init__(self, linear: torch.nn.Linear, int8: bool):
        super().__init__()
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.linear = Linear(linear.weight.detach().float().contiguous(), bias, int8=int8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def packed_copy(module: torch.nn.Module, int8: bool) -> Any:
    """A copy of ``module`` for inference, its ``nn.Linear`` layers prepacked (int8:
    quantized); the original keeps training."""
    clone = copy.deepcopy(module)
    for parent in list(clone.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, PackedLinear(child, int8))
    return clone.eval()


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
