"""Prompt lookup (n-gram) drafting: copy what followed the last n tokens earlier in the text.

No model at all: the drafter matches the last n tokens (n from ``max_n`` down to ``min_n``)
against the prompt and the output so far, takes the most recent earlier occurrence, and proposes
the tokens that followed it. Deterministic, so its drafts carry no probabilities and the
acceptance rules treat them as point masses (exact at any temperature). Strong on code edits,
summaries and anything that quotes its input.

Each slot keeps an index of its text's n-grams, extended as the text grows, so a lookup is a
dictionary read per n (a scan of a 400-token text was 60-90 us, 1-2% of a small model's step).
A draft carries scores (``Draft.scores``): the chance each token lands, by the match it came
from. Draft sizing (``engine.goodput``) keeps what those say pays, draft by draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.config import MAX_LOOKUP_NGRAM, MethodOptions, SpecConfig, check_range
from quickdraft.drafters.base import Batch, BuildContext, Draft, Needs, StepResult

# A draft's chance to land, by its match: the first token's by n (n >= 3 as 3) where every
# earlier occurrence of the n-gram went on the same way, SPLIT times that where they went
# different ways; each later token's, given the one before, by n. Measured on SmolLM2-135M's
# greedy text for held-out code and chat prompts (benchmarks/lookup_odds.py,
# benchmarks/results/lookup_odds.md); draft sizing scales them by what a request's drafts land.
FIRST = (0.34, 0.6, 0.89)
SPLIT = 0.5
LATER = (0.7, 0.77, 0.89)


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


@dataclass(frozen=True, slots=True)
class Match:
    """A lookup's find: the tokens that followed the n-gram's most recent earlier occurrence,
    its n, and whether every earlier occurrence went on the same way."""

    tokens: list[int]
    n: int = 0
    agreed: bool = True

    def first(self) -> float:
        """The chance the first token lands (0 without one)."""
        if not self.tokens:
            return 0.0
        return FIRST[min(self.n, len(FIRST)) - 1] * (1.0 if self.agreed else SPLIT)

    def scores(self) -> list[float]:
        """The chance each token lands (its path: every token before it too)."""
        chance, later = self.first(), LATER[min(self.n, len(LATER)) - 1]
        found = []
        for _ in self.tokens:
            found.append(chance)
            chance *= later
        return found


class TextIndex:
    """One text's n-grams of sizes low..high: for each, where the text went on after its most
    recent occurrence and whether every occurrence went on the same way. ``extend`` adds the
    text's new tokens; ``lookup`` matches its end."""

    __slots__ = ("grams", "high", "low", "text")

    def __init__(self, low: int, high: int):
        self.low, self.high = low, high
        self.text: list[int] = []
        self.grams: dict[tuple[int, ...], tuple[int, bool]] = {}

    def extend(self, tokens: list[int]) -> None:
        text, grams, low, high = self.text, self.grams, self.low, self.high
        start = len(text)
        text.extend(tokens)
        # Position j goes on an n-gram ending just before it, for every j up to the last
        # token (the pending one: what followed an n-gram may be it).
        for j in range(start, len(text)):
            after = text[j]
            for n in range(low, min(high, j) + 1):
                key = tuple(text[j - n : j])
                known = grams.get(key)
                grams[key] = (j, known is None or (known[1] and text[known[0]] == after))

    def lookup(self, most: int) -> Match:
        """What followed the longest n-gram ending the text at an earlier occurrence."""
        text = self.text
        length = len(text)
        for n in range(min(self.high, length - 1), self.low - 1, -1):
            found = self.grams.get(tuple(text[length - n :]))
            if found is not None:
                start, agreed = found
                return Match(text[start : start + most], n, agreed)
        return Match([])


class NGramDrafter:
    head_rows = 0  # no head: the text is the model

    def __init__(self, vocab_size: int, num_tokens: int, min_n: int = 1, max_n: int = 3):
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        check_lookup_ngram(min_n, max_n)
        self.vocab_size = vocab_size
        self.num_tokens = num_tokens
        self.needs = Needs(tokens=num_tokens, depth=num_tokens, shortens=True, scored=True)
        self.min_n, self.max_n = min_n, max_n
        self.indexes: list[TextIndex] = []  # per slot
        self.reserved = False  # whether an engine drives it: ``begin`` marks new requests

    def reserve(self, rows: int, capacity: int) -> None:
        self.indexes = [TextIndex(self.min_n, self.max_n) for _ in range(rows)]
        self.reserved = True

    def begin(self, start: StepResult) -> None:
        """A joining request's slot starts a fresh index (its text is read at the next
        propose)."""
        for slot in start.batch.slots.host:
            self.indexes[slot] = TextIndex(self.min_n, self.max_n)

    def observe(self, result: StepResult) -> None:
        """Nothing: the next propose reads the text the step added."""

    def release(self, slot: int, completed: bool) -> None:
        """Nothing: the slot's next ``begin`` starts its index afresh."""

    def propose(self, batch: Batch) -> Draft:
        """The text itself is the model: the lookup runs on the host, over each row's text."""
        lengths = batch.lengths.tolist()  # a host sync, and the text's used part below
        most = batch.limit or self.num_tokens
        found = []
        for b, slot in enumerate(batch.slots.host):
            index = self._index(batch, b, slot)
            index.extend(batch.tokens[b, len(index.text) : lengths[b]].tolist())
            match = index.lookup(most)
            found.append(match if match.first() >= batch.floor else Match([]))
        width = max(len(match.tokens) for match in found)
        device = batch.tokens.device
        if width == 0:
            return Draft.empty(batch.size, device)
        rows, scores = [], []
        for b, match in enumerate(found):
            row, pad = match.tokens, width - len(match.tokens)
            # Rows with a shorter match are padded by repeating their last known token: any
            # deterministic filler keeps the output exact; the target simply rejects it.
            last = row[-1] if row else self.indexes[batch.slots.host[b]].text[-1]
            rows.append(row + [last] * pad)
            scores.append(match.scores() + [0.0] * pad)
        tokens = torch.tensor(rows, dtype=torch.long, device=device)
        return Draft(tokens, scores=torch.tensor(scores, device=device))

    def _index(self, batch: Batch, row: int, slot: int) -> TextIndex:
        """The slot's index. Driven by hand (no ``reserve``, so no ``begin`` either), a slot's
        text may be another one at any call: the index starts afresh unless it indexed the
        start of this row's text."""
        while len(self.indexes) <= slot:
            self.indexes.append(TextIndex(self.min_n, self.max_n))
        index = self.indexes[slot]
        if not self.reserved:
            indexed = len(index.text)
            if batch.tokens[row, :indexed].tolist() != index.text:
                index = self.indexes[slot] = TextIndex(self.min_n, self.max_n)
        return index

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
