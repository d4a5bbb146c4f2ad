"""4-bit weights with int8 activations, the same bits for a row alone or in any batch.

A weight is ``s * q + m`` with ``q`` in 0..15 and a float16 scale ``s`` and minimum ``m`` per
output channel and group of 32 input channels (5 bits a weight). Each activation row is
quantized to int8 per group of 32 by its own absolute maximum, so the rows beside it change
nothing, and outlier channels spoil only their own group. Products are exact int32 dot
products per group, combined in float in one fixed order per output element (``q4.cpp``
states it). Three paths compute it: the compiled kernel with AVX-512 VNNI, with AVX2, and
``reference`` in PyTorch for any other CPU; all three give identical bits (tested), so a
target's verify pass reproduces its decoding on every host.

    codes = quantize(weight)            # [out, in] float -> Q4Codes
    layer = Q4Weights.build(codes, bias)
    y = linear(x, layer)                # x [rows, in] float32, contiguous
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft import kernels

GROUP = 32
LANES = 16  # outputs per kernel block
RECORD = LANES * GROUP // 2 + 2 * LANES * 2  # nibbles, then float16 scales and minimums
# Candidate ranges per group, as fractions of (max - min) kept: each is refitted by least
# squares and the one with the least squared error wins.
RANGE_FRACTIONS = (1.0, 0.95, 0.9, 0.85, 0.8)
QUANTIZE_BLOCK_ROWS = 2048


@dataclass(frozen=True, slots=True)
class Q4Codes:
    """q: [out, in] uint8 in 0..15; scale, minimum: [out, in / 32] float16."""

    q: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        out, inner = self.q.shape
        grouped = self.q.view(out, inner // GROUP, GROUP).float()
        weight = grouped * self.scale.float().unsqueeze(-1) + self.minimum.float().unsqueeze(-1)
        return weight.view(out, inner)


def quantize(weight: torch.Tensor) -> Q4Codes:
    """[out, in] float weights (in a multiple of 32) to 4-bit codes."""
    inner = weight.shape[1]
    if inner % GROUP:
        raise ValueError(f"q4: in_features {inner} is not a multiple of {GROUP}")
    parts = [_quantize_block(block) for block in weight.float().split(QUANTIZE_BLOCK_ROWS)]
    return Q4Codes(*(torch.cat(column) for column in zip(*parts, strict=True)))


def _quantize_block(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out, inner = weight.shape
    w = weight.view(out, inner // GROUP, GROUP)
    low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    best = None
    for fraction in RANGE_FRACTIONS:
        margin = (high - low) * (1 - fraction) / 2
        scale, minimum = _refit(w, ((high - low) * fraction / 15).clamp_min(1e-30), low + margin)
        q, scale, minimum = _codes(w, scale, minimum)
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


def _codes(w: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor):
    """Codes for float16-rounded (scale, minimum); a zero scale takes code 0 throughout."""
    scale, minimum = scale.half(), minimum.half()
    s, m = scale.float(), minimum.float()
    q = ((w - m) / torch.where(s > 0, s, 1.0)).round_().clamp_(0, 15)
    q = torch.where(s > 0, q, 0.0).to(torch.uint8)
    return q, scale, minimum


def _refit(w: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor):
    """The least-squares (scale, minimum) for the codes this (scale, minimum) gives w."""
    q = ((w - minimum) / scale).round_().clamp_(0, 15)
    n = w.shape[-1]
    sq, sqq = q.sum(-1, keepdim=True), (q * q).sum(-1, keepdim=True)
    sw, swq = w.sum(-1, keepdim=True), (w * q).sum(-1, keepdim=True)
    det = n * sqq - sq * sq
    fitted = (n * swq - sq * sw) / torch.where(det > 0, det, 1.0)
    ok = (det > 0) & (fitted > 0)
    scale = torch.where(ok, fitted, scale)
    minimum = torch.where(ok, (sw - scale * sq) / n, minimum)
    return scale, minimum


def pack(codes: Q4Codes) -> torch.Tensor:
    """The kernel's layout (``q4.cpp``): a record of ``RECORD`` bytes per block of 16
    outputs and group, outputs padded to a multiple of 16 with zero weights."""
    q, scale, minimum = codes.q, codes.scale, codes.minimum
    out, inner = q.shape
    pad = -out % LANES
    if pad:
        q = torch.cat([q, q.new_zeros(pad, inner)])
        scale = torch.cat([scale, scale.new_zeros(pad, scale.shape[1])])
        minimum = torch.cat([minimum, minimum.new_zeros(pad, minimum.shape[1])])
    blocks, groups = (out + pad) // LANES, inner // GROUP
    # k within a group = 8 * chunk + 4 * half + t; a byte holds half 0 low, half 1 high.
    q = q.view(blocks, LANES, groups, 4, 2, 4).permute(0, 2, 3, 1, 4, 5)
    nibbles = (q[..., 0, :] | (q[..., 1, :] << 4)).reshape(blocks, groups, -1)

    def per_block(values: torch.Tensor) -> torch.Tensor:
        grouped = values.contiguous().view(blocks, LANES, groups).transpose(1, 2)
        return grouped.contiguous().view(torch.uint8).reshape(blocks, groups, -1)

    records = torch.cat([nibbles, per_block(scale), per_block(minimum)], dim=-1)
    return records.contiguous().view(-1)


def unpack(packed: torch.Tensor, out: int, inner: int) -> Q4Codes:
    """``pack``'s inverse."""
    blocks, groups = -(-out // LANES), inner // GROUP
    records = packed.view(blocks, groups, RECORD)
    nibbles = records[..., : RECORD - 4 * LANES].reshape(blocks, groups, 4, LANES, 4)
    halves = torch.stack([nibbles & 0x0F, nibbles >> 4], dim=-2)  # [.., chunk, lane, half, t]
    q = halves.permute(0, 3, 1, 2, 4, 5).reshape(blocks * LANES, inner)

    def per_output(start: int) -> torch.Tensor:
        raw = records[..., start : start + 2 * LANES].contiguous().view(torch.float16)
        return raw.transpose(1, 2).reshape(blocks * LANES, groups)

    scale = per_output(RECORD - 4 * LANES)
    minimum = per_output(RECORD - 2 * LANES)
    return Q4Codes(q[:out].contiguous(), scale[:out].contiguous(), minimum[:out].contiguous())


@dataclass(frozen=True, slots=True)
class Q4Weights:
    """A 4-bit linear layer: ``packed`` for a compiled path, or ``codes`` for the PyTorch
    reference; ``path`` names which (``kernels.PATHS`` or ``kernels.REFERENCE``)."""

    out_features: int
    in_features: int
    path: str
    packed: torch.Tensor | None
    codes: Q4Codes | None
    bias: torch.Tensor | None

    @classmethod
    def build(
        cls, codes: Q4Codes, bias: torch.Tensor | None = None, path: str = "auto"
    ) -> Q4Weights:
        path = kernels.check_path(path)
        out, inner = codes.q.shape
        bias = None if bias is None else bias.float().contiguous()
        if path == kernels.REFERENCE:
            return cls(out, inner, path, None, codes, bias)
        return cls(out, inner, path, pack(codes), None, bias)

    @property
    def nbytes(self) -> int:
        if self.packed is not None:
            return self.packed.numel()
        return self.codes.q.numel() // 2 + 2 * (
            self.codes.scale.numel() + self.codes.minimum.numel()
        )


