"""The EAGLE training objective (``train.eagle``): its settings, padded batches of extracted
features, where each unrolled step is scored, and each step's loss against the target's own
distribution over the draft vocabulary (plus EAGLE-1's feature regression), as a module for
DistributedDataParallel."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from quickdraft.drafters.eagle.net import EagleNet, EagleVariant
from quickdraft.train.common import check_settings
from quickdraft.train.eagle_features import EagleFeatures


@dataclass(frozen=True, slots=True)
class EagleTraining:
    """``quickdraft train eagle``'s settings (``train.eagle.train_eagle``)."""

    variant: EagleVariant = EagleVariant.EAGLE3
    steps: int = 3  # training-time test steps (EAGLE-1: 1)
    draft_vocab: int = 8192
    epochs: int = 3
    batch_size: int = 8  # sequences
    lr: float = 1e-3
    weight_decay: float = 0.0
    decay: float = 0.8
    regression_weight: float = 1.0  # EAGLE-1's feature loss (its token loss weighs 0.1)
    noise: float = 0.2  # EAGLE-1: uniform noise of this width on the input features
    clip: float = 0.5
    validation_fraction: float = 0.1
    checkpoint_every: int = 200
    seed: int = 0
    # The draft layer's MLP width (None: the target's). The 1.5B's drafter takes a narrower
    # one to fit the repository's artifact budget and a cheap draft step.
    intermediate_size: int | None = None
    # A drafter folder saved by quickdraft for the same target and variant: training starts
    # from its layers (more epochs, or new data) instead of from random ones. Its draft
    # vocabulary is not taken: the rows it scores are the target's, chosen again here.
    init: str | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "variant", EagleVariant(self.variant))
        except ValueError:
            raise ValueError(f"variant must be eagle1 or eagle3, got {self.variant!r}") from None
        counts = ("steps", "draft_vocab", "epochs", "batch_size", "checkpoint_every")
        check_settings(self, counts)
        if self.intermediate_size is not None:
            check_settings(self, ("intermediate_size",))


def collate(features: EagleFeatures, batch: list[int], steps: int, device: torch.device) -> dict:
    """Padded tensors of a batch: tokens [b, T + steps] (padding 0), hidden [b, T, d],
    taps [b, T, 3, d] or None, real [b, T + steps] bool, start [b]."""
    length = max(features.tokens[i].numel() for i in batch)
    width = features.hidden[batch[0]].shape[-1]
    tokens = torch.zeros(len(batch), length + steps, dtype=torch.long)
    hidden = torch.zeros(len(batch), length, width)
    real = _real([features.tokens[i].numel() for i in batch], length + steps)
    taps = None
    if features.taps[batch[0]] is not None:
        taps = torch.zeros(len(batch), length, features.taps[batch[0]].shape[1], width)
    for row, i in enumerate(batch):
        n = features.tokens[i].numel()
        tokens[row, :n] = features.tokens[i]
        hidden[row, :n] = features.hidden[i].float()
        if taps is not None:
            taps[row, :n] = features.taps[i].float()
    start = torch.tensor([features.start[i] for i in batch])
    out = {"tokens": tokens, "hidden": hidden, "taps": taps, "real": real, "start": start}
    return {k: v.to(device) if v is not None else None for k, v in out.items()}


def _real(lengths: list[int], width: int) -> torch.Tensor:
    """[b, width] bool: which places of each padded row hold a token."""
    return torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)


def scored_anchors(
    real: torch.Tensor, start: torch.Tensor, anchors: int, step: int
) -> torch.Tensor:
    """[b, anchors] bool: where unrolled step ``step`` is scored: token t + 2 + step (its
    label's place t + 1 + step) is real and lies in the reply (or is its first token's
    predecessor's successor: the place before the reply drafts the reply's first token)."""
    label_at = torch.arange(anchors, device=real.device) + 1 + step
    return real[:, label_at] & (label_at.unsqueeze(0) >= (start - 1).unsqueeze(1))


def scored_counts(features: EagleFeatures, batch: list[int], steps: int) -> torch.Tensor:
    """[steps]: how many positions each unrolled step scores over ``batch`` (the divisor of
    the global batch's mean loss, the same on every process)."""
    lengths = [features.tokens[i].numel() for i in batch]
    real = _real(lengths, max(lengths) + steps)
    start = torch.tensor([features.start[i] for i in batch])
    anchors = max(lengths) - 1
    return torch.tensor(
        [float(scored_anchors(real, start, anchors, j).sum()) for j in range(steps)]
    )


