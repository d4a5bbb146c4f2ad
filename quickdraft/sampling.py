"""Logits to probabilities, and probabilities to tokens: the one place either happens.

Drafts and targets both go through :func:`probs_from_logits`, so "the target's distribution" has a
single definition that the acceptance rules, the conformance test and plain decoding all share.
Order of operations, as in Hugging Face transformers: temperature, then top-k, then top-p.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from quickdraft.config import SamplingParams


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits into the distribution that sampling draws from.

    logits: [..., V] any float dtype. Returns float32 probabilities [..., V], each row summing to 1.

    - temperature 0: a one-hot row at the argmax; ties go to the lowest token id.
    - top_k > 0: tokens whose logit is below the k-th largest get probability 0 (tokens tied
      with the k-th are all kept, so the rule never depends on sort order).
    - top_p < 1: after top-k, sort by probability (stable: ties keep id order) and keep each token
      whose preceding mass is below top_p; the most likely token is always kept.
    """
    logits = logits.float()
    if params.temperature == 0:
        # The first maximal index: the lowest token id among ties.
        best = argmax(logits).unsqueeze(-1)
        return torch.zeros_like(logits).scatter_(-1, best, 1.0)

    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)

    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def argmax(values: torch.Tensor) -> torch.Tensor:
    """The index of each row's largest entry along the last dimension, the first among ties
    and a NaN's where a row holds one, as ``torch.argmax``: through NumPy for a float32
    tensor on the CPU, whose reduction is 8-10x faster (6 against 45 us a row over a 49k
    vocabulary, torch 2.13, 2 threads; a greedy step of SmolLM2-135M's spent 0.1 ms in it)."""
    if values.device.type == "cpu" and values.dtype == torch.float32 and not values.requires_grad:
        return torch.from_numpy(np.asarray(values.numpy().argmax(-1)))  # a row's: 0-d
    return values.argmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row. probs: [..., V] rows summing to 1. Returns long [...].

    A one-hot row always yields its token, so greedy decoding goes through here unchanged.
    When every row has a probability of exactly 1.0 (greedy decoding: one-hot rows), the draw is
    its argmax without touching the generator: torch.multinomial would spend an exponential
    variate per vocabulary entry to say the same (``benchmarks/results/defaults.md``). A
    float32 row whose largest entry rounds to 1.0 leaves the others less than float32's
    resolution of 1.0 between them, the precision the distribution is given in.
    """
    flat = probs.reshape(-1, probs.shape[-1])
    if bool((flat.amax(dim=-1) == 1.0).all()):
        return argmax(flat).reshape(probs.shape[:-1])
    tokens = torch.multinomial(flat, 1, generator=generator)
    return tokens.reshape(probs.shape[:-1])


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded from ``seed``, or from fresh entropy when it is None."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def _key(params: SamplingParams) -> tuple[float, int, float]:
    return (params.temperature, params.top_k, params.top_p)


def probs_for_rows(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Each row's distribution under its own parameters. logits: [B, ..., V]; params: one per
    row. Rows that share temperature, top-k and top-p go through ``probs_from_logits``
    together, so the one definition holds row by row."""
    first = params[0]
    if all(_key(p) == _key(first) for p in params):
        return probs_from_logits(logits, first)
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    groups: dict[tuple[float, int, float], list[int]] = {}
    for row, p in enumerate(params):
        groups.setdefault(_key(p), []).append(row)
    for rows in groups.values():
        index = torch.tensor(rows, device=logits.device)
        out[index] = probs_from_logits(logits[index], params[rows[0]])
    return out


def sample_rows(
    probs: torch.Tensor,
    generators: Sequence[torch.Generator | None],
    shared: torch.Generator | None,
) -> torch.Tensor:
    """``sample`` row by row where rows bring their own generator. probs: [B, ..., V];
    generators: one per row, None for rows that draw from ``shared`` together. A seeded row
    thus draws the same numbers whatever else is in the batch."""
    own = [row for row, g in enumerate(generators) if g is not None]
    if not own:
        return sample(probs, shared)
    out = torch.empty(probs.shape[:-1], dtype=torch.long, device=probs.device)
    rest = [row for row, g in enumerate(generators) if g is None]
    if rest:
        index = torch.tensor(rest, device=probs.device)
        out[index] = sample(probs[index], shared)
    for row in own:
        out[row] = sample(probs[row], generators[row])
    return out
