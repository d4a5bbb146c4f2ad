"""Training of shortlist artifacts for a drafter: frequency list, clusters and DynaSpec router.

``quickdraft train router`` runs ``build_artifacts``:

1. frequency: token counts over the corpus's replies with the target's tokenizer, each kind
   of text weighted equally (FR-Spec's ranked list);
2. clusters: spherical k-means of the drafter's head rows into M clusters;
3. features: the drafter's hidden states and the target's next tokens over a balanced sample of
   the corpus (``features.extract``, cached and resumable);
4. router: cross-entropy toward the cluster of the target's next token, AdamW, a checkpoint
   after every epoch (an interrupted run resumes from it), the best epoch on held-out
   sequences kept;
5. metrics: on the held-out sequences, for each cluster budget k, how often the top-k clusters
   hold the target's next token and the drafter's own choice, and their share of the vocabulary.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from quickdraft.artifacts import ArtifactError, read_checkpoint
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
            checkpoint,
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


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


@dataclass(frozen=True, slots=True)
class ArtifactSettings:
    """What ``quickdraft train router`` was asked for; recorded in metrics.json."""

    draft: str
    target: str | None
    data: tuple[str, ...]
    frequency_data: tuple[str, ...] = ()  # the frequency list's text; empty: ``data``
    # A ``train frequency`` folder whose list is used as it is (instead of counting).
    frequency: str | None = None
    clusters: int = 64
    core: int = 16384
    budget_tokens: int = 40_000
    max_tokens: int = 384
    int8: bool = True
    kmeans_iterations: int = 30
    # An EAGLE drafter of ``draft`` (then the target: EAGLE scores the target's own head rows);
    # the router reads its first draft level's inputs (``features.EagleSource``).
    eagle_dir: str | None = None


def token_frequency(sequences: list, vocab_size: int) -> torch.Tensor:
    """Frequency [V] of tokens in the scored part of ``sequences``, each kind weighted equally
    so that the largest source does not decide the list alone."""
    by_kind: dict[str, torch.Tensor] = {}
    for sequence in sequences:
        counts = by_kind.setdefault(sequence.kind, torch.zeros(vocab_size, dtype=torch.float64))
        scored = torch.tensor(sequence.tokens[sequence.start :], dtype=torch.long)
        counts += torch.bincount(scored[scored < vocab_size], minlength=vocab_size).double()
    total = torch.zeros(vocab_size, dtype=torch.float64)
    for counts in by_kind.values():
        total += counts / counts.sum().clamp_min(1)
    return total / max(len(by_kind), 1)


def build_artifacts(
    settings: ArtifactSettings,
    training: RouterTraining,
    out: Path,
    cache: Path,
    progress: Progress | None = None,
) -> dict:
    """Frequency list, clusters and router for ``settings.draft`` into ``out``."""
    from quickdraft.drafters.eagle.io import load_eagle
    from quickdraft.models.loading import load_model
    from quickdraft.train.common import fingerprint
    from quickdraft.train.corpus import balanced_sample, read_records, tokenize
    from quickdraft.train.features import DrafterSource, EagleSource, extract
    from quickdraft.vocab.clusters import spherical_kmeans
    from quickdraft.vocab.shortlist import (
        load_frequency,
        load_ranked,
        save_clusters,
        save_frequency,
    )

    records = read_records(list(settings.data))
    eagle = settings.eagle_dir is not None
    if eagle and settings.target not in (None, settings.draft):
        raise ValueError("target: with an EAGLE drafter the shortlisted head is the target's")
    # An EAGLE drafter's target runs in float, as it does when it verifies.
    draft, tokenizer = load_model(settings.draft, int8=settings.int8 and not eagle)
    head = getattr(draft, "head_weight", None)
    if head is None:
        raise ValueError(f"draft: {settings.draft} does not run on the native runner")
    target = None
    if settings.target is not None and not eagle:
        target, target_tokenizer = load_model(settings.target, int8=settings.int8)
        if target_tokenizer.hf.get_vocab() != tokenizer.hf.get_vocab():
            raise ValueError("target: its tokenizer differs from the draft's")
    vocab = min(head.shape[0], target.vocab_size if target is not None else head.shape[0])
    sequences = [tokenize(r, tokenizer, settings.max_tokens) for r in records]
    out.mkdir(parents=True, exist_ok=True)

    if settings.frequency is not None:
        if settings.frequency_data:
            raise ValueError("frequency: give a counted list or text to count, not both")
        counts = load_frequency(settings.frequency)
        if counts.numel() < vocab:
            raise ValueError(
                f"frequency: {settings.frequency} counts {counts.numel()} ids, the head has {vocab}"
            )
        save_frequency(out, counts[:vocab], {"from": str(settings.frequency)})
    else:
        counted = sequences
        if settings.frequency_data:
            extra = read_records(list(settings.frequency_data))
            counted = [tokenize(r, tokenizer, settings.max_tokens) for r in extra]
        frequency_files = list(settings.frequency_data or settings.data)
        save_frequency(out, token_frequency(counted, vocab), {"data": frequency_files})

    def report(stage: str) -> Callable[[int, int], None] | None:
        return None if progress is None else (lambda done, total: progress(stage, done, total))

    # The core (the most frequent tokens) is always in the shortlist; the clusters split
    # the rest of the vocabulary.
    ranked = load_ranked(out)[: settings.core]
    rest = torch.ones(vocab, dtype=torch.bool)
    rest[ranked] = False
    rest_ids = torch.nonzero(rest).flatten()
    assignment = torch.full((vocab,), -1, dtype=torch.long)
    assignment[rest_ids] = spherical_kmeans(
        head[rest_ids], settings.clusters, settings.kmeans_iterations, training.seed,
        report("clusters"),
    )  # fmt: skip
    cluster_settings = {"clusters": settings.clusters, "core": settings.core, "seed": training.seed}
    save_clusters(out, assignment, cluster_settings)

    sample = balanced_sample(sequences, settings.budget_tokens, training.seed)
    feature_settings = {
        "draft": settings.draft,
        "target": settings.target,
        "int8": settings.int8,
        "budget_tokens": settings.budget_tokens,
        "max_tokens": settings.max_tokens,
        "seed": training.seed,
        "data": list(settings.data),
    }
    if eagle:
        assert settings.eagle_dir is not None
        net = load_eagle(settings.eagle_dir, draft.config.num_layers)  # type: ignore[attr-defined]
        source: DrafterSource | EagleSource = EagleSource(draft, net)
        feature_settings["eagle_dir"] = str(settings.eagle_dir)
        feature_settings["int8"] = False  # the target runs in float
    else:
        source = DrafterSource(draft, target)
    folder = cache / f"features-{fingerprint(feature_settings)}"
    features = extract(sample, source, folder, feature_settings, report("features"))
    features = features.subset(features.target_next < vocab)
    hf = tokenizer.hf
    features = drop_turn_boundaries(features, set(hf.all_special_ids), set(tokenizer.eos_token_ids))
    embed = draft.embed.float()
    # Held-out sequences for validation and metrics. The router only ever chooses among
    # clusters, so it learns from rows whose target is outside the core.
    train, held = split(features, training.validation_fraction, training.seed)
    routed = [part.subset(assignment[part.target_next] >= 0) for part in (train, held)]
    rows = {"train_rows": len(routed[0]), "held_rows": len(routed[1])}
    key = fingerprint({**feature_settings, **asdict(training), **cluster_settings, **rows})
    checkpoint = cache / f"router-{key}.pt"
    router, log = train_router(*routed, assignment, embed, training, checkpoint, progress)
    router.save(out, inputs="eagle" if eagle else "hidden")

    scores = scores_of(router, held, embed)
    budgets = sorted(
        {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64} & set(range(1, settings.clusters + 1))
    )
    ranked = load_ranked(out)
    metrics = {
        "settings": {
            **asdict(settings),
            "data": list(settings.data),
            "frequency_data": list(settings.frequency_data),
        },
        "training": asdict(training),
        "features": {
            "rows": len(features),
            "routed_rows": len(routed[0]) + len(routed[1]),
            "sequences": int(features.sequence.unique().numel()),
        },
        "drafter_target_agreement": float((held.draft_next == held.target_next).float().mean()),
        "log": log,
        "core_size": int((assignment < 0).sum()),
        "cluster_sizes": torch.bincount(
            assignment[assignment >= 0], minlength=settings.clusters
        ).tolist(),
        "router_coverage": coverage(scores, held, assignment, budgets),
        "frequency_coverage": frequency_coverage(
            ranked, held, [1024, 4096, 8192, 16384, 32768, 65536], vocab
        ),
    }
    write_json(out / "metrics.json", metrics)
    return metrics
