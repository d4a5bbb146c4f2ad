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
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from quickdraft.artifacts import ArtifactError, read_checkpoint
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
    numbers = [int(p.stem.split("-")[1]) for p in folder.glob("shard-*.pt")]
    following = max(numbers, default=-1) + 1
    for first in range(0, len(missing), SHARD):
        shard: dict[str, list] = {key: [] for key in (*FIELDS, "keys")}
        for key, sequence in missing[first : first + SHARD]:
            tokens = torch.tensor([sequence.tokens])
            length = tokens.shape[1]
            # The body only: the LM head's logits are not needed here.
            hidden, tapped_states = tapped.body(
                tokens, torch.arange(length).unsqueeze(0), tapped.new_cache(1, length)
            )
            keep = max(0, sequence.start - context)
            shard["keys"].append(key)
            shard["tokens"].append(tokens[0, keep:].clone())
            shard["hidden"].append(hidden[0, keep:].half().clone())
            taps = [tapped_states[layer - 1][0, keep:] for layer in layers]
            shard["taps"].append(torch.stack(taps, 1).half().clone() if taps else None)
            shard["start"].append(sequence.start - keep)
        path = folder / f"shard-{following:05d}.pt"
        following += 1
        torch.save(shard, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)
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
