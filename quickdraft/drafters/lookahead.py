"""Lookahead decoding (Fu et al. 2024): Jacobi iteration and an n-gram pool, no drafter model.

Each verify pass of the target carries two branches:

* the *verification branch*: up to G candidate continuations of the pending token, (N-1)-grams
  from the pool that start with it, merged into a trie (a draft tree, accepted exactly by the
  tree rules: the candidates are deterministic, point masses);
* the *lookahead branch* (``SideBranch``): a window of W future positions over the last N-1
  Jacobi iterations ("levels"). The token at level j, column i sits j + 1 + i positions after
  the pending token and attends to level 0's columns 0..i and to column i of levels 1..j, so
  column i reads as one guessed continuation; the target's argmax at the last level's tokens
  is the next Jacobi iteration. Once N-1 levels exist, each column plus its new token is an
  n-gram for the pool, and the oldest level is dropped.

The pool is also fed by the text itself (the prompt's and the output's n-grams), and it lives
on the drafter, so later requests of one session reuse it. Nothing of the lookahead branch is
ever accepted or kept in the cache, so the output is exactly the target's at any temperature.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass

import torch

from quickdraft.config import (
    MAX_DRAFT_TOKENS,
    MAX_LOOKAHEAD_NGRAM,
    MAX_TREE_WIDTH,
    MethodOptions,
    SpecConfig,
    show_value,
)
from quickdraft.drafters.base import Batch, BuildContext, Draft, Needs, SideBranch, StepResult
from quickdraft.models.base import Model


@dataclass(frozen=True, slots=True)
class LookaheadConfig:
    """window W (future positions per level), ngram N (n-gram size: N-1 levels, candidates
    of N-1 tokens), candidates G (pool entries verified per step), pool_size (n-grams kept per
    first token, most recent first)."""

    window: int = 4
    ngram: int = 4
    candidates: int = 3
    pool_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        bounds = {
            "window": (1, MAX_TREE_WIDTH),
            "ngram": (2, MAX_LOOKAHEAD_NGRAM),
            "candidates": (1, MAX_TREE_WIDTH),
            "pool_size": (1, 4096),
        }
        for name, (low, high) in bounds.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(
                    f"lookahead_{name} must be an integer in {low}..{high}, got {show_value(value)}"
                )
        tokens = (self.ngram - 1) * (self.window + self.candidates)
        if tokens > MAX_DRAFT_TOKENS:
            raise ValueError(
                f"lookahead: (ngram - 1) * (window + candidates) = {tokens} tokens a verify "
                f"pass, more than {MAX_DRAFT_TOKENS}; lower lookahead_window or lookahead_ngram"
            )


def side_mask(levels: int, window: int) -> torch.Tensor:
    """[E, E] with E = levels * window, index j * window + i: (j, i) sees level 0's columns
    0..i and column i of levels 1..j."""
    size = levels * window
    mask = torch.zeros(size, size, dtype=torch.bool)
    for j in range(levels):
        for i in range(window):
            row = j * window + i
            mask[row, : i + 1] = True  # level 0, columns 0..i
            for level in range(1, j + 1):
                mask[row, level * window + i] = True
    return mask


class LookaheadDrafter:
    """Lookahead decoding as a drafter: ``propose`` returns the pool's candidates as a draft
    tree with the Jacobi window as its side branch; ``observe`` reads the target's logits at
    the window (``StepResult.side_logits``) and updates window and pool.

    Every row keeps all N-1 levels from its start (random prompt tokens at first, where the
    paper grows them one per step), so that rows joining at any step share one side-branch
    shape; a row's columns join the pool once N-2 Jacobi steps have replaced all but the
    first level, which is when the paper's first n-grams are collected too."""

    def __init__(self, vocab_size: int, config: LookaheadConfig | None = None):
        self.config = config or LookaheadConfig()
        self.vocab_size = vocab_size
        levels, window = self.config.ngram - 1, self.config.window
        self.num_tokens = self.config.candidates * levels
        self.needs = Needs(
            tokens=self.num_tokens, depth=levels, side_tokens=levels * window, pooled=True
        )
        # first token -> its continuations ((N-1)-tuples), most recent first; one pool for
        # every row and every request of the session.
        self.pool: dict[int, OrderedDict[tuple[int, ...], None]] = {}
        self._rng = random.Random(self.config.seed)
        self.levels = torch.zeros(0, levels, window, dtype=torch.long)  # [rows, N-1, W]
        self.age = torch.zeros(0, dtype=torch.long)  # Jacobi steps per row
        self._mask = side_mask(levels, window)
        self._offsets = torch.tensor([j + 1 + i for j in range(levels) for i in range(window)])

    # -- pool -------------------------------------------------------------------------

    def _remember(self, gram: tuple[int, ...]) -> None:
        entries = self.pool.setdefault(gram[0], OrderedDict())
        entries.pop(gram[1:], None)
        entries[gram[1:]] = None
        entries.move_to_end(gram[1:], last=False)
        while len(entries) > self.config.pool_size:
            entries.popitem(last=True)

    def _remember_text(self, tokens: list[int]) -> None:
        n = self.config.ngram
        for start in range(len(tokens) - n + 1):
            self._remember(tuple(tokens[start : start + n]))

    # -- the protocol -------------------------------------------------------------------

    def reserve(self, rows: int, capacity: int) -> None:
        self.levels = torch.zeros(rows, *self.levels.shape[1:], dtype=torch.long)
        self.age = torch.zeros(rows, dtype=torch.long)

    def begin(self, start: StepResult) -> None:
        """A fresh window of random prompt tokens (the paper's initialisation) in each new
        request's slot; the prompt's own n-grams join the pool."""
        batch = start.batch
        texts, lengths = batch.tokens.cpu(), batch.lengths.tolist()
        for b, slot in enumerate(batch.slots.host):
            prompt = texts[b, : lengths[b]].tolist()
            self._remember_text(prompt)
            guesses = [self._rng.choice(prompt) for _ in range(self.levels[0].numel())]
            self.levels[slot] = torch.tensor(guesses).view_as(self.levels[0])
            self.age[slot] = 0

    head_rows = 0  # no head: the n-gram pool and the Jacobi window

    def describe(self) -> str:
        config = self.config
        return f"W={config.window} N={config.ngram} G={config.candidates}"

    def propose(self, batch: Batch) -> Draft:
        levels = batch.slots.take(self.levels)  # [B, N-1, W]
        tokens, parents = self._candidates(batch, levels)
        side = SideBranch(levels.flatten(1), self._offsets, self._mask)
        return Draft.from_parents(tokens, parents, None, side)

    def release(self, slot: int, completed: bool) -> None:
        """Nothing to do: the slot's next ``begin`` overwrites its state."""

    def observe(self, result: StepResult) -> None:
        """Step the Jacobi window with the target's argmax at its last level; collect the
        columns' n-grams of rows whose window is all Jacobi output; add the accepted text's
        n-grams. A step that verified no draft (the batch policy) moves the window not."""
        batch, n = result.batch, self.config.ngram
        if result.side_logits is not None:
            window, levels = self.config.window, self.levels.shape[1]
            last = result.side_logits[:, (levels - 1) * window :, : self.vocab_size]
            new = last.argmax(-1).cpu()  # [B, W]
            slots = batch.slots
            rows, age = slots.take(self.levels), slots.take(self.age)
            grams = torch.cat([rows, new.unsqueeze(1)], 1).transpose(1, 2)  # [B, W, N]
            for gram in grams[age >= levels - 1].flatten(0, 1).tolist():
                self._remember(tuple(gram))
            slots.put(self.levels, torch.cat([rows[:, 1:], new.unsqueeze(1)], 1))
            slots.put(self.age, age + 1)
        texts = batch.tokens.cpu()
        ends, added = batch.lengths.tolist(), result.kept.tolist()
        for b in range(batch.size):  # the text's newest n-grams: exact continuations
            self._remember_text(texts[b, max(0, ends[b] - added[b] - n + 1) : ends[b]].tolist())

    # -- candidates ---------------------------------------------------------------------

    def _candidates(self, batch: Batch, levels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The pool's continuations of each row's pending token (``levels``: the rows' Jacobi
        windows, [B, N-1, W]): a trie for one row; for a batch, one chain per candidate (rows
        share a shape), padded by repeating."""
        config = self.config
        found = []
        pending = batch.tokens.gather(1, (batch.lengths - 1).unsqueeze(1)).flatten().tolist()
        for b in range(batch.size):
            entries = list(self.pool.get(pending[b], ()))[: config.candidates]
            if not entries:  # the window's own guess: column 0 read down its levels
                entries = [tuple(levels[b, :, 0].tolist())]
            found.append(entries)
        if batch.size == 1:
            return _trie(found[0])
        width = max(len(entries) for entries in found)
        length = config.ngram - 1
        rows = []
        for entries in found:
            padded = [(list(e) + [e[-1]] * length)[:length] for e in entries]
            padded += [padded[-1]] * (width - len(padded))
            rows.append([token for chain in padded for token in chain])
        parents = [
            -1 if d == 0 else c * length + d - 1 for c in range(width) for d in range(length)
        ]
        return torch.tensor(rows, dtype=torch.long), torch.tensor(parents, dtype=torch.long)


def _trie(chains: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge chains that share a prefix: (tokens [1, N], parents [N]), parents first,
    siblings in the order their chains came."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}
    for chain in chains:
        node = -1
        for token in chain:
            key = (node, token)
            if key not in children:
                children[key] = len(tokens)
                tokens.append(token)
                parents.append(node)
            node = children[key]
    # Nodes were numbered in insertion order, parents before children already.
    return torch.tensor([tokens], dtype=torch.long), torch.tensor(parents, dtype=torch.long)


# Defaults by device. CPU: the smallest branches, since every token of a forward costs there
# (measured on SmolLM2-135M: benchmarks/results/defaults.md). GPU: the paper's setting for 7B
# models on an A100, where a pass of tens of tokens costs about one; not measured here.
DEFAULTS = {
    "cpu": LookaheadConfig(window=2, ngram=3, candidates=2),
    "cuda": LookaheadConfig(window=15, ngram=5, candidates=15),
}


@dataclass(frozen=True, slots=True)
class LookaheadOptions(MethodOptions):
    """lookahead_window, lookahead_ngram, lookahead_candidates: the Jacobi window W, the
    n-gram size N and the cap G on verified candidates; None picks the defaults measured for
    the target's device (``DEFAULTS``). Bounds: W <= 64, N in 2..16, G <= 64, and
    (N - 1) * (W + G) <= 256 tokens a verify pass (checked with the defaults of
    ``LookaheadConfig`` for what is not given)."""

    lookahead_window: int | None = None
    lookahead_ngram: int | None = None
    lookahead_candidates: int | None = None

    def __post_init__(self) -> None:
        given = {"window": self.lookahead_window, "ngram": self.lookahead_ngram}
        given["candidates"] = self.lookahead_candidates
        LookaheadConfig(**{name: value for name, value in given.items() if value is not None})

    def config(self, device: str) -> LookaheadConfig:
        """The settings on ``device``: those given, the device's defaults for the rest."""
        base = DEFAULTS.get(device, DEFAULTS["cpu"])
        return LookaheadConfig(
            window=self.lookahead_window or base.window,
            ngram=self.lookahead_ngram or base.ngram,
            candidates=self.lookahead_candidates or base.candidates,
        )


def build_lookahead(options: LookaheadOptions, target: Model) -> LookaheadDrafter:
    """The drafter for ``options`` on the target's device."""
    return LookaheadDrafter(target.vocab_size, options.config(target.device.type))


def build(spec: SpecConfig, context: BuildContext) -> LookaheadDrafter:
    """The registry's builder: ``spec.options`` are ``LookaheadOptions``."""
    options = spec.options
    assert isinstance(options, LookaheadOptions)
    return build_lookahead(options, context.target)
