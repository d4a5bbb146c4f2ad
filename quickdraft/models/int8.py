"""int8 weights that give the same answer on every x86 CPU.

PyTorch's dynamic int8 linear (``quantized.linear_dynamic``, fbgemm) quantizes the activations
with one scale for the whole tensor. Two things then go wrong in a language model:

- Activation outliers. A few input channels of some projections (the MLP's down projection
  above all) are 100x larger than the rest; one scale for all of them leaves the others a few
  levels. Measured on SmolLM2-135M's logits with that scheme simulated in float: relative error
  0.61, 69% top-1 agreement; the down projection alone causes 0.58 of it.
- 16-bit saturation. Without VNNI (AVX2 hosts) the kernel sums pairs of u8 x s8 products into
  int16 (``vpmaddubsw``), which overflows for 8-bit activations; with VNNI it does not. The same
  model then gives different logits on different hosts.

What this module does instead (LLM.int8()'s decomposition, with the outlier channels found once
on a calibration probe rather than at every call):

1. Per-row activation scales. Each row of x is divided by its own absolute maximum before the
   kernel quantizes it, and the output row multiplied back (a linear map commutes with a row
   scale). Two anchor channels (+1, -1, zero weights) fix the kernel's one scale at [-1, 1],
   which then serves every row equally: per-token quantization, the same for a row alone or
   in any batch (what a quantized *target* needs: its verify pass must give each token the
   logits its one-token step does).
2. 7-bit weights (``WEIGHT_MAX``): with 8-bit activations no pair sum can reach 2^15, so the
   int32 result is the same with and without VNNI.
3. Outlier input channels stay in float: the ``outliers`` input channels with the largest
   calibrated magnitude are zeroed in x before quantizing and added back by a float product with
   their weight columns (which are zeroed in the int8 weights, so they do not widen the
   per-channel weight scales).

``benchmarks/int8_accuracy.py`` measures each draft model against its float original:
top-1 agreement on the probe, relative logit error and the decode step's cost (results in
``benchmarks/results/int8_accuracy.md``: SmolLM2-135M 95.9%, 0.047, 0.57 of the float step;
Qwen2.5-Coder-0.5B 97.0%, 0.037, 0.55).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Input channels kept in float per projection: in_features // divisor (at least 1). 1/16
# costs a quarter more weight traffic than int8 alone (float columns are 4 bytes). The MLP's
# down projection, whose input (silu(gate) * up) holds the largest outliers and caused most
# of the remaining error, keeps 1/8. Measured on the probe (top-1 agreement, relative error):
# SmolLM2-135M 1/16 everywhere 94.8%, 0.049; with 1/8 for down 95.9%, 0.047 (1/4: 96.4%,
# 0.046); Qwen2.5-Coder-0.5B with 1/8 for down 97.0%, 0.037.
OUTLIER_DIVISOR = 16
DOWN_OUTLIER_DIVISOR = 8
# With integer outlier products (``pack(invariant=True)``, quantized targets) the channels set
# apart cost no more weight traffic than the rest, so a quarter of them go apart. Measured on
# the probe with integer outlier products (top-1 agreement): Qwen2.5-Coder-0.5B 96.4% at
# 1/16 and 1/8 for down, 96.1% at 1/8 and 1/4, 97.6% at 1/4 everywhere.
INVARIANT_OUTLIER_DIVISOR = 4

# Weights take 7 bits (|q| <= 63) so that activations can take all 8: a pair of u8 x s7
# products sums to at most 2 * 255 * 63 = 32,130 < 2^15, so the int16 pair sums of the AVX2
# kernel cannot saturate and every host computes the same int32 result. Measured on SmolLM2
# logits, 7-bit weights with 8-bit activations beat 8-bit weights with 7-bit activations
# (``reduce_range``): relative error 0.052 against 0.078.
WEIGHT_MAX = 63
# Per-channel weight scales are the clip ratio of the channel's maximum, out of these, that
# minimises the channel's squared rounding error.
CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85)
SCALE_BLOCK_ROWS = 1024


# Two input channels appended to every row, +1 and -1, with zero weights. The kernel quantizes
# its input with one scale and zero point from the whole tensor's minimum and maximum; rows
# scaled to an absolute maximum of 1 then span [-1, 1] only if some row reaches both ends, so a
# row's codes (and its output) would depend on the rows beside it: a verify pass would not give
# a token the logits a one-token step gives it. With the anchors every call spans exactly
# [-1, 1], and each row is quantized the same alone or in any batch.
_ANCHORS = torch.tensor([[1.0, -1.0]])


@dataclass(frozen=True, slots=True)
class Int8Weights:
    """packed: the int8 weights of the usual input channels, kept ([in - n] long, None: all
    of them), prepacked for fbgemm; columns: [n] long, the outlier input channels; their
    weights either dense_columns [n, out] float (transposed; a float product) or outliers,
    int8 prepacked apart (an integer product whose activations get a scale of their own);
    bias: [out] or None (added in float). The outlier columns are left out of ``packed``, not
    zeroed in it: zeros would be read every call (a quarter more weight traffic for a
    quantized target) and add nothing, since a zero weight's product is an exact 0 in int32
    whatever its activation code."""

    packed: object
    kept: torch.Tensor | None
    columns: torch.Tensor | None
    dense_columns: torch.Tensor | None
    outliers: object | None
    bias: torch.Tensor | None


def pack(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    channel_amax: torch.Tensor | None,
    divisor: int = OUTLIER_DIVISOR,
    invariant: bool = False,
) -> Int8Weights:
    """weight: [out, in] float32 on CPU; channel_amax: [in], the largest |x| seen per input
    channel on a calibration probe, or None to keep no channel apart; then in // ``divisor``
    channels get a product of their own: in float (the most accurate), or with ``invariant``
    an integer one, so that each row's result is bit for bit the same alone or in any batch
    (a quantized target's verify pass must give a token its one-token step's logits; a float
    product's rounding changes with the row count, and the next layer's rounding to 8 bits
    turns that into whole steps)."""
    dense = outliers = columns = kept = None
    weight = weight.float()
    if channel_amax is not None:
        count = max(1, weight.shape[1] // divisor)
        columns = channel_amax.float().topk(count).indices.sort().values
        if invariant:
            outliers = _packed(weight[:, columns].contiguous())
        else:
            dense = weight[:, columns].T.contiguous()  # [n, out]
        usual = torch.ones(weight.shape[1], dtype=torch.bool)
        usual[columns] = False
        kept = usual.nonzero().squeeze(1)
        weight = weight[:, kept].contiguous()
    return Int8Weights(_packed(weight), kept, columns, dense, outliers, bias)


def _packed(weight: torch.Tensor) -> object:
    """[out, in] float32 -> 7-bit per-output-channel codes with two zero anchor columns,
    prepacked for fbgemm's dynamic int8 product."""
    scale = _weight_scales(weight)
    # A clip ratio below 1 leaves the row's largest weights past 63 codes: clip them there,
    # or quantize_per_channel would give them up to 127 and the pair sums could saturate.
    limit = (scale * WEIGHT_MAX).unsqueeze(1)
    weight = torch.maximum(torch.minimum(weight, limit), -limit)
    scale = scale.double()
    weight = torch.cat([weight, weight.new_zeros(weight.shape[0], _ANCHORS.shape[1])], dim=1)
    with warnings.catch_warnings():  # quantized tensor constructors warn of future removal
        warnings.simplefilter("ignore", UserWarning)
        quantized = torch.quantize_per_channel(
            weight, scale, torch.zeros_like(scale).long(), 0, torch.qint8
        )
        return torch.ops.quantized.linear_prepack(quantized, None)


