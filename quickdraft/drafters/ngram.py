"""Prompt lookup (n-gram) drafting: copy what followed the last n tokens earlier in the text.

No model at all: the drafter matches the last n tokens (n from ``max_n`` down to ``min_n``)
against the prompt and the output so far, takes the most recent earlier occurrence, and proposes
the tokens that followed it. Deterministic, so its drafts carry no probabilities and the
acceptance rules treat them as point masses (exact at any temperature). Strong on code edits,
summaries and anything that quotes its input.
"""

from __future__ import annotations

import torch

from quickdraft.drafters.base import Batch, Draft, Needs, Stateless


class NGramDrafter(Stateless):
    def __init__(self, vocab_size: int, num_tokens: int, min_n: int = 1, max_n: int = 3):
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        if not 1 <= min_n <= max_n:
            raise ValueError(
                f"prompt_lookup_min/max must satisfy 1 <= min <= max, got {min_n}, {max_n}"
            )
        self.vocab_size = vocab_size
        self.num_tokens = num_tokens
        self.needs = Needs(tokens=num_tokens, depth=num_tokens)
        self.min_n, self.max_n = min_n, max_n

    def propose(self, batch: Batch) -> Draft:
        """The text itself is the model: the lookup runs on the host, over each row's text."""
        lengths = batch.lengths.tolist()  # a host sync, and the text's used part below
        texts = batch.tokens[:, : max(lengths)].cpu()
        rows = [self._lookup(texts[b, : lengths[b]]) for b in range(batch.size)]
        width = max(len(row) for row in rows)
        tokens = torch.zeros(batch.size, width, dtype=torch.long)
        for b, row in enumerate(rows):
            # Rows with a shorter match are padded by repeating their last known token: any
            # deterministic filler keeps the output exact; the target simply rejects it.
            last = row[-1] if row else int(texts[b, lengths[b] - 1])
            tokens[b] = torch.tensor(row + [last] * (width - len(row)), dtype=torch.long)
        return Draft.chain(tokens)

    def _lookup(self, sequence: torch.Tensor) -> list[int]:
        length = sequence.shape[0]
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            pattern = sequence[length - n :]
            windows = sequence[: length - 1].unfold(0, n, 1)  # every earlier n-gram
            starts = torch.nonzero((windows == pattern).all(dim=1)).flatten()
            if starts.numel():
                start = int(starts[-1]) + n  # the most recent match
                return sequence[start : start + self.num_tokens].tolist()
        return []
