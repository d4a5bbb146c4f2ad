"""The target's features for EAGLE training (``quickdraft train eagle``, step 1 and 2).

Per sequence: its tokens from ``context`` tokens before the reply, the target's final normed
states there and, for EAGLE-3, the inputs of its three feature layers, all fp16, cached in
shards so an interrupted extraction resumes; and the draft vocabulary they imply.
"""

from __future__ import annotations

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


@torch.inference_mode()
def extract(
    target: LlamaRunner,
    sequences: list[Sequence],
    layers: tuple[int, ...],
    context: int,
    folder: Path,
    progress: Progress | None = None,
) -> EagleFeatures:
    """The target's features over ``sequences``, in shards under ``folder`` (reused when
    there). ``layers``: the feature layers (their inputs are the outputs of the layers below)."""
    folder.mkdir(parents=True, exist_ok=True)
    tapped = target.with_taps(tuple(layer - 1 for layer in layers)) if layers else target
    merged: dict[str, list] = {"tokens": [], "hidden": [], "taps": [], "start": []}
    for first in range(0, len(sequences), SHARD):
        path = folder / f"shard-{first // SHARD:05d}.pt"
        if not path.exists():
            shard: dict[str, list] = {key: [] for key in merged}
            for sequence in sequences[first : first + SHARD]:
                tokens = torch.tensor([sequence.tokens])
                length = tokens.shape[1]
                # The body only: the LM head's logits are not needed here.
                hidden, tapped_states = tapped.body(
                    tokens, torch.arange(length).unsqueeze(0), tapped.new_cache(1, length)
                )
                keep = max(0, sequence.start - context)
                shard["tokens"].append(tokens[0, keep:].clone())
                shard["hidden"].append(hidden[0, keep:].half().clone())
                taps = [tapped_states[layer - 1][0, keep:] for layer in layers]
                shard["taps"].append(torch.stack(taps, 1).half().clone() if taps else None)
                shard["start"].append(sequence.start - keep)
            torch.save(shard, path.with_suffix(".tmp"))
            path.with_suffix(".tmp").rename(path)
        shard = read_checkpoint(path, "delete the shard to extract it again")
        if not isinstance(shard, dict) or not set(merged) <= shard.keys():
            raise ArtifactError(path, "not a feature shard", "delete it to extract it again")
        for key in merged:
            merged[key] += shard[key]
        if progress is not None:
            progress("features", min(first + SHARD, len(sequences)), len(sequences))
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
