"""Medusa (Cai et al. 2024): extra heads on the target itself draft a tree of candidates.

Head i reads the target's final hidden state h_t at the token before the pending one and
predicts the token i places after the pending one (t + 1 + i): a stack of residual blocks
x + SiLU(W x + b), then the target's own LM head (or, with ``own_head``, a head of its own).
The blocks start at zero, so an untrained head repeats the target's next-token prediction.

The draft is a tree (``tree.TreeShape``): a node at depth d with sibling rank r holds head d's
r-th most likely token. Candidates are deterministic (point masses), which the tree rules accept
exactly (``accept.tree_rejection_sampling``). The heads cost one extra pass of the LM head for
all of them together: their states are stacked into one product.
"""

from __future__ import annotations

from pathlib import Path

import torch

from quickdraft.config import MAX_TREE_DEPTH, SpecConfig
from quickdraft.drafters.base import (
    Batch,
    BuildContext,
    Draft,
    Needs,
    ShortlistContext,
    StepResult,
)
from quickdraft.drafters.medusa.net import (
    MedusaHeads,
    heads_folder,
    load_heads,
)
from quickdraft.drafters.medusa.options import MedusaOptions
from quickdraft.drafters.medusa.tree import MedusaTree, default_tree, parse_tree
from quickdraft.models.base import FeatureModel, Model
from quickdraft.models.ops import Linear, draft_linear
from quickdraft.tree import TreeShape
from quickdraft.vocab import shortlist_for
from quickdraft.vocab.shortlist import Shortlist


class MedusaDrafter:
    """Drafts a tree from Medusa heads over the target's final hidden state at the token
    before the pending one, kept per row from the last target pass. Needs a feature model
    (the native runner) for the target's LM head."""

    def __init__(
        self,
        target: Model,
        heads: MedusaHeads,
        tree: TreeShape | None = None,
        *,
        int8: bool = False,
        shortlist: Shortlist | None = None,
    ):
        config = heads.config
        if not isinstance(target, FeatureModel):
            raise ValueError(
                "target: Medusa heads need the native runner's LM head, got "
                f"{type(target).__name__}"
            )
        hidden_size = target.head_weight.shape[1]
        if hidden_size != config.hidden_size:
            raise ValueError(
                f"medusa: heads of hidden size {config.hidden_size} do not fit the target's "
                f"{hidden_size}"
            )
        tree = tree or default_tree(config.num_heads)
        if tree.max_depth > config.num_heads:
            raise ValueError(
                f"tree: {tree.max_depth} levels deep, the heads predict only {config.num_heads}"
            )
        self.target: FeatureModel = target
        self.heads, self.tree = heads.eval().to(target.device), tree
        int8 = int8 and target.device.type == "cpu"  # the int8 kernels are the CPU's
        # Heads trained on a frequent-token subset rank those rows only: a packed head of them.
        self._subset: tuple[torch.Tensor, Linear] | None = None
        if heads.vocab is not None and heads.lm_heads is None:
            vocab = heads.vocab.to(target.device)  # a plain attribute: .to() leaves it
            rows = target.head_weight[vocab].float().contiguous()
            self._subset = (vocab, draft_linear(rows, quantize=int8))
        self.vocab_size = target.vocab_size
        # A shortlist scores its rows of the target's head for each head (depth) instead.
        self.shortlist, self.shortlist_context = shortlist, None
        if shortlist is not None:
            if heads.lm_heads is not None:
                raise ValueError("shortlist: these Medusa heads have LM heads of their own")
            shortlist.bind(target.head_weight, target.embed, self.vocab_size, int8)
            if shortlist.uses_context:  # the hybrid DynaSpec kinds add the sequence's tokens
                self.shortlist_context = ShortlistContext(shortlist)
        self.num_tokens = tree.num_nodes
        self.needs = Needs(tokens=tree.num_nodes, depth=tree.max_depth, hidden=True)
        # Candidates needed: the widest rank at any depth, plus one; node n takes candidate
        # ranks[n] of head depth[n].
        self._width = int(tree.ranks.max()) + 1 if tree.num_nodes else 1
        self._hidden = torch.zeros(0, config.hidden_size)  # [rows, D] per row

    def reserve(self, rows: int, capacity: int) -> None:
        self._hidden = torch.zeros(rows, self.heads.config.hidden_size, device=self.target.device)
        if self.shortlist_context is not None:
            self.shortlist_context.reserve(rows, self.target.device)

    def begin(self, start: StepResult) -> None:
        """The heads read the prefill's last state (zeros for a one-token prompt: its first
        draft is a guess, verified like any other)."""
        start.batch.slots.put(self._hidden, _last_kept(start, self._hidden))
        if self.shortlist_context is not None:
            self.shortlist_context.begin(start.batch)

    def release(self, slot: int, completed: bool) -> None:
        """Nothing to do: the slot's next ``begin`` overwrites its state."""

    def observe(self, result: StepResult) -> None:
        result.batch.slots.put(self._hidden, _last_kept(result, self._hidden))

    @property
    def head_rows(self) -> int:
        """Vocabulary rows its heads score a draft token (the target's whole head)."""
        return self.vocab_size

    def describe(self) -> str:
        return f"tree of {self.needs.tokens} nodes, depth {self.needs.depth}"

    @torch.inference_mode()
    def propose(self, batch: Batch) -> Draft:
        tree = self.tree
        hidden = batch.slots.take(self._hidden)
        states = self.heads(hidden.float())[:, : tree.max_depth]  # [B, D, d]
        if self.shortlist is not None:
            candidates = self._shortlisted(batch, hidden, states)
        elif self._subset is not None:
            vocab, head = self._subset
            candidates = vocab[head(states).topk(self._width, dim=-1).indices]  # [B, D, W]
        else:
            if self.heads.lm_heads is None:
                dtype = self.target.head_weight.dtype
                logits = self.target.head(states.to(dtype)).float()  # all heads at once
            else:
                logits = self.heads.logits(states, torch.empty(0))
            candidates = logits[..., : self.vocab_size].topk(self._width, dim=-1).indices
        tokens = candidates[:, tree.depth - 1, tree.ranks]  # [B, N]
        return Draft(tokens, None, tree)

    def _shortlisted(
        self, batch: Batch, hidden: torch.Tensor, states: torch.Tensor
    ) -> torch.Tensor:
        """[B, D, W] candidates, head d ranking its shortlist's rows at draft position d. The
        router reads the pending token and the target's state that every head reads."""
        assert self.shortlist is not None
        if self.shortlist_context is not None:
            self.shortlist_context.catch_up(batch)
        pending = batch.tokens.gather(1, (batch.lengths - 1).unsqueeze(1)).squeeze(1)
        columns = []
        for depth in range(states.shape[1]):
            self.shortlist.prepare(depth, pending, hidden.float())
            ids, logits = self.shortlist.logits(states[:, depth])
            top = logits.topk(min(self._width, ids.numel()), dim=-1).indices
            chosen = ids.to(top.device)[top]  # [B, <= W]
            if chosen.shape[1] < self._width:  # a shortlist smaller than W: repeat the best
                chosen = torch.cat(
                    [chosen, chosen[:, :1].expand(-1, self._width - chosen.shape[1])], 1
                )
            columns.append(chosen)
        return torch.stack(columns, 1)


