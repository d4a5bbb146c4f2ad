"""Spherical k-means over the rows of an output head (DynaSpec's vocabulary partition).

Tokens whose unembedding vectors point the same way are predicted in similar contexts, so a
cluster of rows is a coarse "kind of next token" a router can choose before the head runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


@torch.inference_mode()
def spherical_kmeans(
    rows: torch.Tensor,
    num_clusters: int,
    iterations: int = 30,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """Cluster index [V] (int64) of each row of ``rows`` [V, d] under cosine similarity.

    Initialised by k-means++ on a sample; an emptied cluster is re-seeded with the row that
    fits its current centroid worst. Stops early when no assignment changes.
    """
    vocab = rows.shape[0]
    if not 1 <= num_clusters <= vocab:
        raise ValueError(f"num_clusters must be in 1..{vocab}, got {num_clusters}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    points = F.normalize(rows.float(), dim=1)
    generator = torch.Generator().manual_seed(seed)
    centroids = _kmeans_plus_plus(points, num_clusters, generator)
    assignment = torch.full((vocab,), -1, dtype=torch.long)
    for step in range(iterations):
        similarity, new = _assign(points, centroids)
        changed = int((new != assignment).sum())
        assignment = new
        sums = torch.zeros_like(centroids).index_add_(0, assignment, points)
        counts = torch.bincount(assignment, minlength=num_clusters)
        for empty in torch.nonzero(counts == 0).flatten().tolist():
            worst = int(similarity.argmin())
            sums[empty] = points[worst]
            similarity[worst] = float("inf")
        centroids = F.normalize(sums, dim=1)
        if progress is not None:
            progress(step + 1, iterations)
        if changed == 0:
            break
    return _assign(points, centroids)[1]


def _assign(points: torch.Tensor, centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    best, index = [], []
    for chunk in points.split(16384):
        value, which = (chunk @ centroids.T).max(dim=1)
        best.append(value)
        index.append(which)
    return torch.cat(best), torch.cat(index)


def _kmeans_plus_plus(
    points: torch.Tensor, num_clusters: int, generator: torch.Generator
) -> torch.Tensor:
    sample_size = min(points.shape[0], max(20 * num_clusters, 4096))
    sample = points[torch.randperm(points.shape[0], generator=generator)[:sample_size]]
    chosen = [int(torch.randint(sample_size, (1,), generator=generator))]
    distance = 1 - sample @ sample[chosen[0]]
    for _ in range(1, num_clusters):
        weights = distance.clamp_min(0) + 1e-12
        chosen.append(int(torch.multinomial(weights, 1, generator=generator)))
        distance = torch.minimum(distance, 1 - sample @ sample[chosen[-1]])
    return sample[chosen].clone()