def linear(x: torch.Tensor, weights: Q4Weights) -> torch.Tensor:
    """x: [rows, in] float32, contiguous -> [rows, out]. A row's result does not depend on the
    other rows, bit for bit."""
    if weights.codes is not None:
        return reference(x, weights.codes, weights.bias)
    code = kernels.PATHS[weights.path]
    return torch.ops.quickdraft_kernels.q4_linear(
        x, weights.packed, weights.out_features, weights.in_features, weights.bias, code
    )


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [rows, in] -> codes [rows, groups, 32] (float, integers in -127..127), scale and
    scale * sum of codes [rows, groups]: ``quantize_rows`` of ``q4.cpp``, bit for bit."""
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


def reference(x: torch.Tensor, codes: Q4Codes, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's result in PyTorch operations, in its order: slow, and the same bits."""
    p, a_scale, a_offset = quantize_activations(x.float())
    out, inner = codes.q.shape
    groups = inner // GROUP
    q = codes.q.view(out, groups, GROUP).float()
    # Integer dot products of at most 32 * 15 * 127 < 2^24: exact in float32 in any order.
    dots = torch.bmm(p.transpose(0, 1), q.permute(1, 2, 0))  # [groups, rows, out]
    s, m = codes.scale.float(), codes.minimum.float()
    acc = x.new_zeros(x.shape[0], out)
    for g in range(groups):
        acc = acc + (s[:, g] * dots[g]) * a_scale[:, g : g + 1]
        acc = acc + m[:, g] * a_offset[:, g : g + 1]
    return acc if bias is None else acc + bias
