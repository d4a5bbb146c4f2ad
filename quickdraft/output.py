"""What a run returns, and the output as it grows step by step (appending accepted chunks,
deciding when each row is finished)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import DecodeState
from quickdraft.models.base import Tokenizer
from quickdraft.stats import Stats


@dataclass(frozen=True, slots=True)
class Generation:
    """One prompt's output. from_draft[i] says whether token i was a draft token the target
    accepted (True) or the target's own corrected, bonus or plain token (False)."""

    token_ids: list[int]
    text: str | None
    finish_reason: str  # "stop" (stop token or string) or "length" (max_new_tokens)
    from_draft: list[bool]
    stats: Stats


@dataclass(frozen=True, slots=True)
class BatchGeneration:
    """A batch's outputs, row by row, with the statistics of the whole batch."""

    token_ids: list[list[int]]
    texts: list[str] | None
    finish_reasons: list[str]
    from_draft: list[list[bool]]
    stats: Stats


class StepOutput:
    """The output so far: appends accepted chunks to the state and decides when each row is
    finished. ``row_ids(b)`` and ``row_from_draft(b)`` read a row's tokens at any step."""

    def __init__(self, state: DecodeState, sampling: SamplingParams, tokenizer: Tokenizer | None):
        self.state, self.sampling, self.tokenizer = state, sampling, tokenizer
        batch = state.batch_size
        self.active = torch.ones(batch, dtype=torch.bool)
        self.generated = torch.zeros(batch, dtype=torch.long)
        self.from_draft = torch.zeros_like(state.tokens, dtype=torch.bool)
        self.reasons = ["length"] * batch
        self.texts: list[str] | None = None
        stop_ids = set(sampling.stop_token_ids)
        if tokenizer is not None and not sampling.ignore_eos:
            stop_ids.update(tokenizer.eos_token_ids)
        self._stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.long)

    def append(self, chunk: torch.Tensor, count: torch.Tensor, drafted: torch.Tensor) -> None:
        """chunk: [B, C] new tokens, of which the first count[b] are real; the first drafted[b]
        of them came from the draft. Rows that are no longer active are left alone."""
        width = chunk.shape[1]
        was_active = self.active.clone()
        offsets = torch.arange(width)
        real = offsets < count.unsqueeze(1)
        is_stop = torch.isin(chunk, self._stop_ids) & real
        first_stop = torch.where(is_stop.any(1), is_stop.long().argmax(1), width)
        room = self.sampling.max_new_tokens - self.generated
        keep = torch.minimum(torch.minimum(count, first_stop + 1), room)
        keep = torch.where(self.active, keep, 0)
        stopped = self.active & (first_stop < keep)  # the stop token itself was kept

        state = self.state
        slots = (state.lengths.unsqueeze(1) + offsets).clamp_max(state.capacity - 1)
        write = offsets < keep.unsqueeze(1)
        state.tokens.scatter_(1, slots, torch.where(write, chunk, state.tokens.gather(1, slots)))
        marks = write & (offsets < drafted.unsqueeze(1))
        self.from_draft.scatter_(1, slots, marks | self.from_draft.gather(1, slots))
        state.lengths += keep
        self.generated += keep

        for row in torch.nonzero(stopped).flatten().tolist():
            self.reasons[row] = "stop"
        self.active &= ~stopped & (self.generated < self.sampling.max_new_tokens)
        if self.sampling.stop:
            # Rows that grew this step, including one that just reached max_new_tokens or a
            # stop token: a stop string completed earlier in the chunk still cuts it there.
            self._check_stop_strings(was_active)

    def _check_stop_strings(self, rows: torch.Tensor) -> None:
        """Cut ``rows`` ([B] bool) whose text contains a stop string: tokens up to the one
        completing it."""
        assert self.tokenizer is not None
        for row in torch.nonzero(rows).flatten().tolist():
            ids = self.row_ids(row)
            text = self.tokenizer.decode(ids)
            if not any(stop in text for stop in self.sampling.stop):
                continue
            keep = next(
                n
                for n in range(1, len(ids) + 1)
                if any(s in self.tokenizer.decode(ids[:n]) for s in self.sampling.stop)
            )
            self.state.lengths[row] -= len(ids) - keep
            self.generated[row] = keep
            self.active[row] = False
            self.reasons[row] = "stop"

    def row_ids(self, row: int) -> list[int]:
        start = self.state.prompt_length
        return self.state.tokens[row, start : start + int(self.generated[row])].tolist()

    def row_from_draft(self, row: int) -> list[bool]:
        start = self.state.prompt_length
        return self.from_draft[row, start : start + int(self.generated[row])].tolist()

    def _text(self, ids: list[int]) -> str:
        assert self.tokenizer is not None
        text = self.tokenizer.decode(ids)
        cut = min((text.find(s) for s in self.sampling.stop if s in text), default=len(text))
        return text[:cut]

    def result(self, stats: Stats) -> BatchGeneration:
        rows = range(self.state.batch_size)
        token_ids = [self.row_ids(row) for row in rows]
        from_draft = [self.row_from_draft(row) for row in rows]
        texts = None if self.tokenizer is None else [self._text(ids) for ids in token_ids]
        stats.new_tokens = int(self.generated.sum())
        return BatchGeneration(token_ids, texts, list(self.reasons), from_draft, stats)