def _weight_scales(weight: torch.Tensor) -> torch.Tensor:
    """[out] per-channel scales: for each row, the clip ratio with the least squared error.
    Rows go in blocks so the temporaries stay in cache (a 152k-row head is 0.5 GB a pass)."""
    return torch.cat([_block_scales(block) for block in weight.split(SCALE_BLOCK_ROWS)])


def _block_scales(weight: torch.Tensor) -> torch.Tensor:
    top = (weight.abs().amax(dim=1) / WEIGHT_MAX).clamp_min(1e-12)
    best, best_error = top, None
    for ratio in CLIP_RATIOS:
        trial = (top * ratio).unsqueeze(1)
        error = (weight / trial).round_().clamp_(-WEIGHT_MAX, WEIGHT_MAX).mul_(trial)
        error = error.sub_(weight).pow_(2).sum(dim=1)
        if best_error is None:
            best_error = error
        else:
            better = error < best_error
            best = torch.where(better, trial.squeeze(1), best)
            best_error = torch.where(better, error, best_error)
    return best


def linear(x: torch.Tensor, weights: Int8Weights) -> torch.Tensor:
    """x: [N, in] float32, contiguous -> [N, out]. Each row is quantized by itself
    (``_ANCHORS``); with integer outlier products a row's result is the same alone or in any
    batch, bit for bit."""
    columns = weights.columns
    out = _product(x if columns is None else x.index_select(1, weights.kept), weights.packed)
    if columns is not None and weights.outliers is not None:
        out += _product(x.index_select(1, columns), weights.outliers)
    elif columns is not None:
        out += x.index_select(1, columns) @ weights.dense_columns
    if weights.bias is not None:
        out += weights.bias
    return out


