"""Training of a DynaSpec router (``train router``, step 4 of ``train.shortlist_artifacts``):
cross-entropy toward the cluster of the target's next token over the drafter's features,
AdamW, a checkpoint after every epoch (an interrupted run resumes from it), the best epoch on
held-out sequences kept; and the coverage metrics every shortlist is judged by."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from quickdraft.artifacts import ArtifactError, read_checkpoint, written_whole
from quickdraft.train.common import check_settings
from quickdraft.train.features import Features
from quickdraft.vocab.router import Router, RouterConfig

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class RouterTraining:
    epochs: int = 8
    batch_size: int = 256
    lr: float = 2e-3
    weight_decay: float = 0.01
    width: int = 512
    validation_fraction: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        check_settings(self, ("epochs", "batch_size", "width"))


def split(features: Features, fraction: float, seed: int) -> tuple[Features, Features]:
    """Held-out split by whole sequences, so validation contexts are unseen."""
    sequences = features.sequence.unique()
    generator = torch.Generator().manual_seed(seed)
    order = sequences[torch.randperm(sequences.numel(), generator=generator)]
    held = order[: max(1, round(fraction * sequences.numel()))]
    mask = torch.isin(features.sequence, held)
    return features.subset(~mask), features.subset(mask)


def train_router(
    train: Features,
    held: Features,
    assignment: torch.Tensor,
    embed: torch.Tensor,
    settings: RouterTraining,
    checkpoint: Path,
    progress: Progress | None = None,
) -> tuple[Router, dict]:
    """A router trained on ``train``, the epoch with the lowest loss on ``held`` kept;
    resumes from ``checkpoint`` when it exists. Every row's label is the cluster of its
    target token, so both sets hold only rows whose target is in a cluster."""
    if len(train) == 0 or len(held) == 0:
        raise ValueError("features: too few rows to train on and to hold out")
    if bool((assignment[train.target_next] < 0).any() or (assignment[held.target_next] < 0).any()):
        raise ValueError("features: rows whose target is in the core have no cluster label")
    num_clusters = int(assignment.max()) + 1
    torch.manual_seed(settings.seed)
    router = Router(RouterConfig(embed.shape[1], num_clusters, settings.width))
    optimizer = torch.optim.AdamW(
        router.parameters(), lr=settings.lr, weight_decay=settings.weight_decay
    )
    steps_per_epoch = math.ceil(len(train) / settings.batch_size)
    total = settings.epochs * steps_per_epoch
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, settings.lr, total_steps=total, pct_start=0.1
    )
    labels = assignment[train.target_next]
    history: list[dict] = []
    best_state, best_loss, first_epoch = None, float("inf"), 0
    if checkpoint.exists():
        saved = read_checkpoint(checkpoint, "delete it to start the training over", trusted=True)
        if not isinstance(saved, dict) or not {"settings", "clusters", "router"} <= saved.keys():
            raise ArtifactError(checkpoint, "not a router training checkpoint", "delete it")
        if saved["settings"] != asdict(settings) or saved["clusters"] != num_clusters:
            raise ValueError(f"checkpoint: {checkpoint} was made with other settings")
        router.load_state_dict(saved["router"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        history, best_loss, best_state = saved["history"], saved["best_loss"], saved["best"]
        first_epoch = saved["epoch"] + 1
    generator = torch.Generator().manual_seed(settings.seed)
    for _ in range(first_epoch):  # the same shuffles as an uninterrupted run
        torch.randperm(len(train), generator=generator)
    for epoch in range(first_epoch, settings.epochs):
        router.train()
        order = torch.randperm(len(train), generator=generator)
        running = 0.0
        for step, batch in enumerate(order.split(settings.batch_size)):
            scores = router(embed[train.tokens[batch]], train.prev_hidden[batch].float())
            loss = F.cross_entropy(scores, labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            running += float(loss.detach())
            if progress is not None:
                progress("router", epoch * steps_per_epoch + step + 1, total)
        held_loss = evaluate_loss(router, held, assignment, embed)
        history.append(
            {"epoch": epoch + 1, "train_loss": running / steps_per_epoch, "held_loss": held_loss}
        )
        if held_loss < best_loss:
            best_loss = held_loss
            best_state = {n: t.clone() for n, t in router.state_dict().items()}
        with written_whole(checkpoint) as partial:  # an interrupted save keeps the last one
            torch.save(
                {
                    "settings": asdict(settings),
                    "clusters": num_clusters,
                    "router": router.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(),
                    "history": history,
                    "best_loss": best_loss,
                    "best": best_state,
                    "epoch": epoch,
                },
                partial,
            )
    if best_state is not None:
        router.load_state_dict(best_state)
    return router.eval(), {"history": history, "train_rows": len(train), "held_rows": len(held)}


@torch.inference_mode()
def scores_of(router: Router, features: Features, embed: torch.Tensor) -> torch.Tensor:
    router.eval()
    return torch.cat(
        [
            router(embed[features.tokens[i : i + 4096]], features.prev_hidden[i : i + 4096].float())
            for i in range(0, len(features), 4096)
        ]
    )


def evaluate_loss(
    router: Router, features: Features, assignment: torch.Tensor, embed: torch.Tensor
) -> float:
    scores = scores_of(router, features, embed)
    return float(F.cross_entropy(scores, assignment[features.target_next]))


def coverage(
    scores: torch.Tensor, features: Features, assignment: torch.Tensor, budgets: list[int]
) -> list[dict]:
    """For each cluster budget k: how often the core (assignment -1) plus the top-k clusters
    hold the target's next token, the drafter's choice, and the drafter's choice when it
    equals the target's (the case that decides greedy acceptance), with the mean share of the
    vocabulary they cover."""
    num_clusters = scores.shape[1]
    sizes = torch.bincount(assignment[assignment >= 0], minlength=num_clusters).float()
    core = float((assignment < 0).sum())
    ranked = scores.argsort(dim=1, descending=True)

    def rank_of(tokens: torch.Tensor) -> torch.Tensor:
        cluster = assignment[tokens]
        rank = (ranked == cluster.clamp_min(0).unsqueeze(1)).float().argmax(1)
        return torch.where(cluster < 0, -1, rank)  # the core is always in

    target_rank, draft_rank = rank_of(features.target_next), rank_of(features.draft_next)
    agree = features.draft_next == features.target_next
    rows = []
    for k in budgets:
        covered = (core + sizes[ranked[:, :k]].sum(1)) / assignment.numel()
        rows.append(
            {
                "clusters": k,
                "vocab_share": float(covered.mean()),
                "target_recall": float((target_rank < k).float().mean()),
                "draft_recall": float((draft_rank < k).float().mean()),
                "agreeing_draft_recall": float((draft_rank[agree] < k).float().mean()),
            }
        )
    return rows


def drop_turn_boundaries(features: Features, special_ids: set[int], end_ids: set[int]) -> Features:
    """Rows where drafting never happens: x_t is a special token (role headers), or the
    corpus's next token is a special token other than the end of a reply or unknown (the
    start of the next turn or the end of the chat, where the target predicts an end-of-text
    token no reply contains)."""
    following = torch.full_like(features.tokens, -1)
    same = features.sequence[1:] == features.sequence[:-1]
    following[:-1][same] = features.tokens[1:][same]
    special = torch.tensor(sorted(special_ids), dtype=torch.long)
    starts = torch.tensor(sorted(special_ids - end_ids), dtype=torch.long)
    keep = ~torch.isin(features.tokens, special) & ~torch.isin(following, starts)
    keep &= following >= 0
    return features.subset(keep)


def frequency_coverage(
    ranked: torch.Tensor, features: Features, sizes: list[int], vocab: int
) -> list[dict]:
    """The same measures for static frequency lists of the given sizes."""
    rank = torch.empty(vocab, dtype=torch.long)
    rank[ranked] = torch.arange(ranked.numel())
    agree = features.draft_next == features.target_next
    return [
        {
            "tokens": size,
            "vocab_share": size / vocab,
            "target_recall": float((rank[features.target_next] < size).float().mean()),
            "draft_recall": float((rank[features.draft_next] < size).float().mean()),
            "agreeing_draft_recall": float(
                (rank[features.draft_next[agree]] < size).float().mean()
            ),
        }
        for size in sizes
    ]