def _last_kept(result: StepResult, like: torch.Tensor) -> torch.Tensor:
    """[B, D] each row's hidden state at its last kept token; zeros where none was kept."""
    assert result.hidden is not None, "Needs.hidden brings the target's hidden states"
    if result.hidden.shape[1] == 0:
        return torch.zeros(result.batch.size, like.shape[1], device=like.device)
    rows = torch.arange(result.batch.size, device=result.hidden.device)
    last = result.hidden[rows, (result.kept - 1).clamp_min(0)].to(like)
    return torch.where((result.kept > 0).unsqueeze(1), last, 0.0)


def build_medusa(
    target: Model,
    folder: str | Path,
    tree: MedusaTree | str | None = None,
    *,
    int8: bool = False,
    shortlist: Shortlist | None = None,
) -> MedusaDrafter:
    """A drafter from the heads saved in ``folder``; ``tree`` as in ``parse_tree``; ``int8``:
    quantized weights for the rows of a frequent-token head on CPU; ``shortlist``: each head
    ranks that shortlist's rows of the target's head instead."""
    heads = load_heads(folder)
    if heads.config.vocab_size != target.vocab_size:
        raise ValueError(
            f"medusa_dir: heads trained for a vocabulary of {heads.config.vocab_size}, the "
            f"target has {target.vocab_size}"
        )
    shape = parse_tree(tree, heads.config.num_heads, heads.rank_accuracy)
    return MedusaDrafter(target, heads, shape, int8=int8, shortlist=shortlist)


def build(spec: SpecConfig, context: BuildContext) -> MedusaDrafter:
    """The registry's builder: ``spec.options`` are ``MedusaOptions``."""
    options = spec.options
    assert isinstance(options, MedusaOptions)
    folder = heads_folder(context.target_name, options.medusa_dir)
    shortlist = shortlist_for(  # a shortlist's last position's size repeats past its end
        options.draft_shortlist, options.shortlist_dir, context.target_name, MAX_TREE_DEPTH
    )
    return build_medusa(
        context.target, folder, options.tree, int8=options.drafter_int8, shortlist=shortlist
    )
