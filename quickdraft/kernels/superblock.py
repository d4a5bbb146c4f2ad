"""4-bit weights in superblocks with integer sub-scales: the target's fast kernel for a verify.

A weight is ``d * sc * q + dmin * mn`` with ``q`` in 0..15, per output channel and group of 32
inputs an integer sub-scale ``sc`` (0..255) and minimum ``mn`` (-127..127), and per superblock
of 8 groups two float factors ``d`` and ``dmin``: a GGUF's Q4_K structure, which it holds
exactly (4.75 bits a weight with float32 factors; 4.625 where they are float16, as a GGUF's
are: ``holds_half``, the same values in fewer bytes). Activations are quantized to int8 per
row and superblock. The groups of a superblock combine in exact int32 arithmetic
(``superblock.cpp`` states the order), so a group costs two integer operations a row where
float scales per group cost six: several rows (a verify pass) run nearer the VNNI peak, and a
row's result is the same bits alone or in any batch. Three paths compute it: the compiled
kernel with AVX-512 VNNI, with AVX2, and ``reference`` in PyTorch; all three give identical
bits (tested).

    codes = quantize(weight)            # [out, in] float -> SuperCodes
    layer = SuperWeights.build(codes, bias)
    y = linear(x, layer)                # x [rows, in] float32, contiguous

A fourth form holds a GGUF's Q6_K tensors (the head and some value and down projections of a
Q4_K_M file) as they are: 6-bit codes with a signed int8 sub-scale per 16 inputs, the code
offset by -32, ``w = d * sc * (q - 32)`` (``quantize_q6k``; 6.75 bits a weight against 8.75
for 8-bit codes, and Q6_K's own 6.5625 with its float16 d). The kernel takes it as
``d * sc * q + dmin * sc`` with ``dmin = -32 d``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft import kernels
from quickdraft.kernels.groups import quantize as quantize_groups

GROUP = 32
# Code widths: 4 (Q4_K's), 6 and 8 (a GGUF's Q6_K tensors and the head take 8 by default:
# ``models.exact.EXACT_FALLBACK_BITS`` says why).
BITS = (4, 6, 8)
SUPER = 8  # groups a superblock
Q6K_SUB = 16  # inputs a sub-scale covers in the Q6_K form
Q6K_OFFSET = 32
LANES = 16
# Sub-scale grids tried per superblock: 255 steps (the finest), and 63 (a GGUF's Q4_K, whose
# scales come back exactly on it); the minimums' grids likewise.
SCALE_STEPS = (255, 63)
MIN_STEPS = (127, 63)


@dataclass(frozen=True, slots=True)
class SuperCodes:
    """q: [out, in] uint8 0..2^bits - 1; sc: [out, in / sub] uint8 (int8 for sub 16);
    mn: [out, in / sub] int8 (for sub 16 the same as sc); d, dmin: [out, supers] float32;
    sub: the inputs a sub-scale covers, 32 or 16 (the Q6_K form, 6 bits)."""

    q: torch.Tensor
    sc: torch.Tensor
    mn: torch.Tensor
    d: torch.Tensor
    dmin: torch.Tensor
    bits: int = 4
    sub: int = GROUP

    def dequantize(self) -> torch.Tensor:
        out, inner = self.q.shape
        parts, per = inner // self.sub, SUPER * GROUP // self.sub
        d = self.d.repeat_interleave(per, dim=1)[:, :parts]
        dmin = self.dmin.repeat_interleave(per, dim=1)[:, :parts]
        scale = (d * self.sc.float()).unsqueeze(-1)
        minimum = (dmin * self.mn.float()).unsqueeze(-1)
        return (self.q.view(out, parts, self.sub).float() * scale + minimum).view(out, inner)


def supers_of(groups: int) -> int:
    return -(-groups // SUPER)


def quantize(weight: torch.Tensor, bits: int = 4, block_rows: int = 1024) -> SuperCodes:
    """[out, in] float weights (in a multiple of 32) to superblock codes: each group's scale and
    minimum from ``kernels.groups.quantize``'s search, then per superblock the sub-scale grids of
    ``SCALE_STEPS`` and ``MIN_STEPS``, each with its codes recomputed and (d, dmin) refitted by
    least squares; the one with the least squared error is kept."""
    inner = weight.shape[1]
    if inner % GROUP:
        raise ValueError(f"q4: in_features {inner} is not a multiple of {GROUP}")
    if bits not in BITS:
        raise ValueError(f"q4: bits must be one of {BITS}, got {bits}")
    parts = [_quantize_rows(rows.float(), bits) for rows in weight.split(block_rows)]
    return SuperCodes(*(torch.cat(column) for column in zip(*parts, strict=True)), bits=bits)


def quantize_q6k(weight: torch.Tensor, block_rows: int = 1024) -> SuperCodes:
    """[out, in] float weights to the Q6_K form: per 16 inputs the scale that best maps them to
    codes -32..31 (llama.cpp's search: the largest magnitude to -32, nineteen nearby scales,
    each refitted by least squares), then per superblock an int8 sub-scale grid, the one of
    ``_Q6K_GRIDS`` with the least squared error. A GGUF's Q6_K tensor, dequantized, comes back
    exactly: its scales are found as they were, its grid is the 128-step one."""
    inner = weight.shape[1]
    if inner % GROUP:
        raise ValueError(f"q6k: in_features {inner} is not a multiple of {GROUP}")
    parts = [_q6k_rows(rows.float()) for rows in weight.split(block_rows)]
    q, sc, d = (torch.cat(column) for column in zip(*parts, strict=True))
    return SuperCodes(q, sc, sc, d, d * -Q6K_OFFSET, bits=6, sub=Q6K_SUB)


def _q6k_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out, inner = weight.shape
    parts = inner // Q6K_SUB
    supers = supers_of(inner // GROUP)
    per = SUPER * GROUP // Q6K_SUB
    x = torch.nn.functional.pad(weight, (0, supers * SUPER * GROUP - inner))
    x = x.view(out, supers, per, Q6K_SUB)
    # The sub-block's scale: its largest magnitude to -32, and 9 steps of 0.1 either side.
    top = x.gather(-1, x.abs().argmax(-1, keepdim=True))  # signed
    best_scale = torch.zeros_like(top)
    best_error = torch.full_like(top, float("inf"))
    for step in range(-9, 10):
        inverse = torch.where(top != 0, -(Q6K_OFFSET + 0.1 * step) / top, 0.0)
        k = (x * inverse).round_().clamp_(-Q6K_OFFSET, Q6K_OFFSET - 1)
        kk = (k * k).sum(-1, keepdim=True)
        scale = torch.where(kk > 0, (x * k).sum(-1, keepdim=True) / kk.clamp_min(1e-30), 0.0)
        error = (x - scale * k).pow_(2).sum(-1, keepdim=True)
        better = error < best_error
        best_scale = torch.where(better, scale, best_scale)
        best_error = torch.where(better, error, best_error)
    s = best_scale.squeeze(-1)  # [out, supers, per]
    largest = s.gather(-1, s.abs().argmax(-1, keepdim=True))  # signed
    chosen = None
    for grid in _Q6K_GRIDS:
        if grid == 128:
            d = torch.where(largest != 0, -largest / grid, 1e-30)
        else:
            d = (largest.abs() / grid).clamp_min(1e-30)
        sc = (s / d).round_().clamp_(-128 if grid == 128 else -grid, 127)
        step = (d * sc).unsqueeze(-1)
        k = torch.where(step != 0, x / torch.where(step != 0, step, 1.0), 0.0)
        k = k.round_().clamp_(-Q6K_OFFSET, Q6K_OFFSET - 1)
        error = (x - step * k).pow_(2).sum((-1, -2))  # [out, supers]
        if chosen is None:
            chosen = [k, sc, d.squeeze(-1), error]
            continue
        better = error < chosen[-1]
        chosen = [
            torch.where(better.view(*better.shape, *([1] * (new.dim() - 2))), new, old)
            for new, old in zip([k, sc, d.squeeze(-1), error], chosen, strict=True)
        ]
    assert chosen is not None
    k, sc, d, _ = chosen
    q = (k + Q6K_OFFSET).to(torch.uint8).view(out, -1)[:, :inner].contiguous()
    sc = sc.to(torch.int8).view(out, -1)[:, :parts].contiguous()
    return q, sc, d.contiguous()


# Sub-scale grids for the Q6_K form: 128 steps with the largest scale at -128 (what
# llama.cpp's Q6_K writes, so its tensors come back exactly), and a symmetric 127.
_Q6K_GRIDS = (128, 127)


def _quantize_rows(weight: torch.Tensor, bits: int) -> tuple[torch.Tensor, ...]:
    out, inner = weight.shape
    groups = inner // GROUP
    supers = supers_of(groups)
    pad = supers * SUPER - groups
    found = quantize_groups(weight, bits)
    # [out, supers, 8] per group; padded groups have zero weights, scale and minimum.
    w = torch.nn.functional.pad(weight.view(out, groups, GROUP), (0, 0, 0, pad))
    w = w.view(out, supers, SUPER, GROUP)
    s = torch.nn.functional.pad(found.scale.float(), (0, pad)).view(out, supers, SUPER)
    m = torch.nn.functional.pad(found.minimum.float(), (0, pad)).view(out, supers, SUPER)
    best: list[torch.Tensor] | None = None
    for scale_steps, min_steps in zip(SCALE_STEPS, MIN_STEPS, strict=True):
        candidate = _fit(w, s, m, scale_steps, min_steps, 2**bits - 1)
        if best is None:
            best = candidate
            continue
        better = candidate[-1] < best[-1]
        best = [
            torch.where(better.view(*better.shape, *([1] * (new.dim() - 2))), new, old)
            for new, old in zip(candidate, best, strict=True)
        ]
    assert best is not None
    q, sc, mn, d, dmin, _ = best
    q = q.view(out, supers * SUPER * GROUP)[:, :inner].contiguous()
    sc = sc.view(out, supers * SUPER)[:, :groups].contiguous()
    mn = mn.view(out, supers * SUPER)[:, :groups].contiguous()
    return q, sc, mn, d.squeeze(-1), dmin.squeeze(-1)


def _fit(
    w: torch.Tensor, s: torch.Tensor, m: torch.Tensor, scale_steps: int, min_steps: int, levels: int
):
    """One grid: integer sub-scales and minimums, codes, least-squares (d, dmin), the error."""
    d = (s.amax(-1, keepdim=True) / scale_steps).clamp_min(1e-30)
    dmin = (m.abs().amax(-1, keepdim=True) / min_steps).clamp_min(1e-30)
    sc = (s / d).round_().clamp_(0, scale_steps)
    mn = (m / dmin).round_().clamp_(-min_steps, min_steps)
    for _ in range(2):
        step = (d * sc).unsqueeze(-1)
        q = ((w - (dmin * mn).unsqueeze(-1)) / torch.where(step > 0, step, 1.0)).round_()
        q = torch.where(step > 0, q.clamp_(0, levels), 0.0)
        # w ~ d * (sc q) + dmin * mn over the superblock's 256 weights: two unknowns.
        a = (sc.unsqueeze(-1) * q).flatten(-2)
        b = mn.unsqueeze(-1).expand_as(q).flatten(-2)
        y = w.flatten(-2)
        aa, bb, ab = (a * a).sum(-1), (b * b).sum(-1), (a * b).sum(-1)
        ay, by = (a * y).sum(-1), (b * y).sum(-1)
        det = aa * bb - ab * ab
        ok = det.abs() > 1e-12 * (aa * bb).clamp_min(1e-30)
        new_d = torch.where(ok, (ay * bb - by * ab) / torch.where(ok, det, 1.0), d.squeeze(-1))
        new_dmin = torch.where(
            ok, (by * aa - ay * ab) / torch.where(ok, det, 1.0), dmin.squeeze(-1)
        )
        d = torch.where(new_d > 0, new_d, d.squeeze(-1)).unsqueeze(-1)
        dmin = torch.where(new_dmin > 0, new_dmin, dmin.squeeze(-1)).unsqueeze(-1)
    restored = q * (d * sc).unsqueeze(-1) + (dmin * mn).unsqueeze(-1)
    error = (restored - w).pow_(2).sum((-1, -2))
    return [q.to(torch.uint8), sc.to(torch.uint8), mn.to(torch.int8), d, dmin, error]


def holds_half(codes: SuperCodes) -> bool:
    """Whether every float factor of ``codes`` is a float16 (and in the Q6_K form dmin is
    -32 d), so that the kernel's half records hold them: what a GGUF's blocks store."""

    def half(t: torch.Tensor) -> bool:
        return bool(torch.equal(t.half().float(), t))

    if codes.sub == Q6K_SUB:
        return half(codes.d) and torch.equal(codes.dmin, codes.d * -Q6K_OFFSET)
    return half(codes.d) and half(codes.dmin)


def to_half(codes: SuperCodes) -> SuperCodes:
    """``codes`` with d and dmin rounded to float16 (nearest, as a GGUF stores them; the Q6_K
    form's dmin again -32 d): for codes that came from a quantized file, whose factors were
    float16 before the refit moved them by a float32 rounding."""
    d = codes.d.half().float()
    dmin = d * -Q6K_OFFSET if codes.sub == Q6K_SUB else codes.dmin.half().float()
    if not bool(torch.isfinite(d).all() and torch.isfinite(dmin).all()):
        raise ValueError("q4: factors beyond float16's range have no half records")
    return SuperCodes(codes.q, codes.sc, codes.mn, d, dmin, codes.bits, codes.sub)


def pack(codes: SuperCodes, half: bool = False) -> torch.Tensor:
    """The kernel's layout (``superblock.cpp``): per block of 16 outputs, its superblocks'
    records in order; outputs padded to a multiple of 16 with zero weights. ``half``: the
    records' factors in float16 (``holds_half`` must hold)."""
    if half and not holds_half(codes):
        raise ValueError("q4: half records need factors that are float16 (holds_half)")
    q, sc, mn, d, dmin = codes.q, codes.sc, codes.mn, codes.d, codes.dmin
    out, inner = q.shape
    groups = inner // GROUP
    supers = supers_of(groups)
    pad = -out % LANES
    if pad:
        q, sc, mn, d, dmin = (
            torch.cat([t, t.new_zeros(pad, t.shape[1])]) for t in (q, sc, mn, d, dmin)
        )
    blocks = (out + pad) // LANES
    if codes.bits in (4, 6):
        # k within a group = 8 * chunk + 4 * half + t; a byte holds half 0 low, half 1 high.
        nib = q.view(blocks, LANES, groups, 4, 2, 4).permute(0, 2, 3, 1, 4, 5)
        low = nib & 15
        data = (low[..., 0, :] | (low[..., 1, :] << 4)).reshape(blocks, groups, -1)
        if codes.bits == 6:
            # Then plane P's byte 4 * lane + t holds, in bits 2i..2i+1, the high 2 of the
            # code in nibble vector 4P + i = 2 * chunk + half.
            high = (nib >> 4).to(torch.int32).view(blocks, groups, 2, 2, LANES, 2, 4)
            shift = 2 * (2 * torch.arange(2).view(2, 1, 1, 1) + torch.arange(2).view(1, 1, 2, 1))
            planes = (high << shift).sum((3, 5)).to(torch.uint8)  # [blocks, groups, 2, 16, 4]
            data = torch.cat([data, planes.reshape(blocks, groups, -1)], dim=-1)
    else:  # k = 4 * chunk + t
        data = (
            q.view(blocks, LANES, groups, 8, 4).permute(0, 2, 3, 1, 4).reshape(blocks, groups, -1)
        )
    per = SUPER * GROUP // codes.sub  # sub-scales a superblock
    extra = supers * per - sc.shape[1]
    sc = torch.nn.functional.pad(sc, (0, extra)).view(blocks, LANES, supers, per)
    mn = torch.nn.functional.pad(mn, (0, extra)).view(blocks, LANES, supers, per // 2, 2)
    if codes.sub == Q6K_SUB and not torch.equal(codes.mn, codes.sc):
        raise ValueError("q6k: the minimums must be the sub-scales")
    records = []
    for s in range(supers):
        n = min(SUPER, groups - s * SUPER)
        if codes.sub == Q6K_SUB:  # [8 groups][16 lanes][2 halves] int8, scales and minimums
            scales = [sc[:, :, s].view(blocks, LANES, SUPER, 2).transpose(1, 2)]
        else:
            scales = [
                sc[:, :, s].transpose(1, 2),  # [8][16]
                mn[:, :, s].permute(0, 2, 1, 3),  # [4][16][2]
            ]
        factors = [d] if half and codes.sub == Q6K_SUB else [d, dmin]
        meta = [
            *(part.reshape(blocks, -1).view(torch.uint8) for part in scales),
            *(
                f.view(blocks, LANES, supers)[:, :, s]
                .to(torch.half if half else torch.float32)
                .contiguous()
                .view(torch.uint8)
                for f in factors
            ),
        ]
        records.append(data[:, s * SUPER : s * SUPER + n].reshape(blocks, -1))
        records += [part.reshape(blocks, -1) for part in meta]
    return torch.cat(records, dim=1).contiguous().view(-1)


@dataclass(frozen=True, slots=True)
class SuperWeights:
    """A superblock 4-bit layer: ``packed`` for a compiled path, or ``codes`` for the PyTorch
    reference; ``path`` names which (``kernels.PATHS`` or ``kernels.REFERENCE``)."""

    out_features: int
    in_features: int
    path: str
    packed: torch.Tensor | None
    codes: SuperCodes | None
    bias: torch.Tensor | None
    bits: int = 4
    sub: int = GROUP
    half: bool = False  # records with float16 factors (``pack``)

    @classmethod
    def build(
        cls, codes: SuperCodes, bias: torch.Tensor | None = None, path: str = "auto"
    ) -> SuperWeights:
        """Packed for ``path``; in half records wherever the factors allow (fewer bytes to
        read a token, the same results)."""
        path = kernels.check_path(path)
        out, inner = codes.q.shape
        bias = None if bias is None else bias.float().contiguous()
        if path == kernels.REFERENCE:
            return cls(out, inner, path, None, codes, bias)
        half = holds_half(codes)
        return cls(out, inner, path, pack(codes, half), None, bias, codes.bits, codes.sub, half)

    @property
    def nbytes(self) -> int:
        if self.packed is not None:
            return self.packed.numel()
        c = self.codes
        codes = c.q.numel() * c.bits // 8
        scales = c.sc.numel() * (1 if c.sub == Q6K_SUB else 2)  # Q6_K's minimums are its scales
        return codes + scales + 4 * (c.d.numel() + c.dmin.numel())


def linear(x: torch.Tensor, weights: SuperWeights) -> torch.Tensor:
    """x: [rows, in] float32, contiguous -> [rows, out]. A row's result does not depend on the
    other rows, bit for bit."""
    if weights.codes is not None:
        return reference(x, weights.codes, weights.bias)
    return torch.ops.quickdraft_kernels.superblock_linear(
        x,
        weights.packed,
        weights.out_features,
        weights.in_features,
        weights.bias,
        kernels.PATHS[weights.path],
        weights.bits,
        weights.sub,
        weights.half,
    )


def quantize_activations(
    x: torch.Tensor, sub: int = GROUP
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [rows, in] -> codes [rows, supers, 256] (float, integers in -127..127, zero past the
    end), scale [rows, supers] and the sums of codes per ``sub`` inputs [rows, supers,
    256 / sub]: the kernel's ``quantize_rows``, bit for bit."""
    rows, inner = x.shape
    groups = inner // GROUP
    supers = supers_of(groups)
    padded = torch.nn.functional.pad(x, (0, supers * SUPER * GROUP - inner))
    blocks = padded.view(rows, supers, SUPER * GROUP)
    amax = blocks.abs().amax(-1)
    nonzero = amax > 0
    # Tensor by tensor: a true division (``127.0 / t`` would multiply by a reciprocal).
    inverse = torch.full_like(amax, 127.0) / torch.where(nonzero, amax, 1.0)
    codes = (blocks * inverse.unsqueeze(-1)).round_().clamp_(-127, 127)
    codes = torch.where(nonzero.unsqueeze(-1), codes, 0.0)
    scale = torch.where(nonzero, amax / torch.full_like(amax, 127.0), 0.0)
    return codes, scale, codes.view(rows, supers, SUPER * GROUP // sub, sub).sum(-1)


def reference(x: torch.Tensor, codes: SuperCodes, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's result in PyTorch operations, in its order: slow, and the same bits. The
    integer sums run in float64 (exact below 2^53) and round once to float32, as the
    kernel's int32 -> float32 conversion does."""
    sub = codes.sub
    p, a_scale, sums = quantize_activations(x.float(), sub)
    out, inner = codes.q.shape
    parts, per = inner // sub, SUPER * GROUP // sub
    supers = supers_of(inner // GROUP)
    pad = supers * per - parts
    rows = x.shape[0]
    q = torch.nn.functional.pad(codes.q.view(out, parts, sub), (0, 0, 0, pad)).double()
    sc = torch.nn.functional.pad(codes.sc, (0, pad)).double().view(out, supers, per)
    mn = torch.nn.functional.pad(codes.mn, (0, pad)).double().view(out, supers, per)
    p = p.double().view(rows, supers * per, sub)
    dots = torch.einsum("rgk,ogk->gro", p, q).reshape(supers, per, rows, out)
    S = torch.einsum("sjro,osj->sro", dots, sc).float()
    M = torch.einsum("rsj,osj->sro", sums.double(), mn).float()
    acc = x.new_zeros(rows, out)
    for s in range(supers):
        t = codes.d[:, s] * S[s] + codes.dmin[:, s] * M[s]
        acc = acc + t * a_scale[:, s : s + 1]
    return acc if bias is None else acc + bias