def step_losses(
    net: EagleNet, embed: torch.Tensor, head: torch.Tensor, batch: dict, settings: EagleTraining,
    noise: bool,
) -> tuple[dict[int, torch.Tensor], list[dict]]:  # fmt: skip
    """Every unrolled step's summed loss over its scored positions (step j -> sum; a step
    with none is left out), and what evaluation needs of it: the draft's and the target's
    argmax over the draft vocabulary, and where the target's hidden state there lies among
    ``teachers`` (its states at every step's label places, shared: steps share most places).

    embed: the target's embedding [V, d]; head: its LM head rows of the draft vocabulary
    [S, d]. Step j at anchor t is scored where token t + 2 + j is a reply token; its label
    is the target's distribution there (its LM head on its hidden state at t + 1 + j)."""
    tokens, hidden, real = batch["tokens"], batch["hidden"], batch["real"]
    anchors = hidden.shape[1] - 1  # anchor t needs token t + 1
    taps = None if batch["taps"] is None else list(batch["taps"][:, :anchors].unbind(2))
    feature = hidden[:, :anchors]
    if noise and net.config.variant is EagleVariant.EAGLE1 and settings.noise > 0:
        feature = feature + (torch.rand_like(feature) - 0.5) * settings.noise
    features = net.fuse(feature, taps)
    embeds = embed[tokens[:, 1 : anchors + settings.steps]].float()  # e_{t+1+j}
    # Step j scores anchors t >= start - 2 - j: the prompt's earlier anchors only give keys.
    first = max(0, int(batch["start"].min()) - 1 - settings.steps)
    outputs = net.unroll(embeds, features, settings.steps, ~real[:, :anchors], first)
    scored = [
        scored_anchors(real, batch["start"], anchors, j).nonzero(as_tuple=True)
        for j in range(settings.steps)
    ]  # (rows, anchors) per step
    # The target's distribution at each label place, once: steps share most of their places.
    places = torch.zeros(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
    for j, (rows, columns) in enumerate(scored):
        places[rows, columns + 1 + j] = True
    slot = places.flatten().cumsum(0).view_as(places) - 1
    teachers = hidden[places]  # [places, d]
    with torch.no_grad():
        target_probs = (teachers @ head.T).softmax(-1)  # [places, S]
    losses, seen = {}, []
    for j, (output, (rows, columns)) in enumerate(zip(outputs, scored, strict=True)):
        if rows.numel() == 0:
            continue
        place = slot[rows, columns + 1 + j]  # [n] into teachers
        target = target_probs[place]  # [n, S]
        drafted = output[rows, columns - first]
        draft_logits = net.head_input(drafted) @ head.T
        loss = F.cross_entropy(draft_logits, target, reduction="sum")
        if net.config.variant is EagleVariant.EAGLE1:
            teacher = teachers[place]  # [n, d]
            regression = F.smooth_l1_loss(drafted, teacher, reduction="none").mean(-1).sum()
            loss = 0.1 * loss + settings.regression_weight * regression
        losses[j] = loss
        seen.append(
            {
                "step": j,
                "draft": draft_logits.detach().argmax(-1),
                "target": target.argmax(-1),
                "place": place,
                "teachers": teachers,
            }
        )
    return losses, seen


class Objective(nn.Module):
    """The training loss as a module's forward, so that DistributedDataParallel (which syncs
    gradients around ``forward``) sees the whole pass: the net's parts are called directly."""

    def __init__(self, net: EagleNet, settings: EagleTraining):
        super().__init__()
        self.net, self.settings = net, settings

    def forward(
        self, batch: dict, embed: torch.Tensor, head: torch.Tensor, counts: torch.Tensor,
        scale: int,
    ) -> torch.Tensor:  # fmt: skip
        """The piece's share of the global batch's loss: each step's sum over the piece
        divided by its count over the global batch, weighted ``decay``^j, times ``scale``."""
        sums, _ = step_losses(self.net, embed, head, batch, self.settings, noise=True)
        if not sums:  # nothing to score: a zero loss every parameter takes part in, as
            # DistributedDataParallel requires of every pass
            return sum(p.sum() * 0 for p in self.parameters())
        loss = sum(total / counts[j] * self.settings.decay**j for j, total in sums.items())
        return loss * scale
