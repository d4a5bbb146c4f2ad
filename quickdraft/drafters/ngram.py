"""Prompt lookup (n-gram) drafting: copy what followed the last n tokens earlier in the text.

No model at all: the drafter matches the last n tokens (n from ``max_n`` down to ``min_n``)
against the prompt and the output so far, takes the most recent earlier occurrence, and proposes
the tokens that followed it. Deterministic, so its drafts carry no probabilities and the
acceptance rules treat them as point masses (exact at any temperature). Strong on code edits,
summaries and anything that quotes its input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.config import MAX_LOOKUP_NGRAM, MethodOptions, SpecConfig, check_range
from quickdraft.drafters.base import Batch, BuildContext, Draft, Needs, Stateless


def check_lookup_ngram(low: int, high: int) -> None:
    """``prompt_lookup_min`` and ``_max``: n-gram sizes in 1..32, min <= max."""
    for name, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
        check_range(name, value, 1, MAX_LOOKUP_NGRAM, integer=True)
    if low > high:
        raise ValueError(f"prompt_lookup_min ({low}) must not exceed prompt_lookup_max ({high})")


@dataclass(frozen=True, slots=True)
class NGramOptions(MethodOptions):
    """prompt_lookup_min, prompt_lookup_max: the n-gram sizes matched, longest first,
    1..32."""

    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3

    def __post_init__(self) -> None:
        check_lookup_ngram(self.prompt_lookup_min, self.prompt_lookup_max)


class NGramDrafter(Stateless):
    def __init__(self, vocab_size: int, num_tokens: int, min_n: int = 1, max_n: int = 3):
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        check_lookup_ngram(min_n, max_n)
        self.vocab_size = vocab_size
        self.num_tokens = num_tokens
        self.needs = Needs(tokens=num_tokens, depth=num_tokens, shortens=True)
        self.min_n, self.max_n = min_n, max_n

    def propose(self, batch: Batch) -> Draft:
        """The text itself is the model: the lookup runs on the host, over each row's text."""
        lengths = batch.lengths.tolist()  # a host sync, and the text's used part below
        texts = batch.tokens[:, : max(lengths)].cpu()
        most = batch.limit or self.num_tokens
        rows = [self._lookup(texts[b, : lengths[b]], most) for b in range(batch.size)]
        width = max(len(row) for row in rows)
        tokens = torch.zeros(batch.size, width, dtype=torch.long)
        for b, row in enumerate(rows):
            # Rows with a shorter match are padded by repeating their last known token: any
            # deterministic filler keeps the output exact; the target simply rejects it.
            last = row[-1] if row else int(texts[b, lengths[b] - 1])
            tokens[b] = torch.tensor(row + [last] * (width - len(row)), dtype=torch.long)
        return Draft.chain(tokens)

    def _lookup(self, sequence: torch.Tensor, most: int | None = None) -> list[int]:
        most = most or self.num_tokens
        length = sequence.shape[0]
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            pattern = sequence[length - n :]
            windows = sequence[: length - 1].unfold(0, n, 1)  # every earlier n-gram
            starts = torch.nonzero((windows == pattern).all(dim=1)).flatten()
            if starts.numel():
                start = int(starts[-1]) + n  # the most recent match
                return sequence[start : start + most].tolist()
        return []

    @property
    def head_rows(self) -> int:
        return 0  # no head: the text is the model

    def describe(self) -> str:
        return f"k={self.num_tokens}"


def build(spec: SpecConfig, context: BuildContext) -> NGramDrafter:
    """The registry's builder: ``spec.options`` are ``NGramOptions``."""
    options = spec.options
    assert isinstance(options, NGramOptions)
    return NGramDrafter(
        context.target.vocab_size,
        spec.num_speculative_tokens,
        options.prompt_lookup_min,
        options.prompt_lookup_max,
    )
