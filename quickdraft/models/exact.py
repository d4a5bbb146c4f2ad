"""Which codes a quantized file's tensor takes on the 4-bit kernels (``ops.Linear.quantize_q4``
with ``exact_only``): the file's own blocks where they are given and reproduce it
(``given_runs``), else the narrowest form that reproduces it, 4 bits (superblocks, or groups of
32 for a Q4_0 or Q4_1 tensor), the Q6_K form, or 8 bits, by runs of rows where its rows came in
different forms (``exact_runs``), with float16 factors where the file had them (half
records). Nothing a tensor holds is rounded twice."""

from __future__ import annotations

import itertools
from dataclasses import fields
from typing import Any

import torch

from quickdraft.kernels import superblock

# A layer's weights are "already 4-bit" when 4-bit codes reproduce them to this relative
# error: a GGUF's Q4_1 blocks come back exactly, its Q4_K blocks to float16 rounding of their
# scales (about 1e-4), while 4 bits lose about 0.03 of a Q6_K tensor and 0.08 of float ones.
EXACT_ERROR = 0.005
# What rounding a row's factors to float16 may add to its error, relative to its norm: a
# quantized file's rows (float16 factors found again) add none; others about 2e-4.
HALF_ERROR = 1e-5
# How far a file's own codes may dequantize from its converted float weights, relative to the
# largest: a float32 rounding (a Q6_K's d * sc * (q - 32) against d * sc * q - 32 d * sc).
GIVEN_ERROR = 1e-6
# The codes a quantized file's tensor gets when neither 4 bits nor the Q6_K form
# (``superblock.quantize_q6k``) reproduce it (a GGUF's Q8_0 tensors). A GGUF's Q6_K tensors (its
# head and some value and down projections in a Q4_K_M file) keep their own form, 6.5625 bits
# a weight on the kernel (the file's own). Plain 6-bit codes per 32 were measured and not taken:
# they round Q6_K's groups of 16 again (relative weight error 0.016 against 0.005 at 8 bits),
# which cost Qwen2.5-Coder-0.5B a relative logit error of 0.036 against 0.026 on the load's probe.
EXACT_FALLBACK_BITS = 8
# Those fallback tensors (a GGUF's Q5_0 and Q8_0, which a Q4_K_M file holds where a K-quant's
# 256 does not divide the width: most of Qwen2.5-Coder-0.5B's projections) take the groups
# layout, activations quantized per 32 inputs as llama.cpp's Q8_0 does for them: per 256 doubled
# their output error (the 0.5B's gate/up 0.0098 relative against 0.0051, q/k/v 0.0091 against
# 0.0047, on the float model's inputs) and left its top-1 agreement with float at 98.3% against
# llama.cpp's 99.1% (``benchmarks/quant_agreement.py``). K-quant tensors keep superblocks,
# whose activation scale per 256 is llama.cpp's Q8_K for them too.
# A fused product of a quantized file whose tensors came in different forms (a Q4_K_M file's
# q and k in Q4_K beside a value projection in Q6_K, in half of Qwen2.5-Coder-1.5B's layers)
# keeps each run of rows in its own exact form, up to this many runs; past it, or where no
# form reproduces a run, the whole product takes the 8-bit fallback. 14 of the 1.5B's q/k/v
# products read 26.2 MiB a token so against 47.2 in 8 bits (the model 978.5 MiB against 999.5;
# decode 1.019x faster, ``benchmarks/stacked_products.py``).
MAX_PARTS = 4
MIN_RUN = 16  # rows: a kernel block's outputs


def exact_runs(module: Any, weight: torch.Tensor, bits: int, fallback: Any) -> list[Any]:
    """The narrowest codes that reproduce a quantized file's weights (within ``EXACT_ERROR``):
    ``bits`` when 4 (in ``module``'s layout, then in ``fallback``'s), the Q6_K form on
    superblocks, else 8 bits in the layout ``fallback`` (``ops.Linear.quantize_q4``). Where no
    form reproduces the whole tensor, on superblocks, by runs of rows that each have one (at
    most ``MAX_PARTS``): the rows each form reproduces are found from the codes already tried,
    and each run is judged, and cut from them, as a whole."""
    makers = [lambda: module.quantize(weight, bits)] if bits == 4 else []
    if bits == 4 and fallback is not module:
        # A file's 4-bit blocks of 32 (Q4_0, Q4_1: every projection of SmolLM2-135M's
        # file) in the fallback's groups: 5 bits a weight against 8.5.
        makers.append(lambda: fallback.quantize(weight, bits))
    if module is superblock:
        makers.append(lambda: superblock.quantize_q6k(weight))
    norms = weight.pow(2).sum(dim=1)  # squared, per row
    tried = []  # (codes, squared error per row), in the order tried: the narrowest first
    for make in makers:
        codes = make()
        errors = (codes.dequantize() - weight).pow(2).sum(dim=1)
        if isinstance(codes, superblock.SuperCodes):
            codes, errors = _as_half(codes, errors, weight, norms)
        if _fits(errors, norms):
            return [codes]
        tried.append((codes, errors))

    def fallback_codes(rows: torch.Tensor) -> Any:
        return fallback.quantize(rows, EXACT_FALLBACK_BITS if fallback is superblock else 8)

    whole = fallback_codes(weight)
    if module is not superblock:
        return [whole]
    form = torch.full((weight.shape[0],), len(tried))  # no form: the fallback
    for index in reversed(range(len(tried))):  # the narrowest that fits a row wins
        form[tried[index][1] <= EXACT_ERROR**2 * norms] = index
    bounds = _runs(form.tolist())
    if len(bounds) - 1 > MAX_PARTS or len(bounds) == 2:
        return [whole]
    runs = []
    for a, b in itertools.pairwise(bounds):
        fit = next((c for c, errors in tried if _fits(errors[a:b], norms[a:b])), None)
        runs.append(fallback_codes(weight[a:b]) if fit is None else _rows(fit, a, b))
    # A run its rows' form misses as a whole falls back like its neighbour: no gain in parts.
    kinds = [(type(codes), codes.bits) for codes in runs]
    if any(a == b for a, b in itertools.pairwise(kinds)):
        return [whole]
    return runs


