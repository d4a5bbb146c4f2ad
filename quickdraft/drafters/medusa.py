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

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from quickdraft import artifacts
from quickdraft.artifacts import load_state, read_json, read_safetensors
from quickdraft.config import MAX_DRAFT_TOKENS, MAX_TREE_DEPTH, MAX_TREE_WIDTH, show_value
from quickdraft.drafters.base import (
    Batch,
    Draft,
    Needs,
    ShortlistContext,
    StepResult,
    shipped_folder,
)
from quickdraft.models.base import FeatureModel, Model
from quickdraft.models.ops import Linear
from quickdraft.tree import TreeShape
from quickdraft.vocab.shortlist import Shortlist

CONFIG_FILE = "medusa.json"
WEIGHTS_FILE = "medusa.safetensors"
ARTIFACTS = Path(__file__).parent / "artifacts" / "medusa"
DEFAULT_NODES = 16

# Default trees (Medusa's sparse "choices"): wide where the heads are accurate (depth 1), narrow
# deeper. 3 heads: 4 + 6 + 4 = 14 nodes.
DEFAULT_PATHS: dict[int, tuple[tuple[int, ...], ...]] = {
    1: ((0,), (1,), (2,), (3,)),
    2: ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0)),
    3: (
        (0,), (1,), (2,), (3,),
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0),
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
    ),
}  # fmt: skip


