"""The model runner: executes the target for the engine's step over the slots the scheduler
chose. It builds each pass's inputs, runs the prefill chunks and the verify pass through a
cache view of those slots (``Cache.select``: no copy when they are contiguous), and commits what
the engine keeps."""

from __future__ import annotations

import torch

from quickdraft.drafters.base import Batch, Draft, Needs, StepResult
from quickdraft.engine.scheduler import Prefill, Rows
from quickdraft.models.base import Cache, FeatureModel, Model, ModelOutput, Slots
from quickdraft.tree import TreeShape


class ModelRunner:
    """Runs ``target`` over ``cache``, reading the prompts from the engine's tables ``rows``;
    ``needs``: what the drafter reads of each verify pass."""

    def __init__(self, target: Model, cache: Cache, rows: Rows, needs: Needs):
        self.target, self.cache, self.rows, self.needs = target, cache, rows, needs

    def reset(self, slots: Slots, cached: torch.Tensor) -> None:
        """New requests took these slots: their cache rows keep the first ``cached`` [B]
        entries (a prefix the last request there left, the same tokens; 0 without prefix
        caching); the pointers go there, and what lies past them is scratch."""
        self.cache.lengths[slots.index.to(self.cache.lengths.device)] = cached.to(
            self.cache.lengths.device
        )

    def prefill(self, plan: Prefill) -> ModelOutput:
        """One chunk of every prompt in ``plan``, in one forward of the target (rows padded to
        the longest chunk; padding is written past each row's length and never committed).
        Nothing reads a prefill's logits (a prompt's last token is verified as the first
        pending one), so a model with a separate head (``FeatureModel``) runs without it: the
        head is a sixth of a 1.5B's arithmetic per token. Its logits are then empty."""
        device = self.rows.device
        index = plan.slots.index
        starts = torch.tensor(plan.starts, device=device)  # what each slot has cached
        positions = starts.unsqueeze(1) + torch.arange(max(plan.counts), device=device)
        last = self.rows.tokens.shape[1] - 1
        tokens = self.rows.tokens[index.unsqueeze(1), positions.clamp_max(last)]
        view = self.cache.select(plan.slots)
        if isinstance(self.target, FeatureModel):
            hidden, taps = self.target.body(tokens, positions, view)
            out = ModelOutput(hidden.new_empty(0), hidden, taps)
        else:
            out = self.target.forward(tokens, positions, view)
        view.commit(torch.tensor(plan.counts, device=device))
        return out

    def verify(self, batch: Batch, draft: Draft) -> ModelOutput:
        """The verify pass over [pending token, draft nodes, side branch] of every row."""
        tokens, positions, mask = verify_inputs(batch, draft)
        return self.target.forward(tokens, positions, self.cache.select(batch.slots), mask)

    def commit(
        self, slots: Slots, draft: Draft, path: torch.Tensor, num_accepted: torch.Tensor
    ) -> torch.Tensor:
        """Keep the pending token and the accepted nodes (``path`` [B, D], -1 past
        num_accepted [B]) of the last verify pass in the cache. Returns kept [B, D + 1], the
        verify-input index of the pending token and the accepted nodes."""
        root = torch.zeros(path.shape[0], 1, dtype=torch.long, device=path.device)
        kept = torch.cat([root, path.clamp_min(0) + 1], 1)
        view = self.cache.select(slots)
        if draft.tree is None and draft.side is None:
            view.commit(num_accepted + 1)
        else:
            view.commit_path(kept, num_accepted + 1)
        return kept

    def result(
        self,
        batch: Batch,
        draft: Draft,
        out: ModelOutput,
        kept: torch.Tensor,
        num_accepted: torch.Tensor,
    ) -> StepResult:
        """What the drafter observes of the verify pass ``out`` over ``draft``: the features it
        declared at the kept positions (``commit``'s), and the side branch's logits."""
        needs, nodes = self.needs, draft.tokens.shape[1] + 1
        if nodes == 1:  # nothing drafted: the pending token's position, kept by every row
            hidden = out.hidden[:, :1] if needs.hidden else None
            taps = {layer: out.taps[layer][:, :1] for layer in needs.taps}
        else:
            rows = torch.arange(batch.size, device=kept.device).unsqueeze(1)
            hidden = out.hidden[rows, kept] if needs.hidden else None
            taps = {layer: out.taps[layer][rows, kept] for layer in needs.taps}
        side = out.logits[:, nodes:] if out.logits.shape[1] > nodes else None
        return StepResult(batch, num_accepted + 1, hidden, taps, num_accepted, side)


def verify_inputs(
    batch: Batch, draft: Draft
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(tokens [B, T], positions [B, T], tree mask [T, T] or None for causal) of the verify
    pass over [pending token, draft nodes, side branch]. A tree attends along its branches; a
    side branch sees the pending token and itself, and no draft node sees it."""
    device = batch.tokens.device
    pending = batch.tokens.gather(1, (batch.lengths - 1).unsqueeze(1))
    tokens = [pending, draft.tokens.to(device)]
    tree, side = draft.tree, draft.side
    if side is not None and tree is None:
        tree = TreeShape.chain(draft.tokens.shape[1])
    offsets = torch.arange(1 + draft.tokens.shape[1]) if tree is None else tree.position_offsets
    mask = None if tree is None else tree.mask
    if side is not None:
        assert mask is not None
        tokens.append(side.tokens.to(device))
        offsets = torch.cat([offsets, side.offsets])
        mask = with_side(mask, side.mask)
    positions = (batch.lengths - 1).unsqueeze(1) + offsets.to(device)
    return torch.cat(tokens, 1), positions, None if mask is None else mask.to(device)


def with_side(tree_mask: torch.Tensor, side_mask: torch.Tensor) -> torch.Tensor:
    """[1 + N + E]^2: the draft's tree mask, then the side branch, which sees the pending
    token (index 0) and its own tokens as ``side_mask`` says; the draft never sees it."""
    nodes, extra = tree_mask.shape[0], side_mask.shape[0]
    mask = torch.zeros(nodes + extra, nodes + extra, dtype=torch.bool)
    mask[:nodes, :nodes] = tree_mask
    mask[nodes:, 0] = True
    mask[nodes:, nodes:] = side_mask
    return mask