def side_by_side(x: torch.Tensor, weights: Sequence[Int8Weights]) -> torch.Tensor:
    """x: [N, in] float32, contiguous -> [N, sum of outs]: ``linear`` of x by each of
    ``weights``, concatenated, bit for bit. Weights without outlier channels or bias (a
    shortlisted head's row segments) share one scaling of x, so each costs only its product."""
    if any(w.columns is not None or w.bias is not None for w in weights):
        return torch.cat([linear(x, w) for w in weights], dim=-1)
    row_scale, scaled = _scaled(x)
    products = [torch.ops.quantized.linear_dynamic(scaled, w.packed, False) for w in weights]
    return torch.cat(products, dim=-1).mul_(row_scale)


def _scaled(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(each row's absolute maximum [N, 1], the rows divided by it beside the anchors)."""
    row_scale = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    return row_scale, torch.cat([x / row_scale, _ANCHORS.expand(x.shape[0], -1)], dim=1)


def _product(x: torch.Tensor, packed: object) -> torch.Tensor:
    """x [N, k] times 7-bit weights, each row scaled to an absolute maximum of 1 and
    quantized to 8 bits, then scaled back."""
    row_scale, scaled = _scaled(x)
    return torch.ops.quantized.linear_dynamic(scaled, packed, False).mul_(row_scale)


# Two fixed probes: outlier channels are found on the first and the quantized model is judged
# on the second, so the check sees text the calibration did not. Both mix the kinds of text
# quickdraft is benchmarked on (code, prose, dialogue, arithmetic); neither is a bench prompt.
CALIBRATION_TEXT = """<|im_start|>user
Write a function that merges two sorted lists.<|im_end|>
<|im_start|>assistant
def merge(left, right):
    result, i, j = [], 0, 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            result.append(left[i]); i += 1
        else:
            result.append(right[j]); j += 1
    return result + left[i:] + right[j:]
<|im_end|>
The river rose through the night, and by morning the lower fields were a grey lake. Farmers
moved their cattle to the ridge while the mayor read the forecast aloud: 42 mm more by Friday.
Q: A shop sells pens at 3 for $2. How much do 12 pens cost? A: 12 / 3 = 4 groups, 4 * 2 = $8.
"""

PROBE_TEXT = """<|im_start|>user
How do I read a JSON file in Python and print one field?<|im_end|>
<|im_start|>assistant
Use the json module from the standard library:

import json

with open("config.json", encoding="utf-8") as handle:
    data = json.load(handle)
print(data["name"])
<|im_end|>
Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. Most of it happens
in the leaves, inside small green bodies called chloroplasts. In 1771 Joseph Priestley found
that a plant could restore air that a candle had used up.
Q: Tom has 17 apples and gives away 9. How many are left? A: 17 - 9 = 8 apples.
<|im_start|>user
What does this shell command do: find . -name "*.log" -mtime +7 -delete<|im_end|>
<|im_start|>assistant
It searches the current directory and everything below it for files whose names end in
".log" and that were last modified more than seven days ago, and deletes them. Run it once
without -delete first to see which files it would remove.<|im_end|>
class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()
The committee met on Tuesday to discuss the budget for next year. After a long debate, the
members agreed to spend more on public libraries and less on road repairs, which had been
finished ahead of schedule. The final vote was seven to two.
"""


@dataclass(frozen=True, slots=True)
class QuantCheck:
    """A quantized model against its float original on a fixed probe: the mean relative L2
    error of the logits per position, and the share of positions with the same argmax."""

    relative_error: float
    top1_agreement: float
    positions: int

    # A draft whose top-1 agrees less than this with its float original loses more in
    # acceptance than int8 gains in speed (SmolLM2 drafting for itself at k=4: 5.0 accepted
    # tokens a step in float, 1.05 with the old per-tensor int8 at 0-60% agreement).
    MIN_TOP1 = 0.95

    @property
    def passed(self) -> bool:
        return self.top1_agreement >= self.MIN_TOP1

    def describe(self) -> str:
        return (
            f"top-1 agreement {self.top1_agreement:.1%} (needs {self.MIN_TOP1:.0%}), "
            f"relative logit error {self.relative_error:.3f} over {self.positions} positions"
        )


def compare(quantized: torch.Tensor, original: torch.Tensor) -> QuantCheck:
    """quantized, original: [T, V] logits of the same probe."""
    error = (quantized - original).norm(dim=-1) / original.norm(dim=-1).clamp_min(1e-12)
    agree = (quantized.argmax(-1) == original.argmax(-1)).float().mean()
    return QuantCheck(float(error.mean()), float(agree), original.shape[0])
