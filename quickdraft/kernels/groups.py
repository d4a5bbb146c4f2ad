"""Weights in groups of 32: each group gets a float16 scale and minimum and codes in 0..15 (or
0..255), ``w = scale * q + minimum``, chosen by a small search: candidate grids (the whole
range with its top codes unused, then narrower ranges), each refitted by least squares, the
least squared error kept. A GGUF's 4-bit blocks come back exactly.

Every quantized layer starts here: the superblock kernel (``kernels.superblock``) turns the
groups' scales and minimums into integer sub-scales. The groups also have a linear layer of
their own, for models whose activations need a scale per 32 inputs rather than per 256 (5 bits
a weight; activations quantized to int8 per row and group, so an outlier channel spoils only
its own group): exact int32 dot products per group, combined in float in one fixed order per
output element (``groups.cpp`` states it). Three paths compute it, the compiled kernel with
AVX-512 VNNI, with AVX2, and ``reference`` in PyTorch, all with the same bits.

    codes = quantize(weight)            # [out, in] float -> GroupCodes
    layer = GroupWeights.build(codes, bias)
    y = linear(x, layer)                # x [rows, in] float32, contiguous
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft import kernels

GROUP = 32
LANES = 16  # outputs per kernel block
BITS = (4, 8)
# What ``quantize`` searches for: the layout's ``BITS`` and the superblock layout's 6.
QUANTIZE_BITS = (4, 6, 8)


def record_bytes(bits: int) -> int:
    """Bytes per block of 16 outputs and group: the codes, then float16 scales and minimums."""
    return LANES * GROUP * bits // 8 + 2 * LANES * 2


# Candidate ranges per group, as fractions of (max - min) kept: each is refitted by least
# squares and the one with the least squared error wins.
RANGE_FRACTIONS = (1.0, 0.95, 0.9, 0.85, 0.8)
TOP_CODES_UNUSED = 3
QUANTIZE_BLOCK_ROWS = 2048


@dataclass(frozen=True, slots=True)
class GroupCodes:
    """q: [out, in] uint8 in 0..2^bits - 1; scale, minimum: [out, in / 32] float16."""

    q: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor
    bits: int = 4

    def dequantize(self) -> torch.Tensor:
        out, inner = self.q.shape
        grouped = self.q.view(out, inner // GROUP, GROUP).float()
        weight = grouped * self.scale.float().unsqueeze(-1) + self.minimum.float().unsqueeze(-1)
        return weight.view(out, inner)


def quantize(weight: torch.Tensor, bits: int = 4) -> GroupCodes:
    """[out, in] float weights (in a multiple of 32) to 4-bit (or 8-bit) codes: per group,
    candidate grids refitted by least squares, the least squared error kept. The compiled
    quantizer (``group_quantize`` in ``groups.cpp``, about 100x faster) runs the same search;
    its sums round in another order, so a rare group may get other codes than this one's."""
    inner = weight.shape[1]
    if inner % GROUP:
        raise ValueError(f"q4: in_features {inner} is not a multiple of {GROUP}")
    if bits not in QUANTIZE_BITS:
        raise ValueError(f"q4: bits must be one of {QUANTIZE_BITS}, got {bits}")
    if weight.device.type == "cpu" and kernels.native():
        q, scale, minimum = torch.ops.quickdraft_kernels.group_quantize(
            weight.float().contiguous(), bits
        )
        return GroupCodes(q, scale, minimum, bits)
    return quantize_reference(weight, bits)


def quantize_reference(weight: torch.Tensor, bits: int = 4) -> GroupCodes:
    """``quantize`` in PyTorch operations, for hosts without the compiled kernels."""
    levels = 2**bits - 1
    blocks = weight.float().split(QUANTIZE_BLOCK_ROWS)
    parts = [_quantize_block(block, levels) for block in blocks]
    return GroupCodes(*(torch.cat(column) for column in zip(*parts, strict=True)), bits=bits)


