"""Vocabulary shortlists for a drafter's output head.

A drafter's head costs O(|V| d) per token; with 150k-token vocabularies that is a large share of
a small drafter's step. A shortlist computes logits for a subset S of the rows only. The draft
distribution is then the drafter's softmax renormalised over S and zero elsewhere, while the
target still verifies over the full vocabulary, so speculative decoding stays exact: rejection
sampling is exact for any draft distribution q, including one with a restricted support.

The head is split once into row *segments*, each prepacked like any other weight
(``ops.draft_linear``: oneDNN fp32, or quantized), so the logits of a union of segments cost
only those rows: one small product per segment, no gather of weights per step.

* ``FrequencyShortlist`` (FR-Spec): the K most frequent tokens of a corpus, a fixed K or a
  per-position K(t). The ranked list is cut into nested segments, so every K(t) is a prefix.
* ``ClusterShortlist`` (DynaSpec): the vocabulary is split into M clusters of head rows
  (``clusters.spherical_kmeans``); a router scores the clusters from [E(x_t), h_{t-1}] and the
  shortlist is the union of the top k_c(t) clusters, a fixed k_c (DynaSpec-F) or the
  position-aware k_c(t) of ``position_budget`` (DynaSpec-PA).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from quickdraft.artifacts import ArtifactError, read_safetensors, write_safetensors
from quickdraft.models.ops import draft_linear, side_by_side
from quickdraft.vocab.router import Router


def position_budget(k_max: int, position: int) -> int:
    """DynaSpec's position-aware budget: k_max for draft positions 0 and 1, then
    floor(k_max / ((t + 1) * 2)), never below 1 (a shortlist must hold a token)."""
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max}")
    if position < 2:
        return k_max
    return max(1, k_max // ((position + 1) * 2))


class SegmentedHead:
    """An output head cut into row segments: logits for any union of segments."""

    def __init__(self, weight: torch.Tensor, segments: Sequence[torch.Tensor], int8: bool):
        self.segments = [s.long() for s in segments]
        if any(s.numel() == 0 for s in self.segments):
            raise ValueError("segments: every segment needs at least one row")
        self.linears = [draft_linear(weight[s], quantize=int8) for s in self.segments]
        self._ids: dict[tuple[int, ...], torch.Tensor] = {}

    def logits(
        self, hidden: torch.Tensor, chosen: Sequence[int], cache_ids: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids [S], logits [B, S]) for the rows of the ``chosen`` segments.
        ``cache_ids`` keeps the id list of this choice (for static shortlists)."""
        key = tuple(chosen)
        ids = self._ids.get(key)
        if ids is None:
            ids = torch.cat([self.segments[i] for i in key])
            if cache_ids:
                self._ids[key] = ids
        logits = side_by_side(hidden, [self.linears[i] for i in key])
        return ids, logits.float()


