"""Layers the models and drafters share: the linear layer (prepacked float, int8, or the
quantized kernels' layouts), RMS norm and the rotary embedding (Hugging Face's rotate-half
convention). Attention and its masks are in ``models.attention``."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from quickdraft.kernels import groups, superblock
from quickdraft.models import exact
from quickdraft.models import int8 as int8_ops

# The quantized layers' layouts (``Linear.quantize_q4``), the fast one first.
LAYOUTS = ("superblock", "groups")
Part = superblock.SuperWeights | groups.GroupWeights


@dataclass(frozen=True, slots=True)
class StackedWeights:
    """A quantized layer as runs of output rows, each in its own layout and code width: its
    output is theirs side by side. Each part computes its rows as it would alone, so the
    layer is batch-invariant like them."""

    parts: tuple[Part, ...]

    @property
    def out_features(self) -> int:
        return sum(part.out_features for part in self.parts)

    @property
    def in_features(self) -> int:
        return self.parts[0].in_features

    @property
    def path(self) -> str:
        return self.parts[0].path

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts)


QuantWeights = Part | StackedWeights


def parts_of(weights: QuantWeights) -> tuple[Part, ...]:
    """A layer's quantized weights as the runs of rows the kernels compute one call each."""
    return weights.parts if isinstance(weights, StackedWeights) else (weights,)


def layout_of(weights: QuantWeights | None) -> str | None:
    """The ``LAYOUTS`` name of a layer's quantized weights ("superblock+groups" for stacked
    parts in both; None: not quantized)."""
    if weights is None:
        return None
    fast = [isinstance(part, superblock.SuperWeights) for part in parts_of(weights)]
    return "+".join(([LAYOUTS[0]] if any(fast) else []) + ([LAYOUTS[1]] if not all(fast) else []))