def default_tree(num_heads: int) -> TreeShape:
    """The default tree for ``num_heads`` heads: the 3-head tree cut, or extended by one top
    candidate per further head."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    if num_heads in DEFAULT_PATHS:
        return TreeShape.from_paths(DEFAULT_PATHS[num_heads])
    paths = list(DEFAULT_PATHS[3])
    for depth in range(4, num_heads + 1):
        paths.append((0,) * depth)
    return TreeShape.from_paths(paths)


def fit_tree(rank_accuracy: Sequence[Sequence[float]], nodes: int) -> TreeShape:
    """Medusa's tree construction: the ``nodes`` paths most likely to be accepted, taking head
    d's r-th candidate to be right with probability rank_accuracy[d][r] independently of the
    others. A path's probability is the product along it, so it never exceeds its prefix's
    (nor, with accuracies falling with rank, its elder sibling's): the best paths always form
    a tree. Its expected accepted length is 1 + the sum of the chosen paths' probabilities."""
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    if not rank_accuracy or not all(rank_accuracy):
        raise ValueError("rank_accuracy: one non-empty list of accuracies per head")
    chosen: list[tuple[int, ...]] = []
    # (probability of the path, the path, probability of its parent path)
    frontier = [(float(rank_accuracy[0][0]), (0,), 1.0)]
    while frontier and len(chosen) < nodes:
        frontier.sort(key=lambda item: -item[0])
        probability, path, parent = frontier.pop(0)
        chosen.append(path)
        depth, rank = len(path), path[-1]
        accuracy = rank_accuracy[depth - 1]
        if rank + 1 < len(accuracy):  # the next sibling
            frontier.append((parent * accuracy[rank + 1], (*path[:-1], rank + 1), parent))
        if depth < len(rank_accuracy):  # the first child
            frontier.append((probability * rank_accuracy[depth][0], (*path, 0), probability))
    return TreeShape.from_paths(chosen)


def check_tree(text: str) -> None:
    """The syntax and size of a tree option (``default``, ``fit:N``, ``W1,W2,..``), by
    arithmetic alone: nothing is built, so a typo such as 300,300,300 fails at once."""
    if text == "default":
        return
    if text.startswith("fit:"):
        if not re.fullmatch(r"[0-9]+", text[4:]) or not 1 <= int(text[4:]) <= MAX_DRAFT_TOKENS:
            raise ValueError(f"tree: expected fit:N with N in 1..{MAX_DRAFT_TOKENS}, got {text!r}")
        return
    parts = text.split(",")
    if not all(re.fullmatch(r" *[0-9]+ *", part) for part in parts):
        raise ValueError(f"tree: expected default or widths like 4,2,1, got {text!r}")
    widths = [int(part) for part in parts]
    if len(widths) > MAX_TREE_DEPTH or not all(1 <= w <= MAX_TREE_WIDTH for w in widths):
        raise ValueError(
            f"tree: at most {MAX_TREE_DEPTH} levels of 1..{MAX_TREE_WIDTH} children, got {text!r}"
        )
    nodes, level = 0, 1
    for width in widths:
        level *= width
        nodes += level
        if nodes > MAX_DRAFT_TOKENS:
            raise ValueError(
                f"tree: {text!r} has more than {MAX_DRAFT_TOKENS} nodes; use fewer or narrower "
                "levels, or fit:N"
            )


def parse_tree(
    text: str | None, num_heads: int, rank_accuracy: Sequence[Sequence[float]] | None = None
) -> TreeShape:
    """``None`` or ``default``: fitted to the heads' measured accuracies with 16 nodes when
    they are known, else ``default_tree``; ``fit:N``: fitted with N nodes; ``W1,W2,..``: a
    full tree of those widths, at most one depth per head."""
    if text is None or text == "default":
        if rank_accuracy:
            return fit_tree(rank_accuracy, DEFAULT_NODES)
        return default_tree(num_heads)
    check_tree(text)
    if text.startswith("fit:"):
        nodes = int(text[4:])
        if not rank_accuracy:
            raise ValueError("tree: fit:N needs heads with measured rank accuracies")
        return fit_tree(rank_accuracy, nodes)
    widths = [int(w) for w in text.split(",")]
    if len(widths) > num_heads:
        raise ValueError(f"tree: {len(widths)} levels but the heads predict only {num_heads}")
    return TreeShape.from_branching(widths)


@dataclass(frozen=True, slots=True)
class MedusaConfig:
    hidden_size: int
    vocab_size: int
    num_heads: int = 3
    num_layers: int = 1
    own_head: bool = False

    def __post_init__(self) -> None:
        for name in ("hidden_size", "vocab_size", "num_heads", "num_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {show_value(value)}")


class ResidualBlock(nn.Module):
    """x + SiLU(W x + b), W and b zero at initialisation (the identity)."""

    def __init__(self, size: int):
        super().__init__()
        self.linear = nn.Linear(size, size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` independent heads. ``forward(h [.., d])`` -> their states [.., H, d];
    ``logits(states, lm_head)`` -> [.., H, V] with the target's head weight [V, d] or their own.
    """

    def __init__(self, config: MedusaConfig, lm_head: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        # Held-out accuracy of each head's r-th candidate, when known (set by training / load).
        self.rank_accuracy: list[list[float]] | None = None
        # The tokens the heads were trained to rank (``train_vocab``), None for the whole
        # vocabulary. Drafting then scores these rows only, as in training.
        self.vocab: torch.Tensor | None = None
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResidualBlock(config.hidden_size) for _ in range(config.num_layers)))
            for _ in range(config.num_heads)
        )
        self.lm_heads: nn.ModuleList | None = None
        if config.own_head:
            if lm_head is None:
                raise ValueError("lm_head: heads of their own start from the target's head weight")
            self.lm_heads = nn.ModuleList(
                nn.Linear(config.hidden_size, config.vocab_size, bias=False)
                for _ in range(config.num_heads)
            )
            for head in self.lm_heads:
                head.weight.data.copy_(lm_head[: config.vocab_size])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.stack([block(hidden) for block in self.blocks], dim=-2)

    def logits(self, states: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        """states [.., H, d] -> logits [.., H, V] (training; inference packs the head)."""
        if self.lm_heads is None:
            return F.linear(states, lm_head)
        return torch.stack(
            [head(states[..., i, :]) for i, head in enumerate(self.lm_heads)], dim=-2
        )


def save_heads(folder: str | Path, heads: MedusaHeads, metadata: dict | None = None) -> None:
    """The heads' weights (fp16) and config; ``metadata`` (e.g. training settings) goes into
    the config file too."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        name: tensor.detach().half().contiguous() for name, tensor in heads.state_dict().items()
    }
    if heads.vocab is not None:
        state["vocab"] = heads.vocab.long().contiguous()
    save_file(state, str(folder / WEIGHTS_FILE))
    record = {"config": asdict(heads.config), **(metadata or {})}
    (folder / CONFIG_FILE).write_text(json.dumps(record, indent=2) + "\n")


def load_heads(folder: str | Path) -> MedusaHeads:
    folder = Path(folder)
    if not (folder / CONFIG_FILE).exists() or not (folder / WEIGHTS_FILE).exists():
        raise ValueError(f"medusa_dir: {folder} holds no {CONFIG_FILE} and {WEIGHTS_FILE}")
    remedy = "retrain the heads (quickdraft train medusa) or copy the folder again"
    record = read_json(folder / CONFIG_FILE, remedy, required=("config",))
    config = artifacts.build(folder / CONFIG_FILE, remedy, MedusaConfig, record["config"])
    # Heads of their own are overwritten by the file: any starting weight will do.
    placeholder = torch.zeros(config.vocab_size, config.hidden_size) if config.own_head else None
    heads = MedusaHeads(config, placeholder)
    state = read_safetensors(folder / WEIGHTS_FILE, remedy)
    heads.vocab = state.pop("vocab", None)
    if heads.vocab is not None and (heads.vocab.dim() != 1 or heads.vocab.dtype.is_floating_point):
        raise artifacts.ArtifactError(folder / WEIGHTS_FILE, "vocab is not a list of ids", remedy)
    if heads.vocab is not None and len(heads.vocab) and int(heads.vocab.max()) >= config.vocab_size:
        raise artifacts.ArtifactError(
            folder / WEIGHTS_FILE, f"vocab holds ids past vocab_size {config.vocab_size}", remedy
        )
    load_state(folder / WEIGHTS_FILE, heads, {k: t.float() for k, t in state.items()}, remedy)
    heads.rank_accuracy = record.get("rank_accuracy")
    return heads.eval()


def heads_folder(target_name: str | None, folder: str | Path | None = None) -> Path:
    """The explicit folder, else the heads shipped for ``target_name``."""
    return shipped_folder(ARTIFACTS, target_name, folder, "medusa_dir", "Medusa heads, medusa")


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
            self._subset = (vocab, Linear(rows, int8=int8))
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

    def begin(self, first: int, start: StepResult) -> None:
        """The heads read the prefill's last state (zeros for a one-token prompt: its first
        draft is a guess, verified like any other)."""
        self._hidden[first : first + start.batch.size] = _last_kept(start, self._hidden)
        if self.shortlist_context is not None:
            self.shortlist_context.begin(first, start.batch)

    def observe(self, result: StepResult) -> None:
        self._hidden[: result.batch.size] = _last_kept(result, self._hidden)

    def reorder(self, order: torch.Tensor) -> None:
        self._hidden[: order.shape[0]] = self._hidden[order].clone()
        if self.shortlist_context is not None:
            self.shortlist_context.reorder(order)

    @torch.inference_mode()
    def propose(self, batch: Batch) -> Draft:
        tree = self.tree
        hidden = self._hidden[: batch.size]
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
    tree: str | None = None,
    *,
    int8: bool = False,
    shortlist: Shortlist | None = None,
) -> MedusaDrafter:
    """A drafter from the heads saved in ``folder``; ``tree`` as in ``parse_tree``; ``int8``:
    int8 weights for the rows of a frequent-token head on CPU; ``shortlist``: each head
    ranks that shortlist's rows of the target's head instead."""
    heads = load_heads(folder)
    if heads.config.vocab_size != target.vocab_size:
        raise ValueError(
            f"medusa_dir: heads trained for a vocabulary of {heads.config.vocab_size}, the "
            f"target has {target.vocab_size}"
        )
    shape = parse_tree(tree, heads.config.num_heads, heads.rank_accuracy)
    return MedusaDrafter(target, heads, shape, int8=int8, shortlist=shortlist)
