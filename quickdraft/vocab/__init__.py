"""Drafter output-head shortlists: frequency (FR-Spec) and context-aware clusters (DynaSpec).

``parse_shortlist`` reads the command line's and the config's shortlist strings:

====================  =========================================================================
``full``              the whole vocabulary (the default)
``fr:K``              FR-Spec: the K most frequent tokens at every draft position
``fr-pa:K``           FR-Spec-PA: K tokens at positions 0 and 1, then K // ((t + 1) * 2)
``dyna:K``            DynaSpec-F: the union of the router's top K clusters at every position
``dyna-pa:K``         DynaSpec-PA: K clusters at positions 0 and 1, then K // ((t + 1) * 2)
``dyna-hybrid:K``     quickdraft's earlier variant: DynaSpec-F plus the sequence's own tokens
``dyna-hybrid-pa:K``  the same on the position-aware budget
====================  =========================================================================

``dyna:0`` and ``dyna-hybrid:0`` route nothing: the core alone, and the core with the sequence's
tokens (ablations of the hybrid; ``dyna:0`` needs artifacts with a core).

``dyna`` and ``dyna-pa`` are the paper's method when the artifacts cluster every head row
(``quickdraft train router --core 0``): the shortlist is the routed clusters and nothing else.
Artifacts trained with a core of frequent tokens left out of the clusters add that core to
every shortlist (it has no cluster to be routed to). The hybrid kinds also add every token of
the sequence so far, prompt and output (``ClusterShortlist(context=True)``); with a core they
are the variant benchmarks/results/shortlists measured for the Qwen pair.

Frequency lists, clusters and routers are read from an artifact folder: the one shipped for the
drafter (``ARTIFACTS / <model alias>``) or any folder ``quickdraft train router`` wrote.
"""

from __future__ import annotations

from pathlib import Path

from quickdraft.vocab.router import Router, RouterConfig
from quickdraft.vocab.shortlist import (
    ClusterShortlist,
    FrequencyShortlist,
    SegmentedHead,
    Shortlist,
    load_clusters,
    load_ranked,
    position_budget,
)

ARTIFACTS = Path(__file__).parent / "artifacts"
KINDS = ("full", "fr", "fr-pa", "dyna", "dyna-pa", "dyna-hybrid", "dyna-hybrid-pa")


def parse_shortlist(text: str) -> tuple[str, int]:
    """'kind:K' -> (kind, K); 'full' -> ('full', 0). ValueError names the field."""
    kind, _, size = text.strip().partition(":")
    if kind not in KINDS:
        raise ValueError(f"shortlist: unknown kind {kind!r}; choose from {', '.join(KINDS)}")
    if kind == "full":
        if size:
            raise ValueError("shortlist: 'full' takes no size")
        return kind, 0
    if not size.isdigit() or int(size) < (0 if kind in ("dyna", "dyna-hybrid") else 1):
        raise ValueError(f"shortlist: {text!r} needs a positive size, as in '{kind}:32'")
    return kind, int(size)


def artifact_folder(model_name: str | None, folder: str | Path | None = None) -> Path:
    """The explicit folder, else the shipped artifacts of ``model_name``."""
    if folder is not None:
        return Path(folder)
    shipped_for = ARTIFACTS / model_name if model_name else None
    if shipped_for is not None and shipped_for.parent == ARTIFACTS and shipped_for.is_dir():
        return shipped_for
    shipped = ", ".join(sorted(p.name for p in ARTIFACTS.iterdir() if p.is_dir()))
    raise ValueError(
        f"shortlist_dir: no shortlist artifacts ship for draft {model_name!r} "
        f"(shipped: {shipped or 'none'}); train them with 'quickdraft train router' "
        "and pass the folder"
    )


def build_shortlist(
    text: str, folder: str | Path, num_positions: int, parallel_router: bool = False
) -> Shortlist | None:
    """The shortlist described by ``text`` with artifacts from ``folder``; None for 'full'."""
    kind, size = parse_shortlist(text)
    if kind == "full":
        return None
    if kind == "fr":
        return FrequencyShortlist(load_ranked(folder), [size])
    if kind == "fr-pa":
        return FrequencyShortlist.position_aware(load_ranked(folder), size, num_positions)
    router = Router.load(folder)
    return ClusterShortlist(
        load_clusters(folder), router, max(size, 1), position_aware=kind.endswith("-pa"),
        parallel=parallel_router, context=kind.startswith("dyna-hybrid"), route=size > 0,
    )  # fmt: skip


__all__ = [
    "ARTIFACTS",
    "ClusterShortlist",
    "FrequencyShortlist",
    "Router",
    "RouterConfig",
    "SegmentedHead",
    "Shortlist",
    "artifact_folder",
    "build_shortlist",
    "parse_shortlist",
    "position_budget",
]
