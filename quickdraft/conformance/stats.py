"""The exact joint distribution of a toy target's first tokens, and the chi-square test of
observed counts against it."""

from __future__ import annotations

import torch
from scipy import stats as scipy_stats

from quickdraft.config import SamplingParams
from quickdraft.constraints import Grammars
from quickdraft.engine.constrain import node_masks
from quickdraft.models.base import Model
from quickdraft.models.toy import ToyTokenizer
from quickdraft.sampling import probs_from_logits
from quickdraft.toys import TOY_VOCAB

MIN_EXPECTED = 5.0  # bins expected fewer times are pooled


def exact_distribution(
    model: Model,
    prompt: tuple[int, ...],
    params: SamplingParams,
    length: int,
    tokenizer: ToyTokenizer | None = None,
) -> torch.Tensor:
    """P(first ``length`` tokens) for every sequence: [V^length], index base V, first token
    most significant. Computed with the same ``probs_from_logits`` the engine samples with;
    under a constraint, after the logits are masked to what the grammar allows after each
    sequence (``tokenizer``'s characters; the toy letters by default)."""
    vocab = model.vocab_size
    sequences = torch.tensor([prompt], dtype=torch.long)
    joint = torch.ones(1, dtype=torch.float64)
    matcher = None
    if params.constraint is not None:
        reader = tokenizer or ToyTokenizer(TOY_VOCAB)
        matcher = Grammars(reader, vocab).matcher(params.constraint)
    for _ in range(length):
        rows, width = sequences.shape
        cache = model.new_cache(rows, width)
        positions = torch.arange(width).expand(rows, -1)
        device = model.device
        logits = model.forward(sequences.to(device), positions.to(device), cache).logits[:, -1]
        if matcher is not None:
            outputs = sequences[:, len(prompt) :].tolist()
            allowed = torch.stack([node_masks(matcher, row, list(range(-1, len(row) - 1)))[-1]
                                   for row in outputs])  # fmt: skip
            logits = logits.masked_fill(~allowed.to(logits.device), float("-inf"))
        step = probs_from_logits(logits, params).double().cpu()  # [rows, V]
        joint = (joint.unsqueeze(1) * step).reshape(-1)
        sequences = torch.cat(
            [sequences.repeat_interleave(vocab, 0), torch.arange(vocab).repeat(rows).unsqueeze(1)],
            dim=1,
        )
    return joint


def chi_square(observed: torch.Tensor, probs: torch.Tensor) -> tuple[float, float, int]:
    """(p-value, total variation, bins used) of observed counts [M] against probs [M]."""
    samples = int(observed.sum())
    observed, probs = observed.double(), probs.double()
    total_variation = 0.5 * float((observed / samples - probs).abs().sum())
    if bool((observed[probs <= 0] > 0).any()):
        return 0.0, total_variation, int(observed.numel())  # an impossible sequence appeared
    expected = probs * samples
    possible = probs > 0
    observed, expected = observed[possible], expected[possible]
    order = torch.argsort(expected)
    observed, expected = observed[order], expected[order]
    small = int((expected < MIN_EXPECTED).sum())
    if small:
        # Pool the small bins into one; if even that is too small, add the next bin to it.
        pooled = max(small, 2)
        while pooled < expected.numel() and float(expected[:pooled].sum()) < MIN_EXPECTED:
            pooled += 1
        observed = torch.cat([observed[:pooled].sum().view(1), observed[pooled:]])
        expected = torch.cat([expected[:pooled].sum().view(1), expected[pooled:]])
    if expected.numel() < 2:
        return 1.0, total_variation, int(expected.numel())
    statistic = float(((observed - expected) ** 2 / expected).sum())
    p_value = float(scipy_stats.chi2.sf(statistic, df=expected.numel() - 1))
    return p_value, total_variation, int(expected.numel())
