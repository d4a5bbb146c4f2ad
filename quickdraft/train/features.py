"""Drafter features over a corpus, cached on disk in shards so an interrupted run resumes.

For every scored position t of every sequence a shard holds: the token x_t, the drafter's final
(normed) hidden state at t-1 in fp16, the drafter's own argmax after x_t, and the target's
argmax after x_t (the token the target would emit next). These are exactly the inputs and the
label of a DynaSpec router, and enough to measure how often a shortlist keeps the drafter's
choice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from quickdraft.artifacts import read_json, read_safetensors
from quickdraft.models.base import Model
from quickdraft.vocab.corpus import Sequence

SHARD_SEQUENCES = 16


@dataclass(frozen=True, slots=True)
class Features:
    tokens: torch.Tensor  # [N] int64: x_t
    prev_hidden: torch.Tensor  # [N, d] fp16: drafter hidden at t-1
    draft_next: torch.Tensor  # [N] int64
    target_next: torch.Tensor  # [N] int64
    sequence: torch.Tensor  # [N] int64: index of the sequence each row came from

    def __len__(self) -> int:
        return int(self.tokens.numel())

    def subset(self, mask: torch.Tensor) -> Features:
        return Features(*(getattr(self, f)[mask] for f in self.__slots__))


def fingerprint(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def extract(
    sequences: list[Sequence],
    drafter: Model,
    target: Model | None,
    folder: Path,
    settings: dict,
    progress: Callable[[int, int], None] | None = None,
) -> Features:
    """Features of ``sequences`` under ``folder``; shards already there (same settings) are
    reused. ``target`` None labels with the corpus's own next token instead."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / "manifest.json"
    key = fingerprint(settings)
    remedy = "remove the folder or choose another --cache folder"
    if manifest.exists() and read_json(manifest, remedy).get("fingerprint") != key:
        raise ValueError(
            f"features: {folder} holds features made with other settings; "
            "remove it or choose another --cache folder"
        )
    manifest.write_text(json.dumps({"fingerprint": key, "settings": settings}, indent=2))
    shards = []
    total = len(sequences)
    for first in range(0, total, SHARD_SEQUENCES):
        path = folder / f"shard-{first // SHARD_SEQUENCES:05d}.safetensors"
        if not path.exists():
            chunk = sequences[first : first + SHARD_SEQUENCES]
            rows = [_sequence_features(s, drafter, target, first + i) for i, s in enumerate(chunk)]
            tensors = {f: torch.cat([r[f] for r in rows]) for f in rows[0]}
            save_file(tensors, str(path.with_suffix(".tmp")))
            path.with_suffix(".tmp").rename(path)
        shards.append(read_safetensors(path, "delete the shard to extract it again"))
        if progress is not None:
            progress(min(first + SHARD_SEQUENCES, total), total)
    merged = {f: torch.cat([s[f] for s in shards]) for f in shards[0]}
    return Features(
        merged["tokens"].long(),
        merged["prev_hidden"],
        merged["draft_next"].long(),
        merged["target_next"].long(),
        merged["sequence"].long(),
    )


@torch.inference_mode()
def _sequence_features(
    sequence: Sequence, drafter: Model, target: Model | None, index: int
) -> dict[str, torch.Tensor]:
    tokens = torch.tensor(sequence.tokens).unsqueeze(0)
    positions = torch.arange(tokens.shape[1]).unsqueeze(0)
    out = drafter.forward(tokens, positions, drafter.new_cache(1, tokens.shape[1]))
    hidden = out.hidden[0]
    scored = torch.arange(sequence.start, tokens.shape[1])
    draft_next = out.logits[0, scored].argmax(-1)
    del out
    if target is not None:
        logits = target.forward(tokens, positions, target.new_cache(1, tokens.shape[1])).logits
        target_next = logits[0, scored].argmax(-1)
    else:  # the corpus's next token; the last position has none and is dropped below
        target_next = torch.cat([tokens[0, 1:], torch.tensor([-1])])[scored]
    keep = target_next >= 0
    return {
        "tokens": tokens[0, scored][keep].int(),
        "prev_hidden": hidden[scored - 1][keep].half(),
        "draft_next": draft_next[keep].int(),
        "target_next": target_next[keep].int(),
        "sequence": torch.full((int(keep.sum()),), index, dtype=torch.int32),
    }
