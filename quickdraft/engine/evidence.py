"""What each request's drafts landed: the per-request half of draft sizing's evidence (what
holds for the host and drafter is ``engine.learned``), and the chance of each draft node's
acceptance it gives (``engine.goodput``'s module docstring).

Per slot: accepted drafts against rejections (a running acceptance alpha, p = alpha ** depth),
the tokens scored drafts landed against what their scores promised (the scale of a drafter's
own scores), and a refused judged draft waiting for the text to say what it would have landed
(its ``Shadow``). A slot's evidence lives as long as its request (``begin``).
"""

from __future__ import annotations

import dataclasses

import torch

from quickdraft.drafters.base import Batch, Draft

DECAY = 0.9  # per step a request drafts: its older evidence weighs less
PRIOR = 1.0  # pseudo-counts of accepted and rejected drafts a request starts with


def clean(scores: torch.Tensor) -> torch.Tensor:
    """A drafter's scores as probabilities on the host: NaN (an overflow) as 0, within [0, 1]."""
    return torch.nan_to_num(scores.detach().double().cpu(), nan=0.0).clamp(0.0, 1.0)


@dataclasses.dataclass(slots=True)
class Shadow:
    """A refused draft's row (``RequestEvidence.shadow``): its first token's position in the
    row's text, its nodes' indices in the draft and (token, parent index) pairs, and the
    tokens its scores promised."""

    start: int
    index: list[int]
    nodes: list[tuple[int, int]]
    promised: float

    def landed(self, text: list[int]) -> int | None:
        """The draft's accepted length had ``text`` (the tokens from ``start`` on) been the
        target's, or None while the text is too short to tell."""
        at, depth = -1, 0  # the node reached (-1: the root), its depth
        for token in text:
            children = [
                self.index[j] for j, (t, parent) in enumerate(self.nodes)
                if parent == at and t == token
            ]  # fmt: skip
            if not children:
                return depth
            at, depth = children[0], depth + 1
            if not any(parent == at for _, parent in self.nodes):
                return depth
        return None


class RequestEvidence:
    """The evidence of the requests in an engine's ``rows`` slots (module docstring)."""

    def __init__(self, rows: int):
        self.accepted = [PRIOR] * rows
        self.rejected = [PRIOR] * rows
        self.landed = [PRIOR] * rows  # tokens scored drafts landed ...
        self.promised = [PRIOR] * rows  # ... against what their scores promised
        self.shadows: list[Shadow | None] = [None] * rows

    def begin(self, slots: list[int]) -> None:
        """New requests took these slots: they start from the prior."""
        for slot in slots:
            self.accepted[slot] = self.rejected[slot] = PRIOR
            self.landed[slot] = self.promised[slot] = PRIOR
            self.shadows[slot] = None

    def alpha(self, slot: int) -> float:
        accepted = self.accepted[slot]
        return accepted / (accepted + self.rejected[slot])

    def acceptance(self, draft: Draft, slots: list[int]) -> list[float]:
        """[N] each node's chance of acceptance, summed over the rows: the tokens it is
        expected to give. A drafter's own scores, scaled per request by what its drafts
        landed against what their scores promised; else alpha ** depth. On the host: the
        sizing is decided there."""
        nodes = draft.tokens.shape[1]
        if draft.scores is not None:
            found = [0.0] * nodes
            table = draft.scores.tolist()  # host sync
            for slot, row in zip(slots, table, strict=True):
                scale = self.landed[slot] / self.promised[slot]
                for i, score in enumerate(row):
                    if score > 0.0:  # NaN (an overflow) and below: 0
                        found[i] += min(scale * min(score, 1.0), 1.0)
            return found
        depth = range(1, nodes + 1) if draft.tree is None else draft.tree.depth.tolist()
        alphas = [self.alpha(slot) for slot in slots]
        return [sum(alpha**d for alpha in alphas) for d in depth]

    def observe(self, slots: list[int], draft: Draft, accepted: list[int]) -> None:
        """A step verified ``draft`` (as cut, at least one level deep) for the rows in
        ``slots``, which accepted ``accepted`` of its nodes."""
        depth = draft.depth
        promised = None
        if draft.scores is not None:
            promised = clean(draft.scores).sum(1).tolist()
        for b, (slot, count) in enumerate(zip(slots, accepted, strict=True)):
            self.accepted[slot] = self.accepted[slot] * DECAY + count
            self.rejected[slot] = self.rejected[slot] * DECAY + (count < depth)
            if promised is not None:
                self.landed[slot] = self.landed[slot] * DECAY + count
                self.promised[slot] = self.promised[slot] * DECAY + promised[b]

    def shadow(self, draft: Draft, batch: Batch, slots: list[int]) -> None:
        """Keep a refused draft's rows (a row's real nodes: those scored above 0) to learn what
        they would have landed from the tokens that come next (``resolve``). Without it a
        request whose first drafts missed stays refused: refused drafts are never verified,
        so what its drafts land would never rise again (suffix decoding on SmolLM2's code
        drafted 5% of its steps, 1.06 tokens a forward, after one miss took the request's
        scale to 0.43). A slot's older shadow, still waiting, stays."""
        if draft.scores is None:
            return
        scores = clean(draft.scores).tolist()
        tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
        starts = batch.lengths.tolist()
        for b, slot in enumerate(slots):
            if self.shadows[slot] is not None:
                continue
            real = [i for i, score in enumerate(scores[b]) if score > 0.0]
            if real:
                promised = sum(scores[b][i] for i in real)
                nodes = [(tokens[b][i], parents[i]) for i in real]
                self.shadows[slot] = Shadow(starts[b], real, nodes, promised)

    def resolve(self, batch: Batch, slots: list[int]) -> None:
        """Each shadow whose fate the text now tells (a token off its tree, or a leaf
        reached) counts as a verified draft would: the tokens it would have landed against
        its scores. Unbiased where a draft's tokens are point masses (lookup, suffix
        decoding): the target accepts such a token with its probability, which is the chance
        the text goes on with it."""
        if not any(self.shadows[slot] is not None for slot in slots):
            return
        lengths = batch.lengths.tolist()
        for b, slot in enumerate(slots):
            shadow = self.shadows[slot]
            if shadow is None or lengths[b] <= shadow.start:
                continue
            text = batch.tokens[b, shadow.start : lengths[b]].tolist()
            landed = shadow.landed(text)
            if landed is not None:
                self.shadows[slot] = None
                self.landed[slot] = self.landed[slot] * DECAY + landed
                self.promised[slot] = self.promised[slot] * DECAY + shadow.promised
