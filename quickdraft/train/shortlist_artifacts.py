"""Shortlist artifacts for a drafter: frequency list, clusters and DynaSpec router.

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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from quickdraft.train.router import (
    Progress,
    RouterTraining,
    coverage,
    drop_turn_boundaries,
    frequency_coverage,
    scores_of,
    split,
    train_router,
)


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
    from quickdraft.train.common import fingerprint, folder_digest, sample_digest
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
        if bool((counts[vocab:] > 0).any()):  # text never holds a padding row's id
            raise ValueError(
                f"frequency: {settings.frequency} counts ids past the head's {vocab}: it was "
                "counted with another tokenizer"
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
        "sample": sample_digest(sample),  # a data file changed at the same path: another run
    }
    if eagle:
        assert settings.eagle_dir is not None
        net = load_eagle(settings.eagle_dir, draft.config.num_layers)  # type: ignore[attr-defined]
        source: DrafterSource | EagleSource = EagleSource(draft, net)
        feature_settings["eagle_dir"] = str(settings.eagle_dir)
        feature_settings["eagle_contents"] = folder_digest(settings.eagle_dir)  # retrained there
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
