"""The target's features for Medusa heads and early-exit adapters (``quickdraft train
medusa``, step 1): its final hidden state and its own next-token choice at every position from
the one before a sequence's reply, in shards an interrupted run reuses; the heads' labels
drawn from those choices; a split by whole sequences."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from quickdraft.artifacts import read_checkpoint
from quickdraft.models.llama import LlamaRunner
from quickdraft.train.corpus import Sequence

Progress = Callable[[str, int, int], None]
SHARD = 64  # sequences per feature shard


@dataclass(frozen=True, slots=True)
class HeadFeatures:
    """Per position: hidden [P, d] fp16 (the target's final state), choice [P] (its argmax
    there), sequence [P] (index of the sequence). Positions run from the one before a
    sequence's first scored (reply) token to its end."""

    hidden: torch.Tensor
    choice: torch.Tensor
    sequence: torch.Tensor

    def __len__(self) -> int:
        return self.choice.numel()


@torch.inference_mode()
def extract(
    target: LlamaRunner,
    sequences: list[Sequence],
    folder: Path,
    progress: Progress | None = None,
    teacher: LlamaRunner | None = None,
) -> HeadFeatures:
    """The target's hidden states and choices over ``sequences``, in shards under ``folder``;
    shards already there are reused. With a ``teacher``, the choices are the teacher's (a
    pruned model's states, labelled by the full model's choices)."""
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for first in range(0, len(sequences), SHARD):
        path = folder / f"shard-{first // SHARD:05d}.pt"
        if not path.exists():
            chunk = sequences[first : first + SHARD]
            parts = [_sequence(target, s, first + i, teacher) for i, s in enumerate(chunk)]
            shard = {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
            torch.save(shard, path.with_suffix(".tmp"))
            path.with_suffix(".tmp").rename(path)
        shards.append(read_checkpoint(path, "delete the shard to extract it again"))
        if progress is not None:
            progress("features", min(first + SHARD, len(sequences)), len(sequences))
    merged = {key: torch.cat([s[key] for s in shards]) for key in shards[0]}
    return HeadFeatures(**merged)


def _sequence(
    target: LlamaRunner, sequence: Sequence, index: int, teacher: LlamaRunner | None
) -> dict[str, torch.Tensor]:
    tokens = torch.tensor([sequence.tokens])
    length = tokens.shape[1]
    positions = torch.arange(length).unsqueeze(0)
    out = target.forward(tokens, positions, target.new_cache(1, length))
    logits = out.logits
    if teacher is not None:
        logits = teacher.forward(tokens, positions, teacher.new_cache(1, length)).logits
    # Positions from the one before the first reply token: its state drafts the reply's start.
    start = max(sequence.start - 1, 0)
    return {
        "hidden": out.hidden[0, start:].half(),
        "choice": logits[0, start:].argmax(-1),
        "sequence": torch.full((length - start,), index),
    }


def head_labels(
    features: HeadFeatures, num_heads: int, offset: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels [P, H], valid [P, H]): head i's label at position t is the target's choice at
    t + i - 1 + offset of the same sequence (offset 1: the token i places after the next)."""
    count = len(features)
    labels = torch.zeros(count, num_heads, dtype=torch.long)
    valid = torch.zeros(count, num_heads, dtype=torch.bool)
    for i in range(1, num_heads + 1):
        shift = i - 1 + offset
        if shift == 0:
            labels[:, i - 1] = features.choice
            valid[:, i - 1] = True
            continue
        labels[:-shift, i - 1] = features.choice[shift:]
        valid[:-shift, i - 1] = features.sequence[shift:] == features.sequence[:-shift]
    return labels, valid


def split(features: HeadFeatures, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks [P] of training and held-out positions, by whole sequences."""
    sequences = features.sequence.unique()
    generator = torch.Generator().manual_seed(seed)
    order = sequences[torch.randperm(sequences.numel(), generator=generator)]
    held = torch.isin(features.sequence, order[: max(1, round(fraction * sequences.numel()))])
    return ~held, held