def given_runs(given: list[superblock.SuperCodes] | None, weight: torch.Tensor) -> list | None:
    """A file's own codes for ``weight``'s rows as runs of one form each (a Q4_K_M file's q
    and k in Q4_K, its v in Q6_K), or None where there are none or they do not give the
    weight (a file whose float weights were rearranged, such as llama.cpp's q/k order)."""
    if not given or sum(c.q.shape[0] for c in given) != weight.shape[0]:
        return None
    if any(c.q.shape[1] != weight.shape[1] for c in given):
        return None
    runs: list[superblock.SuperCodes] = []
    for codes in given:
        last = runs[-1] if runs else None
        if last is not None and (last.bits, last.sub) == (codes.bits, codes.sub):
            runs[-1] = _joined(last, codes)
        else:
            runs.append(codes)
    first = 0
    for codes in runs:
        rows = weight[first : first + codes.q.shape[0]]
        error = (codes.dequantize() - rows).abs().max()
        if not bool(error <= GIVEN_ERROR * rows.abs().max()):
            return None
        first += codes.q.shape[0]
    return runs


def _as_half(
    codes: superblock.SuperCodes, errors: torch.Tensor, weight: torch.Tensor, norms: torch.Tensor
) -> tuple[superblock.SuperCodes, torch.Tensor]:
    """``codes`` with their factors rounded to float16 in the rows where that moves no weight
    (``HALF_ERROR``): a quantized file's rows, whose float16 factors the refit found again up
    to a float32 rounding; rows whose factors were never float16 keep them. Half records
    (``superblock.holds_half``, where every row of a run took them) read fewer bytes a token:
    Q4_K 4.625 bits a weight instead of 4.75, Q6_K its own 6.5625. Row by row, so the rows of
    a run decide alike whatever else the tensor holds."""
    try:
        half = superblock.to_half(codes)
    except ValueError:  # factors beyond float16's range
        return codes, errors
    found = (half.dequantize() - weight).pow(2).sum(dim=1)
    rows = found <= errors + HALF_ERROR**2 * norms
    if not bool(rows.any()):
        return codes, errors
    pick = rows.view(-1, 1)
    mixed = superblock.SuperCodes(
        codes.q, codes.sc, codes.mn, torch.where(pick, half.d, codes.d),
        torch.where(pick, half.dmin, codes.dmin), codes.bits, codes.sub,
    )  # fmt: skip
    return mixed, torch.where(rows, found, errors)


def _fits(errors: torch.Tensor, norms: torch.Tensor) -> bool:
    """Whether rows with these squared errors and squared norms are reproduced."""
    return bool(errors.sum().sqrt() <= EXACT_ERROR * norms.sum().sqrt().clamp_min(1e-30))


def _rows(codes: Any, a: int, b: int) -> Any:
    """Rows [a, b) of quantized codes (every quantizer fits a row by itself)."""
    cut = {f.name: getattr(codes, f.name) for f in fields(codes)}
    return type(codes)(**{k: v[a:b] if isinstance(v, torch.Tensor) else v for k, v in cut.items()})


def _joined(first: Any, second: Any) -> Any:
    """Codes of one form with ``second``'s rows after ``first``'s (``_rows``' inverse)."""
    pairs = {f.name: (getattr(first, f.name), getattr(second, f.name)) for f in fields(first)}
    return type(first)(
        **{k: torch.cat(v) if isinstance(v[0], torch.Tensor) else v[0] for k, v in pairs.items()}
    )


def _runs(form: list[int]) -> list[int]:
    """The bounds of the runs of equal ``form`` in rows, a run shorter than ``MIN_RUN`` joined
    to the one before it (the first to the one after it): a stray row that its run's form
    misses alone (the 1.5B's q/k rows hold a few) is then judged with its run, as a whole
    tensor is."""
    changes = [i for i in range(1, len(form)) if form[i] != form[i - 1]]
    runs: list[list[int]] = []  # [start, end, form]
    for start, end in itertools.pairwise([0, *changes, len(form)]):
        if runs and (end - start < MIN_RUN or runs[-1][2] == form[start]):
            runs[-1][1] = end
        else:
            runs.append([start, end, form[start]])
    if len(runs) > 1 and runs[0][1] < MIN_RUN:
        runs[1][0] = 0
        del runs[0]
    return [0] + [end for _, end, _ in runs]