class Shortlist:
    """Base: binds to a drafter's head, chooses rows per draft position, keeps size stats."""

    name = "shortlist"

    def __init__(self) -> None:
        self.head: SegmentedHead | None = None
        self.vocab_size = 0
        self.reset_stats()

    def bind(self, weight: torch.Tensor, embed: torch.Tensor, vocab_size: int, int8: bool) -> None:
        """Pack the head rows. ``vocab_size`` is the target's: rows past it (padding of the
        drafter's checkpoint) are never drafted."""
        raise NotImplementedError

    @property
    def uses_context(self) -> bool:
        """Whether ``begin``/``extend`` matter: the shortlist adds the sequence's tokens."""
        return False

    def begin(self, prompt: torch.Tensor) -> None:
        """Called once per request with the prompt's token ids [B, L]."""

    def extend(self, tokens: torch.Tensor) -> None:
        """Called before each draft step with the tokens the sequence gained since [B, n]."""

    def prepare(self, position: int, tokens: torch.Tensor, prev_hidden: torch.Tensor) -> None:
        """Called before the drafter's body runs on ``tokens`` [B] at draft ``position``;
        ``prev_hidden`` [B, d] is its hidden state at the previous position."""
        self._position = position

    def logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [S], logits [B, S]) at the prepared position from the final hidden [B, d]."""
        raise NotImplementedError

    # -- statistics ---------------------------------------------------------------------

    def reset_stats(self) -> None:
        self._size_sum: dict[int, int] = {}
        self._calls: dict[int, int] = {}

    def _record(self, position: int, size: int) -> None:
        self._size_sum[position] = self._size_sum.get(position, 0) + size
        self._calls[position] = self._calls.get(position, 0) + 1

    def mean_size(self) -> float:
        calls = sum(self._calls.values())
        return sum(self._size_sum.values()) / calls if calls else float("nan")

    def mean_size_by_position(self) -> list[float]:
        return [self._size_sum[t] / self._calls[t] for t in sorted(self._calls)]

    def _check_bound(self) -> SegmentedHead:
        if self.head is None:
            raise RuntimeError(f"{self.name}: bind() the shortlist to a drafter's head first")
        return self.head


class FrequencyShortlist(Shortlist):
    """FR-Spec: the most frequent tokens first; ``sizes[t]`` tokens at draft position t (the
    last entry repeats). One size is FR-Spec; a decreasing schedule is FR-Spec-PA."""

    def __init__(self, ranked: torch.Tensor, sizes: Sequence[int], name: str = "fr-spec"):
        super().__init__()
        if not sizes or any(int(s) < 1 for s in sizes):
            raise ValueError(f"sizes must be positive token counts, got {list(sizes)}")
        self.ranked = ranked.long()
        self.sizes = tuple(int(s) for s in sizes)
        self.name = name
        self._position = 0

    @classmethod
    def position_aware(
        cls, ranked: torch.Tensor, max_size: int, num_positions: int
    ) -> FrequencyShortlist:
        """Sizes on DynaSpec's position-aware schedule, in tokens instead of clusters."""
        sizes = [position_budget(max_size, t) for t in range(num_positions)]
        return cls(ranked, sizes, name="fr-spec-pa")

    def bind(self, weight: torch.Tensor, embed: torch.Tensor, vocab_size: int, int8: bool) -> None:
        ranked = self.ranked[(self.ranked < vocab_size) & (self.ranked < weight.shape[0])]
        bounds = sorted({min(s, ranked.numel()) for s in self.sizes})
        starts = [0, *bounds[:-1]]
        segments = [ranked[a:b] for a, b in zip(starts, bounds, strict=True)]
        self.head = SegmentedHead(weight, segments, int8)
        self._segments_for = {b: bounds.index(b) + 1 for b in bounds}
        self._bounded = [min(s, ranked.numel()) for s in self.sizes]
        self.vocab_size = vocab_size

    def logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        head = self._check_bound()
        size = self._bounded[min(self._position, len(self._bounded) - 1)]
        ids, logits = head.logits(hidden, range(self._segments_for[size]), cache_ids=True)
        self._record(self._position, ids.numel())
        return ids, logits