def _quantize_block(
    weight: torch.Tensor, levels: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out, inner = weight.shape
    w = weight.view(out, inner // GROUP, GROUP)
    low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    # Grids over the whole range with its top codes unused (a GGUF block whose largest weight
    # is not at code 15 comes back exactly), then narrower ranges refitted by least squares.
    candidates = [(levels - unused, 0.0) for unused in range(TOP_CODES_UNUSED + 1)]
    candidates += [(levels / fraction, (1 - fraction) / 2) for fraction in RANGE_FRACTIONS[1:]]
    best = None
    for divisor, margin in candidates:
        first = ((high - low) / divisor).clamp_min(1e-30)
        scale, minimum = _refit(w, first, low + (high - low) * margin, levels)
        q, scale, minimum = _codes(w, scale, minimum, levels)
        error = (q.float() * scale.float() + minimum.float() - w).pow_(2).sum(-1, keepdim=True)
        if best is None:
            best = [q, scale, minimum, error]
            continue
        better = error < best[3]
        best = [
            torch.where(better, new, old)
            for new, old in zip((q, scale, minimum, error), best, strict=True)
        ]
    q, scale, minimum, _ = best
    return q.view(out, inner), scale.squeeze(-1), minimum.squeeze(-1)


def _codes(w: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, levels: int):
    """Codes for float16-rounded (scale, minimum); a zero scale takes code 0 throughout."""
    scale, minimum = scale.half(), minimum.half()
    s, m = scale.float(), minimum.float()
    q = ((w - m) / torch.where(s > 0, s, 1.0)).round_().clamp_(0, levels)
    q = torch.where(s > 0, q, 0.0).to(torch.uint8)
    return q, scale, minimum


def _refit(w: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, levels: int):
    """The least-squares (scale, minimum) for the codes this (scale, minimum) gives w."""
    q = ((w - minimum) / scale).round_().clamp_(0, levels)
    n = w.shape[-1]
    sq, sqq = q.sum(-1, keepdim=True), (q * q).sum(-1, keepdim=True)
    sw, swq = w.sum(-1, keepdim=True), (w * q).sum(-1, keepdim=True)
    det = n * sqq - sq * sq
    fitted = (n * swq - sq * sw) / torch.where(det > 0, det, 1.0)
    ok = (det > 0) & (fitted > 0)
    scale = torch.where(ok, fitted, scale)
    minimum = torch.where(ok, (sw - scale * sq) / n, minimum)
    return scale, minimum


def pack(codes: GroupCodes) -> torch.Tensor:
    """The kernel's layout (``groups.cpp``): a record of ``record_bytes(bits)`` bytes per block of
    16 outputs and group, outputs padded to a multiple of 16 with zero weights."""
    q, scale, minimum = codes.q, codes.scale, codes.minimum
    out, inner = q.shape
    pad = -out % LANES
    if pad:
        q = torch.cat([q, q.new_zeros(pad, inner)])
        scale = torch.cat([scale, scale.new_zeros(pad, scale.shape[1])])
        minimum = torch.cat([minimum, minimum.new_zeros(pad, minimum.shape[1])])
    blocks, groups = (out + pad) // LANES, inner // GROUP
    if codes.bits == 4:
        # k within a group = 8 * chunk + 4 * half + t; a byte holds half 0 low, half 1 high.
        q = q.view(blocks, LANES, groups, 4, 2, 4).permute(0, 2, 3, 1, 4, 5)
        data = (q[..., 0, :] | (q[..., 1, :] << 4)).reshape(blocks, groups, -1)
    else:  # k = 4 * chunk + t
        q = q.view(blocks, LANES, groups, 8, 4).permute(0, 2, 3, 1, 4)
        data = q.reshape(blocks, groups, -1)

    def per_block(values: torch.Tensor) -> torch.Tensor:
        grouped = values.contiguous().view(blocks, LANES, groups).transpose(1, 2)
        return grouped.contiguous().view(torch.uint8).reshape(blocks, groups, -1)

    records = torch.cat([data, per_block(scale), per_block(minimum)], dim=-1)
    return records.contiguous().view(-1)


def unpack(packed: torch.Tensor, out: int, inner: int, bits: int = 4) -> GroupCodes:
    """``pack``'s inverse."""
    blocks, groups = -(-out // LANES), inner // GROUP
    size = record_bytes(bits)
    records = packed.view(blocks, groups, size)
    data = records[..., : size - 4 * LANES]
    if bits == 4:
        nibbles = data.reshape(blocks, groups, 4, LANES, 4)
        halves = torch.stack([nibbles & 0x0F, nibbles >> 4], dim=-2)  # [.., chunk, lane, half, t]
        q = halves.permute(0, 3, 1, 2, 4, 5).reshape(blocks * LANES, inner)
    else:
        q = data.reshape(blocks, groups, 8, LANES, 4).permute(0, 3, 1, 2, 4)
        q = q.reshape(blocks * LANES, inner)

    def per_output(start: int) -> torch.Tensor:
        raw = records[..., start : start + 2 * LANES].contiguous().view(torch.float16)
        return raw.transpose(1, 2).reshape(blocks * LANES, groups)

    scale = per_output(size - 4 * LANES)
    minimum = per_output(size - 2 * LANES)
    return GroupCodes(
        q[:out].contiguous(), scale[:out].contiguous(), minimum[:out].contiguous(), bits
    )


@dataclass(frozen=True, slots=True)
class GroupWeights:
    """A linear layer in groups: ``packed`` for a compiled path, or ``codes`` for the PyTorch
    reference; ``path`` names which (``kernels.PATHS`` or ``kernels.REFERENCE``)."""

    out_features: int
    in_features: int
    path: str
    packed: torch.Tensor | None
    codes: GroupCodes | None
    bias: torch.Tensor | None
    bits: int = 4

    @classmethod
    def build(
        cls, codes: GroupCodes, bias: torch.Tensor | None = None, path: str = "auto"
    ) -> GroupWeights:
        if codes.bits not in BITS:
            raise ValueError(f"q4: the groups layout holds {BITS} bits, not {codes.bits}")
        path = kernels.check_path(path)
        out, inner = codes.q.shape
        bias = None if bias is None else bias.float().contiguous()
        if path == kernels.REFERENCE:
            return cls(out, inner, path, None, codes, bias, codes.bits)
        return cls(out, inner, path, pack(codes), None, bias, codes.bits)

    @property
    def nbytes(self) -> int:
        if self.packed is not None:
            return self.packed.numel()
        codes = self.codes
        return codes.q.numel() * codes.bits // 8 + 2 * (codes.scale.numel() + codes.minimum.numel())


def linear(x: torch.Tensor, weights: GroupWeights) -> torch.Tensor:
    """x: [rows, in] float32, contiguous -> [rows, out]. A row's result does not depend on the
    other rows, bit for bit."""
    if weights.codes is not None:
        return reference(x, weights.codes, weights.bias)
    code = kernels.PATHS[weights.path]
    bits = weights.bits
    return torch.ops.quickdraft_kernels.group_linear(
        x, weights.packed, weights.out_features, weights.in_features, weights.bias, code, bits
    )


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [rows, in] -> codes [rows, groups, 32] (float, integers in -127..127), scale and
    scale * sum of codes [rows, groups]: ``quantize_rows`` of ``groups.cpp``, bit for bit."""
    rows, inner = x.shape
    grouped = x.view(rows, inner // GROUP, GROUP)
    amax = grouped.abs().amax(-1)
    nonzero = amax > 0
    # Tensor by tensor: a true division (``127.0 / t`` would multiply by a reciprocal).
    inverse = torch.full_like(amax, 127.0) / torch.where(nonzero, amax, 1.0)
    codes = (grouped * inverse.unsqueeze(-1)).round_().clamp_(-127, 127)
    codes = torch.where(nonzero.unsqueeze(-1), codes, 0.0)
    scale = torch.where(nonzero, amax / torch.full_like(amax, 127.0), 0.0)
    return codes, scale, scale * codes.sum(-1)


def reference(x: torch.Tensor, codes: GroupCodes, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's result in PyTorch operations, in its order: slow, and the same bits."""
    p, a_scale, a_offset = quantize_activations(x.float())
    out, inner = codes.q.shape
    groups = inner // GROUP
    q = codes.q.view(out, groups, GROUP).float()
    # Integer dot products of at most 32 * 255 * 127 < 2^24: exact in float32 in any order.
    dots = torch.bmm(p.transpose(0, 1), q.permute(1, 2, 0))  # [groups, rows, out]
    s, m = codes.scale.float(), codes.minimum.float()
    acc = x.new_zeros(x.shape[0], out)
    for g in range(groups):
        acc = acc + (s[:, g] * dots[g]) * a_scale[:, g : g + 1]
        acc = acc + m[:, g] * a_offset[:, g : g + 1]
    return acc if bias is None else acc + bias
