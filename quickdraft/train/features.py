"""Drafter features over a corpus, cached on disk in shards so an interrupted run resumes.

For every scored position t of every sequence a shard holds: the token x_t, the drafter's
hidden state before it in fp16 (a draft model's final hidden state at t-1; for an EAGLE
drafter, the target's fused feature at t-1, which its entry for x_t reads), the drafter's own
argmax after x_t, and the target's argmax after x_t (the token the target would emit next).
These are exactly the inputs and the label of a DynaSpec router, and enough to measure how
often a shortlist keeps the drafter's choice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from quickdraft.artifacts import read_json, read_safetensors
from quickdraft.drafters.eagle.net import EagleNet, check_fits
from quickdraft.models.base import FeatureModel, Model
from quickdraft.train.common import fingerprint
from quickdraft.train.corpus import Sequence

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


class DrafterSource:
    """Features of a draft model: its final hidden state at t - 1 and its own argmax after x_t;
    labels from ``target``'s argmax (None: the corpus's own next token)."""

    def __init__(self, drafter: Model, target: Model | None):
        self.drafter, self.target = drafter, target

    def run(self, tokens: torch.Tensor, scored: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(hidden before each scored position [S, d], draft argmax [S], label [S], -1 where
        the corpus has none)."""
        positions = torch.arange(tokens.shape[1]).unsqueeze(0)
        drafter = self.drafter
        out = drafter.forward(tokens, positions, drafter.new_cache(1, tokens.shape[1]))
        prev_hidden = out.hidden[0, scored - 1]
        draft_next = out.logits[0, scored].argmax(-1)
        del out
        if self.target is not None:
            target = self.target
            logits = target.forward(tokens, positions, target.new_cache(1, tokens.shape[1]))
            target_next = logits.logits[0, scored].argmax(-1)
        else:  # the corpus's next token; the last position has none
            target_next = torch.cat([tokens[0, 1:], torch.tensor([-1])])[scored]
        return prev_hidden, draft_next, target_next


class EagleSource:
    """Features of an EAGLE drafter's first draft level, where its router runs: the entry for
    x_t reads the target's fused feature at t - 1 (the "hidden before") and its output
    predicts the token after x_t (the drafter's own argmax over the target's whole head);
    labels are the target's argmax after x_t, from the same target pass."""

    def __init__(self, target: Model, net: EagleNet):
        if not isinstance(target, FeatureModel):
            raise ValueError("target: EAGLE features need the native runner")
        check_fits(net, target)  # an --eagle-dir of another target, named before any work
        self.layers = tuple(layer - 1 for layer in net.config.feature_layers)
        self.target, self.net = target.with_taps(self.layers), net.eval()
        self.head = target.head_weight

    def run(self, tokens: torch.Tensor, scored: torch.Tensor) -> tuple[torch.Tensor, ...]:
        target, net = self.target, self.net
        positions = torch.arange(tokens.shape[1]).unsqueeze(0)
        out = target.forward(tokens, positions, target.new_cache(1, tokens.shape[1]))
        taps = [out.taps[layer].float() for layer in self.layers]
        fused = net.fuse(out.hidden.float(), taps)  # [1, T, d]: f_t
        target_next = out.logits[0, scored].argmax(-1)
        # Anchor a reads (f_a, e_{a+1}) and predicts x_{a+2}: the prediction after x_t is
        # anchor t - 1's output.
        embeds = target.embed[tokens[:, 1:]].float()
        pad = torch.zeros(1, tokens.shape[1] - 1, dtype=torch.bool)
        (output,) = net.unroll(embeds, fused[:, :-1], 1, pad)
        logits = net.head_input(output[0, scored - 1]) @ self.head.float().T
        return fused[0, scored - 1], logits.argmax(-1), target_next


def extract(
    sequences: list[Sequence],
    source: DrafterSource | EagleSource,
    folder: Path,
    settings: dict,
    progress: Callable[[int, int], None] | None = None,
) -> Features:
    """Features of ``sequences`` under ``folder``; shards already there (same settings) are
    reused."""
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
            rows = [_sequence_features(s, source, first + i) for i, s in enumerate(chunk)]
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
    sequence: Sequence, source: DrafterSource | EagleSource, index: int
) -> dict[str, torch.Tensor]:
    tokens = torch.tensor(sequence.tokens).unsqueeze(0)
    scored = torch.arange(max(sequence.start, 1), tokens.shape[1])
    prev_hidden, draft_next, target_next = source.run(tokens, scored)
    keep = target_next >= 0
    return {
        "tokens": tokens[0, scored][keep].int(),
        "prev_hidden": prev_hidden[keep].half(),
        "draft_next": draft_next[keep].int(),
        "target_next": target_next[keep].int(),
        "sequence": torch.full((int(keep.sum()),), index, dtype=torch.int32),
    }