class ClusterShortlist(Shortlist):
    """DynaSpec: the union of the router's top clusters. ``position_aware`` uses
    ``position_budget(k_max, t)`` clusters at draft position t, otherwise k_max everywhere.

    Two additions to the paper, both measured in benchmarks/results/shortlists: tokens whose
    ``assignment`` is -1 form a *core* (the most frequent tokens) that is always in the
    shortlist, and with ``context`` the sequence's own tokens (prompt and output so far) are
    always in it too (rare words and identifiers of the prompt are the tokens a reply copies
    and a static list misses). ``route=False`` leaves the routed clusters out: the core and
    the context alone, for ablations.
    Every token appears in exactly one part, so the draft distribution over the union is a
    plain softmax.

    With a batch, each row's top clusters (and prompt tokens) are joined into one shortlist,
    still exact: any support shared by a whole draft step is. The budget is per row: a batch,
    or a tree level of W nodes (EAGLE), routes B x W rows at once and scores the union, which
    at deep levels of a wide tree can approach the whole vocabulary. ``parallel`` runs the router on
    a second thread while the drafter's body runs."""

    def __init__(
        self,
        assignment: torch.Tensor,
        router: Router,
        k_max: int,
        position_aware: bool = True,
        parallel: bool = False,
        context: bool = False,
        route: bool = True,
    ):
        super().__init__()
        if not route and not context and int((assignment == -1).sum()) == 0:
            raise ValueError(
                "shortlist: 0 clusters routes nothing, and these artifacts have no core of "
                "frequent tokens (dyna-hybrid:0 adds the sequence's tokens)"
            )
        num_clusters = router.config.num_clusters
        if assignment.dim() != 1 or int(assignment.max()) >= num_clusters:
            raise ValueError(
                f"assignment: expected cluster ids below the router's {num_clusters} clusters"
            )
        if int(assignment.min()) < -1:
            raise ValueError("assignment: -1 marks the core, other ids must be >= 0")
        if not 1 <= k_max <= num_clusters:
            raise ValueError(f"k_max must be in 1..{num_clusters}, got {k_max}")
        self.assignment = assignment.long()
        self.router = router.eval()
        self.k_max = k_max
        self.position_aware = position_aware
        self.context = context
        self.route = route  # False: the core and the context only (an ablation)
        self.name = ("dynaspec-hybrid" if context else "dynaspec") + (
            "-pa" if position_aware else "-f"
        )
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="router") if parallel else None
        self._pending: Future | list[int] | None = None
        self._context_ids = torch.empty(0, dtype=torch.long)

    def bind(self, weight: torch.Tensor, embed: torch.Tensor, vocab_size: int, int8: bool) -> None:
        usable = min(vocab_size, weight.shape[0])
        if self.assignment.numel() < usable:
            raise ValueError(
                f"assignment: covers {self.assignment.numel()} tokens, the drafter has {usable}"
            )
        assignment = self.assignment[:usable]
        members = [
            torch.nonzero(assignment == c).flatten() for c in range(self.router.config.num_clusters)
        ]
        core = torch.nonzero(assignment == -1).flatten()
        # Empty clusters (possible after cutting padded rows) are never chosen.
        self._valid = torch.tensor([m.numel() > 0 for m in members])
        self._has_core = core.numel() > 0
        first = 1 if self._has_core else 0  # segment 0 is the core when there is one
        # Per draft level the router's choice is a handful of ids: kept on the host as lists.
        self._segment_of = (torch.cumsum(self._valid.long(), 0) - 1 + first).tolist()
        self._num_valid, self._all_valid = int(self._valid.sum()), bool(self._valid.all())
        segments = ([core] if self._has_core else []) + [m for m in members if m.numel() > 0]
        self.head = SegmentedHead(weight, segments, int8)
        self.weight, self.embed = weight, embed
        self.router.to(embed.device)  # it reads embeddings and states where the drafter runs
        self._scorer = self.router.packed()
        self.vocab_size = vocab_size
        self._usable_assignment = assignment

    def begin(self, prompt: torch.Tensor) -> None:
        self._context_ids = torch.empty(0, dtype=torch.long)
        self._context_rows = self.weight[:0].float()
        self._context_clusters = torch.empty(0, dtype=torch.long)
        self._in_context = torch.zeros(self._usable_assignment.numel(), dtype=torch.bool)
        self.extend(prompt)

    def extend(self, tokens: torch.Tensor) -> None:
        """Adds tokens of the sequence (prompt, then accepted output) to the context part."""
        if not self.context:
            return
        ids = tokens.flatten().unique().cpu()  # the tables below live on the host
        ids = ids[(ids >= 0) & (ids < self._usable_assignment.numel())]
        # Core tokens are always in; tokens already in the context stay once.
        ids = ids[(self._usable_assignment[ids] >= 0) & ~self._in_context[ids]]
        if ids.numel() == 0:
            return
        self._in_context[ids] = True
        self._context_ids = torch.cat([self._context_ids, ids])
        rows = self.weight[ids.to(self.weight.device)].float()
        self._context_rows = torch.cat([self._context_rows, rows])
        self._context_clusters = torch.cat([self._context_clusters, self._usable_assignment[ids]])

    @property
    def uses_context(self) -> bool:
        return self.context

    def budget(self, position: int) -> int:
        return position_budget(self.k_max, position) if self.position_aware else self.k_max

    def prepare(self, position: int, tokens: torch.Tensor, prev_hidden: torch.Tensor) -> None:
        self._position = position
        if not self.route:
            self._pending = []
        elif self._pool is not None:
            self._pending = self._pool.submit(self._route, position, tokens, prev_hidden)
        else:
            self._pending = self._route(position, tokens, prev_hidden)

    @torch.inference_mode()
    def _route(self, position: int, tokens: torch.Tensor, prev_hidden: torch.Tensor) -> list[int]:
        """Clusters (router ids, sorted) chosen for this step."""
        embedding = self.embed[tokens.to(self.embed.device)].float()
        scores = self._scorer(embedding, prev_hidden.float().to(embedding.device)).cpu()
        if not self._all_valid:
            scores[:, ~self._valid] = float("-inf")
        k = min(self.budget(position), self._num_valid)
        return sorted(set(scores.topk(k, dim=-1).indices.flatten().tolist()))

    def logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        head = self._check_bound()
        if self._pending is None:
            raise RuntimeError("prepare() must run before logits()")
        pending, self._pending = self._pending, None
        clusters = pending.result() if isinstance(pending, Future) else pending
        segments = ([0] if self._has_core else []) + [self._segment_of[c] for c in clusters]
        if segments:
            ids, logits = head.logits(hidden, segments)
        else:  # route=False without a core: the context alone
            ids = torch.empty(0, dtype=torch.long)
            logits = hidden.new_zeros(hidden.shape[0], 0, dtype=torch.float32)
        if self._context_ids.numel():
            # The sequence's tokens outside the chosen clusters. Logits of all context rows in
            # one product (a few hundred rows), then those of chosen clusters are dropped: no
            # copy of weight rows per step.
            chosen = torch.zeros(self._valid.numel(), dtype=torch.bool)
            chosen[clusters] = True
            extra = ~chosen[self._context_clusters]
            if bool(extra.any()):
                context_logits = hidden.float() @ self._context_rows.T.to(hidden.device)
                ids = torch.cat([ids, self._context_ids[extra]])
                logits = torch.cat([logits, context_logits[:, extra]], dim=-1)
        self._record(self._position, ids.numel())
        return ids, logits


