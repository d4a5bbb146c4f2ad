"""The toy models the conformance proof runs on: a target with an exactly computable
distribution, a perturbed draft of it, and drafters of every kind over them (trees from the
n-gram table, an untrained EAGLE on a tiny Llama, shortlists with a random router)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from quickdraft.drafters.base import Batch, Draft, Drafter, Needs, Stateless
from quickdraft.models.base import Model
from quickdraft.models.toy import NGramLM
from quickdraft.sampling import probs_for_rows, sample_rows
from quickdraft.tree import TreeShape

if TYPE_CHECKING:
    from quickdraft.drafters.eagle.tree import DynamicTree
    from quickdraft.drafters.lookahead import LookaheadConfig
from quickdraft.vocab import (
    ClusterShortlist,
    FrequencyShortlist,
    Router,
    RouterConfig,
    Shortlist,
    ShortlistChoice,
)

# The toy pair every case runs on: small enough to enumerate V^(k+1) sequences, peaked enough
# that top-k and top-p change the distribution, and a draft far enough from the target that a
# wrong rule shows (the tests check that each deliberately broken rule is caught).
TOY_VOCAB = 8
TOY_ORDER = 3
TOY_SHARPNESS = 1.5
TOY_DRAFT_DISTANCE = 0.6
# Shortlists: 4 clusters of the 8 tokens, a random (untrained) router, so the shortlist
# changes with the context in ways no test anticipates.
TOY_CLUSTERS = 4


def toy_llama(seed: int = 0, device: str = "cpu", int8: bool = False) -> Model:
    """A 2-layer Llama over the toy vocabulary with random, peaked weights (native runner);
    ``int8``: int8 weights (``models.int8``), a quantized target."""
    from quickdraft.models.llama import LlamaRunner

    config = {
        "model_type": "llama", "vocab_size": TOY_VOCAB, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": False,
    }  # fmt: skip
    generator = torch.Generator().manual_seed(seed + 11)

    def weight(rows: int, columns: int, scale: float) -> torch.Tensor:
        return torch.randn(rows, columns, generator=generator) * scale / columns**0.5

    weights = {"model.embed_tokens.weight": weight(TOY_VOCAB, 32, 6.0)}
    for i in range(2):
        prefix = f"model.layers.{i}."
        for name, rows, columns in (
            ("self_attn.q_proj", 32, 32), ("self_attn.k_proj", 16, 32),
            ("self_attn.v_proj", 16, 32), ("self_attn.o_proj", 32, 32),
            ("mlp.gate_proj", 64, 32), ("mlp.up_proj", 64, 32), ("mlp.down_proj", 32, 64),
        ):  # fmt: skip
            weights[prefix + name + ".weight"] = weight(rows, columns, 2.0)
        weights[prefix + "input_layernorm.weight"] = torch.ones(32)
        weights[prefix + "post_attention_layernorm.weight"] = torch.ones(32)
    weights["model.norm.weight"] = torch.ones(32)
    weights["lm_head.weight"] = weight(TOY_VOCAB, 32, 1.5)  # about the n-gram toy's spread
    return LlamaRunner.from_state_dict(config, weights, device=device, int8=int8, invariant=int8)


def toy_eagle(target: Model, tree: str, seed: int = 0, shortlist: str = "full") -> Drafter:
    """An untrained EAGLE-3 drafter on ``toy_llama``'s features; ``tree`` is
    ``eagle:D,K,N[,MIN_PROB][+LOOKUP]``; ``shortlist`` as ``toy_shortlist`` (its router reads
    the toy Llama's width), over the whole toy vocabulary."""
    from quickdraft.drafters.eagle.drafter import EagleDrafter
    from quickdraft.drafters.eagle.net import EagleConfig, EagleNet

    torch.manual_seed(seed + 13)
    net = EagleNet(EagleConfig.for_target(target.config, "eagle3", 6))  # type: ignore
    net.draft_vocab = torch.randperm(TOY_VOCAB)[:6]
    dynamic, lookup = eagle_row(tree)
    hidden = target.config.hidden_size  # type: ignore[attr-defined]
    chosen = toy_shortlist(shortlist, dynamic.depth, seed, hidden=hidden)
    return EagleDrafter(target, net, dynamic, lookup=lookup, shortlist=chosen)


def eagle_row(row: str) -> tuple[DynamicTree, int]:
    """A conformance row ``eagle:D,K,N[,MIN_PROB][+LOOKUP]`` -> (its tree, lookup tokens)."""
    from quickdraft.drafters.eagle.tree import DynamicTree

    shape, _, lookup = row.removeprefix("eagle:").partition("+")
    return DynamicTree.parse(shape), int(lookup or 0)


def lookahead_row(row: str, seed: int = 0) -> LookaheadConfig:
    """A conformance row ``lookahead:W,N,G`` -> its settings."""
    from quickdraft.drafters.lookahead import LookaheadConfig

    window, ngram, candidates = (int(v) for v in row.removeprefix("lookahead:").split(","))
    return LookaheadConfig(window=window, ngram=ngram, candidates=candidates, seed=seed)


def toy_tree(text: str) -> TreeShape:
    """``sample:W1,W2,..`` (a full tree of those widths) or ``top:P|P|..`` (Medusa paths, each
    a dot-separated list of ranks)."""
    kind, _, spec = text.partition(":")
    if kind == "sample":
        return TreeShape.from_branching([int(w) for w in spec.split(",")])
    if kind == "top":
        return TreeShape.from_paths([[int(r) for r in p.split(".")] for p in spec.split("|")])
    raise ValueError(f"tree: expected sample:W,W,.. or top:P|P|.., got {text!r}")


class NGramTreeDrafter(Stateless):
    """Tree drafts from a toy n-gram draft model, whose distribution at any node it reads
    straight from the table (the context is the sequence, then the node's ancestors).

    ``sampled``: each node's children are drawn from the draft's distribution (after each
    row's sampling parameters) without replacement, and each reports the distribution it
    was drawn from, its elder siblings removed; if they exhausted the support, the next is
    drawn from the full distribution again (still its true distribution given the history).
    Otherwise the children are the draft's top-ranked tokens, deterministic (point masses)."""

    def __init__(self, model: NGramLM, shape: TreeShape, sampled: bool):
        self.model, self.shape, self.sampled = model, shape, sampled
        self.vocab_size = model.vocab_size
        self.needs = Needs(tokens=shape.num_nodes, depth=shape.max_depth)

    def propose(self, batch: Batch) -> Draft:
        model, shape = self.model, self.shape
        width = model.order - 1
        slots = batch.lengths.unsqueeze(1) - width + torch.arange(width)  # [B, n-1]
        root = batch.tokens.gather(1, slots.clamp_min(0))
        root = torch.where(slots < 0, model.vocab_size, root)
        contexts: dict[int, torch.Tensor] = {-1: root}  # node -> its context [B, n-1]
        tokens = torch.zeros(batch.size, shape.num_nodes, dtype=torch.long)
        probs = torch.zeros(batch.size, shape.num_nodes, model.vocab_size)
        for parent in range(-1, shape.num_nodes):
            kids = [c for c in shape.children[parent + 1].tolist() if c >= 0]
            if not kids:
                continue
            index = (contexts[parent] * model.powers).sum(-1)
            full = probs_for_rows(model.table[index], batch.sampling)  # [B, V]
            left = full
            for rank, child in enumerate(kids):
                if self.sampled:
                    token = sample_rows(left, batch.generators, batch.generator)
                    probs[:, child] = left
                    rest = left.scatter(1, token.unsqueeze(1), 0.0)
                    mass = rest.sum(1, keepdim=True)
                    left = torch.where(mass > 0, rest / mass.clamp_min(1e-30), full)
                else:
                    token = torch.sort(full, dim=1, descending=True, stable=True).indices[:, rank]
                tokens[:, child] = token
                contexts[child] = torch.cat([contexts[parent][:, 1:], token.unsqueeze(1)], 1)
        return Draft(tokens, probs if self.sampled else None, shape)


def toy_shortlist(
    text: str, num_positions: int, seed: int = 0, hidden: int | None = None
) -> Shortlist | None:
    """A shortlist for the toy draft: a random frequency ranking, or round-robin clusters with
    a randomly initialised router over the toy's one-hot context states (or over ``hidden``
    wide states, a toy Llama's)."""
    choice = ShortlistChoice.parse(text)
    kind, size = choice.kind, choice.size
    generator = torch.Generator().manual_seed(seed + 7)
    if kind == "full":
        return None
    if kind in ("fr", "fr-pa"):
        ranked = torch.randperm(TOY_VOCAB, generator=generator)
        if kind == "fr":
            return FrequencyShortlist(ranked, [size])
        return FrequencyShortlist.position_aware(ranked, size, num_positions)
    width = hidden if hidden is not None else (TOY_VOCAB + 1) ** (TOY_ORDER - 1)
    torch.manual_seed(seed + 7)  # the router's initialisation
    router = Router(RouterConfig(width, TOY_CLUSTERS, width=16)).eval()
    assignment = torch.arange(TOY_VOCAB) % TOY_CLUSTERS
    return ClusterShortlist(
        assignment, router, size, position_aware=kind.endswith("-pa"), context="hybrid" in kind
    )


def toy_pair(seed: int = 0) -> tuple[NGramLM, NGramLM]:
    target = NGramLM.random(TOY_VOCAB, TOY_ORDER, seed=seed, sharpness=TOY_SHARPNESS)
    return target, target.perturbed(TOY_DRAFT_DISTANCE)
