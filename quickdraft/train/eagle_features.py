"""The target's features for EAGLE training (``quickdraft train eagle``, step 1 and 2).

Per sequence: its tokens from ``context`` tokens before the reply, the target's final normed
states there and, for EAGLE-3, the inputs of its three feature layers, all fp16; and the draft
vocabulary they imply.

The features live in a store: a folder per target, quantization, feature layers and context,
holding shards of sequences keyed by their content (tokens and reply start). A run extracts
only the sequences the store lacks, so an interrupted extraction resumes, and a corpus that
grows between sessions (training data made over several) reuses everything extracted
before. Shards are read memory-mapped: a million-token store of a 1.5B target (about 12 GB)
is paged in as training reads it, not held in memory.

Two writers fill a store, at once if need be (each shard claims its number without
replacing another's: ``write_shard``): ``extract`` (a prefill per sequence, at the target's
prefill rate) and ``FeatureRecorder``, which ``data regenerate --eagle-features`` runs as the
engine's drafter while the replies are generated, so the target's features come with its
replies at no extra forward pass. The feature at a token depends only on the tokens before
it, so both give the same features up to the float rounding of a decode step against a
prefill (the q4 kernel is batch-invariant; attention's sums are not).
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from quickdraft.artifacts import (
    ArtifactError,
    partial_suffix,
    read_checkpoint,
    remove_stale_partials,
)
from quickdraft.drafters.base import Draft, Needs, Stateless, StepResult
from quickdraft.models.llama import LlamaRunner
from quickdraft.train.corpus import Sequence

Progress = Callable[[str, int, int], None]
SHARD = 64  # sequences per feature shard
FIELDS = ("tokens", "hidden", "taps", "start")
REMEDY = "delete the shard to extract it again"


@dataclass(frozen=True, slots=True)
class EagleFeatures:
    """Per kept sequence (lists of equal length): tokens [T] long, hidden [T, d] fp16 (the
    target's final normed states), taps [T, 3, d] fp16 or None (EAGLE-1), start (the first
    reply token's index within the kept tokens)."""

    tokens: list[torch.Tensor]
    hidden: list[torch.Tensor]
    taps: list[torch.Tensor | None]
    start: list[int]

    def __len__(self) -> int:
        return len(self.tokens)


def feature_bytes(sequences: list[Sequence], context: int, hidden: int, taps: int) -> int:
    """What ``extract`` stores on disk (fp16)."""
    kept = sum(len(s.tokens) - max(0, s.start - context) for s in sequences)
    return kept * hidden * 2 * (1 + taps)


def sequence_key(sequence: Sequence) -> str:
    """A sequence's key in the store: its tokens and where its reply starts."""
    digest = hashlib.sha256(torch.tensor(sequence.tokens, dtype=torch.int64).numpy().tobytes())
    digest.update(str(sequence.start).encode())
    return digest.hexdigest()[:24]


def store_folder(
    cache: Path, target: str, context: int, layers: tuple[int, ...], quant: str | None
) -> Path:
    """The store of a target (by name), its quantization, feature layers and context, under
    ``cache``: every corpus and sample of those shares it."""
    from quickdraft.train.common import fingerprint

    settings = {"target": target, "context": context, "layers": list(layers), "quant": quant}
    return cache / f"eagle-features-{fingerprint({**settings, 'store': 2})}"


def _index(folder: Path) -> tuple[dict[str, tuple[int, int]], list[dict]]:
    """Every stored sequence's (shard, position) and the shards, memory-mapped."""
    shards, index = [], {}
    for number, path in enumerate(sorted(folder.glob("shard-*.pt"))):
        shard = read_checkpoint(path, REMEDY, mmap=True)
        if not isinstance(shard, dict) or not {*FIELDS, "keys"} <= shard.keys():
            raise ArtifactError(path, "not a feature shard", REMEDY)
        shards.append(shard)
        for position, key in enumerate(shard["keys"]):
            index[key] = (number, position)
    return index, shards


@torch.inference_mode()
def extract(
    target: LlamaRunner,
    sequences: list[Sequence],
    layers: tuple[int, ...],
    context: int,
    folder: Path,
    progress: Progress | None = None,
) -> EagleFeatures:
    """The target's features over ``sequences``, from the store ``folder`` (made for this
    target, ``layers`` and ``context``), extracting those it lacks first. ``layers``: the
    feature layers (their inputs are the outputs of the layers below)."""
    folder.mkdir(parents=True, exist_ok=True)
    tapped = target.with_taps(tuple(layer - 1 for layer in layers)) if layers else target
    keys = [sequence_key(s) for s in sequences]
    index, _ = _index(folder)
    missing = list({k: s for k, s in zip(keys, sequences, strict=True) if k not in index}.items())
    done = len(sequences) - len(missing)
    for first in range(0, len(missing), SHARD):
        shard: dict[str, list] = {key: [] for key in (*FIELDS, "keys")}
        for key, sequence in missing[first : first + SHARD]:
            tokens = torch.tensor([sequence.tokens])
            length = tokens.shape[1]
            # The body only: the LM head's logits are not needed here.
            hidden, tapped_states = tapped.body(
                tokens, torch.arange(length).unsqueeze(0), tapped.new_cache(1, length)
            )
            taps = [tapped_states[layer - 1][0] for layer in layers]
            entry = _entry(tokens[0], hidden[0], torch.stack(taps, 1) if taps else None,
                           sequence.start, context)  # fmt: skip
            for field, value in zip(("keys", *FIELDS), (key, *entry), strict=True):
                shard[field].append(value)
        write_shard(folder, shard)
        if progress is not None:
            progress("features", done + min(first + SHARD, len(missing)), len(sequences))
    index, shards = _index(folder)
    merged: dict[str, list] = {key: [] for key in FIELDS}
    for key in keys:
        number, position = index[key]
        for field in FIELDS:
            merged[field].append(shards[number][field][position])
    if progress is not None:
        progress("features", len(sequences), len(sequences))
    return EagleFeatures(**merged)


def _entry(
    tokens: torch.Tensor, hidden: torch.Tensor, taps: torch.Tensor | None, start: int,
    context: int,
) -> tuple:  # fmt: skip
    """A sequence's stored fields from ``context`` tokens before its reply on, fp16."""
    keep = max(0, start - context)
    return (
        tokens[keep:].clone(),
        hidden[keep:].half().clone(),
        None if taps is None else taps[keep:].half().clone(),
        start - keep,
    )


def write_shard(folder: Path, shard: dict[str, list]) -> None:
    """``shard`` (lists of the keys and FIELDS) as the store's next shard, whole or not at
    all: written aside under this process's own name, then linked to the next free number,
    which fails rather than replaces when another writer of the store (a second extraction,
    ``data regenerate --eagle-features``) took that number meanwhile: then the next."""
    remove_stale_partials(folder, "shard.partial-*")
    partial = folder / f"shard.partial-{partial_suffix()}"
    try:
        torch.save(shard, partial)
        while True:
            numbers = [int(p.stem.split("-")[1]) for p in folder.glob("shard-*.pt")]
            try:
                os.link(partial, folder / f"shard-{max(numbers, default=-1) + 1:05d}.pt")
                return
            except FileExistsError:
                continue
    finally:
        partial.unlink(missing_ok=True)


class FeatureRecorder(Stateless):
    """A drafter that proposes nothing and keeps the target's features at every token the
    target is fed, per request: run as the engine's drafter while replies are generated, it
    fills the store that ``extract`` would, without another forward pass.

    A request's features cover its prompt and reply but the reply's last token (never fed).
    ``save`` stores them under the key of the training sequence the chat record will make
    (``corpus.tokenize``), with the ids the target was fed: they differ from that sequence
    only in the chat template's closing tokens after the reply (which the drafter is never
    asked to draft) or where the reply's text tokenizes otherwise than it was generated."""

    head_rows = 0

    def __init__(
        self, vocab_size: int, layers: tuple[int, ...], folder: Path, context: int,
        max_tokens: int,
    ) -> None:  # fmt: skip
        self.vocab_size, self.layers = vocab_size, layers
        self.needs = Needs(0, 0, hidden=True, taps=tuple(layer - 1 for layer in layers))
        self.folder, self.context, self.max_tokens = folder, context, max_tokens
        folder.mkdir(parents=True, exist_ok=True)
        self._pieces: dict[int, list[tuple[torch.Tensor, torch.Tensor | None]]] = {}
        self._finished: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor | None]] = {}
        self._fed: dict[int, torch.Tensor] = {}
        self._shard: dict[str, list] = {key: [] for key in ("keys", *FIELDS)}
        self.saved = 0

    def describe(self) -> str:
        return "records the target's features, drafts nothing"

    def propose(self, batch) -> Draft:
        return Draft.empty(batch.size, batch.tokens.device)

    def begin(self, start: StepResult) -> None:
        for slot in start.batch.slots.host:
            self._pieces[slot] = []
        self._keep(start)

    def observe(self, result: StepResult) -> None:
        self._keep(result)

    def _keep(self, result: StepResult) -> None:
        assert result.hidden is not None  # declared in needs
        for row, slot in enumerate(result.batch.slots.host):
            count = int(result.kept[row])
            taps = [result.taps[layer - 1][row, :count] for layer in self.layers]
            self._pieces[slot].append(
                (result.hidden[row, :count].half(), torch.stack(taps, 1).half() if taps else None)
            )
            self._fed[slot] = result.batch.tokens[row, : int(result.batch.lengths[row])]

    def release(self, slot: int, completed: bool) -> None:
        pieces, fed = self._pieces.pop(slot, []), self._fed.pop(slot, None)
        if completed and pieces and fed is not None:
            hidden = torch.cat([h for h, _ in pieces])
            taps = torch.cat([t for _, t in pieces]) if pieces[0][1] is not None else None
            self._finished[tuple(fed.tolist())] = (hidden, taps)

    def save(self, sequence: Sequence, ids: list[int]) -> bool:
        """Store the features of the finished request fed ``ids`` (its prompt and reply)
        under ``sequence``'s key; False when no such request finished here."""
        found = self._finished.pop(tuple(ids), None)
        if found is None:
            return False
        hidden, taps = found  # one row per fed token: all of ``ids`` but the last
        length = min(hidden.shape[0], self.max_tokens)
        tokens = torch.tensor(ids[:length])
        entry = _entry(tokens, hidden[:length], None if taps is None else taps[:length],
                       min(sequence.start, length), self.context)  # fmt: skip
        for field, value in zip(("keys", *FIELDS), (sequence_key(sequence), *entry), strict=True):
            self._shard[field].append(value)
        self.saved += 1
        if len(self._shard["keys"]) >= SHARD:
            self.flush()
        return True

    def flush(self) -> None:
        """Write the sequences saved since the last shard (call it when the run ends)."""
        if self._shard["keys"]:
            write_shard(self.folder, self._shard)
            self._shard = {key: [] for key in ("keys", *FIELDS)}


def draft_vocabulary(features: EagleFeatures, size: int, vocab_size: int) -> torch.Tensor:
    """[size] ids: the most frequent tokens of the features' sequences (their replies first,
    then their prompts), the rest in id order (byte-level BPE ids run roughly from frequent
    merges to rare ones)."""
    replies: Counter[int] = Counter()
    prompts: Counter[int] = Counter()
    for tokens, start in zip(features.tokens, features.start, strict=True):
        replies.update(tokens[start:].tolist())
        prompts.update(tokens[:start].tolist())
    ranked = [t for t, _ in replies.most_common()]
    seen = set(ranked)
    ranked += [t for t, _ in prompts.most_common() if t not in seen]
    seen.update(ranked)
    ranked += [t for t in range(vocab_size) if t not in seen]
    return torch.tensor(ranked[:size], dtype=torch.long)