# -- artifacts ----------------------------------------------------------------------------

FREQUENCY_FILE = "frequency.safetensors"
CLUSTERS_FILE = "clusters.safetensors"


def save_frequency(folder: str | Path, frequency: torch.Tensor, settings: dict) -> None:
    """Token frequencies [V]; the ranked list is derived from them (ties by token id)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    metadata = {"settings": json.dumps(settings)}
    write_safetensors(Path(folder) / FREQUENCY_FILE, {"frequency": frequency.float()}, metadata)


def load_frequency(folder: str | Path) -> torch.Tensor:
    """The token frequencies [V] saved in ``folder``."""
    path = Path(folder) / FREQUENCY_FILE
    if not path.exists():
        raise ValueError(f"shortlist: no {FREQUENCY_FILE} in {folder}")
    remedy = "rebuild the shortlist or copy the folder again"
    frequency = read_safetensors(path, remedy).get("frequency")
    if frequency is None or frequency.dim() != 1:
        raise ArtifactError(path, "holds no [V] frequency tensor", remedy)
    return frequency


def load_ranked(folder: str | Path) -> torch.Tensor:
    frequency = load_frequency(folder)
    # Stable sort: equal frequencies keep token-id order, so the list is reproducible.
    return torch.sort(-frequency, stable=True).indices


def save_clusters(folder: str | Path, assignment: torch.Tensor, settings: dict) -> None:
    """Cluster id of every token, -1 for the always-included core."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    metadata = {"settings": json.dumps(settings)}
    write_safetensors(
        Path(folder) / CLUSTERS_FILE, {"assignment": assignment.to(torch.int16)}, metadata
    )


def load_clusters(folder: str | Path) -> torch.Tensor:
    path = Path(folder) / CLUSTERS_FILE
    if not path.exists():
        raise ValueError(f"shortlist: no {CLUSTERS_FILE} in {folder}")
    remedy = "rebuild the shortlist or copy the folder again"
    assignment = read_safetensors(path, remedy).get("assignment")
    if assignment is None or assignment.dim() != 1:
        raise ArtifactError(path, "holds no [V] assignment tensor", remedy)
    return assignment.long()