def quantized_linear(x: torch.Tensor, weights: QuantWeights) -> torch.Tensor:
    """x [rows, in] float32, contiguous -> [rows, out] on the kernel of each part."""
    outs = [
        superblock.linear(x, part) if isinstance(part, superblock.SuperWeights)
        else groups.linear(x, part)
        for part in parts_of(weights)
    ]  # fmt: skip
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


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
        self, bits: int = 4, exact_only: bool = False, layout: str = "superblock",
        groups_fallback: bool = False, given: list[superblock.SuperCodes] | None = None,
    ) -> None:  # fmt: skip
        """To 4-bit (or 8-bit) weights in place: batch-invariant by construction, and needing
        no calibration. ``layout``: "superblock" (``kernels.superblock``: activations quantized
        per row and 256 inputs, integer sub-scales; the fast one) or "groups"
        (``kernels.groups``: activations per 32 inputs, for models with outlier channels).
        ``exact_only``: weights that came from a quantized file take the narrowest form that
        reproduces them (``models.exact``: within ``EXACT_ERROR``): ``bits`` if 4, then on
        superblocks the Q6_K form, else ``EXACT_FALLBACK_BITS``; so a GGUF's 6- and 8-bit
        tensors are not rounded again to 4; ``given``: the file's own codes for the weight's
        rows, in order (a GGUF's Q4_K and Q6_K blocks, ``gguf.BlockSource``), taken as they
        are where they reproduce the weight (with ``exact_only``, on superblocks); with
        ``groups_fallback`` (a 4-bit target) the 8-bit fallback takes the groups layout
        (``EXACT_FALLBACK_BITS`` says why). A fused product whose rows came in different forms
        keeps each run in its own (``MAX_PARTS``). It may run again with another layout until
        ``release_dense``.
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
        runs = exact.given_runs(given, weight) if exact_only and module is superblock else None
        if runs is None and exact_only:
            fallback = groups if groups_fallback else module
            runs = exact.exact_runs(module, weight, bits, fallback)
        elif runs is None:
            runs = [module.quantize(weight, bits)]
        parts, first = [], 0
        for codes in runs:
            rows = codes.q.shape[0]
            bias = None if self.bias is None else self.bias[first : first + rows]
            weights = groups.GroupWeights if isinstance(codes, groups.GroupCodes) else (
                superblock.SuperWeights
            )  # fmt: skip
            parts.append(weights.build(codes, bias))
            first += rows
        self._quant = parts[0] if len(parts) == 1 else StackedWeights(tuple(parts))
        self._dense, self.weight = weight, None

    def release_dense(self) -> None:
        """Drop the float weight ``quantize_q4`` kept for another try."""
        self._dense = None

    @property
    def quantized_weights(self) -> QuantWeights | None:
        return self._quant

    def use_quantized(self, weights: QuantWeights, keep_dense: bool = False) -> None:
        """Take weights ``quantize_q4`` made earlier (``models.quantized``), in place;
        ``keep_dense``: the same weights moved (``quantized.gather``), so a dense weight kept
        for another try stays."""
        self._quant, self.weight = weights, None
        if not keep_dense:
            self._dense = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._observing:
            seen = x.detach().reshape(-1, x.shape[-1]).abs().amax(dim=0).float()
            self.channel_amax = seen if self.channel_amax is None else self.channel_amax.max(seen)
        if self.weight is not None:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, x.shape[-1])
        if not flat.is_contiguous():
            flat = flat.contiguous()
        if self._quant is not None:
            out = quantized_linear(flat, self._quant)
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


# The codes a drafter's quantized layers and head rows take on the compiled kernels
# (``draft_linear``). 4 bits: against the int8 kernels, Qwen2.5-Coder-0.5B's FR-Spec head rows
# (38,818 x 896) cost 0.41 ms for one row instead of 0.88 and 0.63 instead of 1.07 for four
# (1.79 against 1.83 for ten), its drafter's gate/up 0.06 instead of 0.14; 8 bits is no faster
# than int8 on the heads (benchmarks/results/drafter_bits/products.md). End to end the 0.5B's
# EAGLE drafts in 10.2 ms a forward instead of 16.3 with the same acceptance (2.16 tokens a
# forward): 59.0 decode tokens/s against 50.0 (report.md there). A drafter's weights only
# shape its proposals: the target's verification keeps the output exact. None: the int8
# kernels everywhere (for comparisons).
DRAFT_BITS: int | None = 4


def draft_linear(
    weight: torch.Tensor, bias: torch.Tensor | None = None, *, quantize: bool
) -> Linear:
    """A drafter's linear layer (its network's or its rows of the target's head). ``quantize``:
    ``DRAFT_BITS`` codes on the compiled kernels where they run (CPU, float32, a width that is
    a multiple of 32; superblocks when it is a multiple of 256, else groups), else int8 per
    output channel; otherwise prepacked float."""
    from quickdraft import kernels

    weight = weight.detach().float().contiguous()
    bias = None if bias is None else bias.detach().float()
    width = weight.shape[1]
    plain = not quantize or DRAFT_BITS is None or weight.device.type != "cpu" or width % 32
    if plain or not kernels.native():
        return Linear(weight, bias, int8=quantize)
    linear = Linear(weight, bias, prepack=False)
    linear.quantize_q4(DRAFT_BITS, layout=LAYOUTS[0] if width % 256 == 0 else LAYOUTS[1])
    linear.release_dense()
    return linear


class PackedLinear(torch.nn.Module):
    """An inference-only stand-in for an ``nn.Linear``: the runner's prepacked product, whose
    cost stays nearly flat from 1 to 16 rows on CPU where ``F.linear``'s does not; with
    ``quantize``, ``draft_linear``'s codes."""

    def __init__(self, linear: torch.nn.Linear, quantize: bool):
        super().__init__()
        self.linear = draft_linear(linear.weight, linear.bias, quantize=quantize)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def packed_copy(module: torch.nn.Module, int8: bool) -> Any:
    """A copy of ``module`` for inference, its ``nn.Linear`` layers prepacked (``int8``:
    quantized, ``draft_linear``); the original keeps training."""
    clone = copy.deepcopy(module)
    for parent in list(clone.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, PackedLinear(child, int8))
    return clone.eval()
