"""Drafter output-head shortlists: frequency (FR-Spec) and context-aware clusters (DynaSpec).

``ShortlistChoice`` (``vocab.choice``) reads the command line's and the config's shortlist
strings:

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

from quickdraft.vocab.choice import FULL, KINDS, ShortlistChoice, as_shortlist
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
    choice: ShortlistChoice | str,
    folder: str | Path,
    num_positions: int,
    parallel_router: bool = False,
) -> Shortlist | None:
    """The shortlist ``choice`` names with artifacts from ``folder``; None for ``full``."""
    choice = as_shortlist(choice)
    kind, size = choice.kind, choice.size
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


def shortlist_for(
    choice: ShortlistChoice,
    folder: str | Path | None,
    head_model: str | None,
    positions: int,
    inputs: str = "hidden",
    shipped: Path | None = None,
) -> Shortlist | None:
    """A drafter head's shortlist, or None for the full head. Its artifacts are ``folder``
    (the ``shortlist_dir`` option), else ``shipped`` when it exists (an EAGLE drafter's own
    folder), else those shipped for ``head_model``: the model whose LM head is shortlisted
    (the draft model's, or the target's for Medusa and EAGLE, which score the target's own
    head rows). A DynaSpec router must have learnt from the states this drafter hands it
    (``inputs``): a draft model's or the target's hidden states, or an EAGLE drafter's
    features; the widths match either way, so this is checked by name."""
    if choice.full:
        return None
    if folder is None and shipped is not None and shipped.is_dir():
        folder = shipped
    else:
        folder = artifact_folder(head_model, folder)
    shortlist = build_shortlist(choice, folder, positions)
    if isinstance(shortlist, ClusterShortlist) and shortlist.router.inputs != inputs:
        raise ValueError(
            f"shortlist_dir: the router in {folder} learnt from {shortlist.router.inputs} "
            f"states, this drafter gives it {inputs} states; train one with quickdraft train "
            "router" + (" --eagle-dir" if inputs == "eagle" else "")
        )
    return shortlist


__all__ = [
    "ARTIFACTS",
    "FULL",
    "KINDS",
    "ClusterShortlist",
    "FrequencyShortlist",
    "Router",
    "RouterConfig",
    "SegmentedHead",
    "Shortlist",
    "ShortlistChoice",
    "artifact_folder",
    "as_shortlist",
    "build_shortlist",
    "position_budget",
    "shortlist_for",
]
