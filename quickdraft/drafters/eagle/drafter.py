"""EAGLE drafting: a feature-level draft layer that grows a dynamic tree (EAGLE-2).

The draft layer (``net.EagleNet``) keeps a KV cache of its own, one entry per committed token:
the entry at position p reads the target's feature at p and the embedding of token p + 1. Each
step (built by ``build.py`` from a saved folder or a spec):

1. catch up: the target's features at the tokens its passes kept since the last draft
   (``StepResult.hidden`` / ``taps``, collected by ``begin`` and ``observe``) become real
   entries in one pass; the output of the last one (the pending token's entry) scores the
   first draft level;
2. expand (EAGLE-2): at each depth the ``topk`` nodes with the highest score, the product of the
   draft probabilities along their path, get an entry of their own (the parent's output as
   feature, their token's embedding), attending to the committed entries and their ancestors
   only; each proposes its ``topk`` most likely children;
3. rerank: the ``tokens`` nodes with the highest scores over every depth form the draft. A
   node's score never exceeds its parent's, so the chosen set is always a tree. With a floor
   (``DynamicTree.min_prob``) nodes scoring below it are neither expanded nor kept;
4. graft (optional, ``lookup``): prompt lookup's continuation joins the tree (``graft.py``).

The head scores the network's draft vocabulary with the target's own LM-head rows, or, with a
``shortlist`` (``quickdraft.vocab``: FR-Spec, DynaSpec), the rows that shortlist chooses at
each depth out of the target's whole vocabulary: DynaSpec's router reads the token an entry
takes in and the feature it reads (the target's for the first level, the parent's output
after), so it can run beside the layer. Drafts stay exact either way: the target verifies.

Candidates are deterministic (point masses), which the tree rules accept exactly at any
temperature (``accept.tree_rejection_sampling``). In a batch, every row drafts its own tokens
but the rows share one tree shape (the engine verifies one shape per step): expansion and
rerank then rank nodes by their scores summed over rows; with one row this is EAGLE-2 exactly.
"""

from __future__ import annotations

import copy
import math
from typing import Any
from weakref import WeakKeyDictionary

import torch

from quickdraft.drafters.base import (
    Batch,
    Draft,
    Needs,
    ShortlistContext,
    StepResult,
    pad_rows,
)
from quickdraft.drafters.eagle.compiled import CompiledLayer
from quickdraft.drafters.eagle.graft import ancestor_mask, graft
from quickdraft.drafters.eagle.net import EagleNet, check_fits
from quickdraft.drafters.eagle.tree import DEFAULT_TREES, DynamicTree, rerank
from quickdraft.drafters.ngram import NGramDrafter
from quickdraft.models.attention import prefix_tree_mask
from quickdraft.models.base import FeatureModel, Model
from quickdraft.models.kv_cache import KVCache
from quickdraft.models.ops import draft_linear, packed_copy
from quickdraft.vocab.shortlist import Shortlist


def _first_rows(fresh: list[tuple], count: int) -> list[tuple]:
    """The first ``count`` positions of a slot's waiting features (none for count <= 0)."""
    kept: list[tuple] = []
    for hidden, taps in fresh:
        if count <= 0:
            break
        take = min(count, hidden.shape[0])
        kept.append((hidden[:take], {i: t[:take] for i, t in taps.items()}))
        count -= take
    return kept


# The packed (quantized) layers and head rows of each network for each target, shared by the
# drafters built from them: quantizing them is most of a drafter's build (3 s for the 1.5B's
# 16,384 head rows and layer), and ``generate`` builds a drafter per call. Weakly held: a
# target or network no longer used takes its packed copies with it. Nothing in them changes
# after packing, so engines (and threads) share them. Keyed by the objects: a network (or a
# target's head) changed in place after a drafter was built from it packs again only as a
# new object (``copy.deepcopy``, or ``load_eagle`` of the saved folder).
_PACKED: WeakKeyDictionary[Any, WeakKeyDictionary[EagleNet, dict[tuple[str, bool], Any]]] = (
    WeakKeyDictionary()
)


class EagleDrafter:
    """Drafts a dynamic tree with an EAGLE network over the target's features. Needs a
    feature model (the native runner): its embedding, LM head rows and, for EAGLE-3, layer
    taps."""

    def __init__(
        self,
        target: Model,
        net: EagleNet,
        tree: DynamicTree | None = None,
        *,
        int8: bool = False,
        lookup: int = 0,
        lookup_ngram: tuple[int, int] = (1, 3),
        shortlist: Shortlist | None = None,
    ):
        config = net.config
        if not isinstance(target, FeatureModel):
            raise ValueError(
                f"target: EAGLE reads the native runner's features, got {type(target).__name__}"
            )
        check_fits(net, target)
        self.device = target.device
        # Prepacked (and int8) layers are the CPU's fast path; elsewhere the plain network.
        int8 = int8 and self.device.type == "cpu"
        packed = _PACKED.setdefault(target, WeakKeyDictionary()).setdefault(net, {})
        if self.device.type != "cpu":
            self.net = copy.deepcopy(net).eval().to(self.device)
        elif ("net", int8) in packed:
            self.net = packed["net", int8]
        else:
            self.net = packed["net", int8] = packed_copy(net.eval(), int8)
        # The layer's passes in one compiled call where its quantized products allow
        # (``compiled.py``); else the PyTorch layer.
        self.layer: CompiledLayer | None = None
        if self.device.type == "cpu" and int8:
            if ("layer", int8) not in packed:
                packed["layer", int8] = CompiledLayer.of(net.eval(), self.net)
            self.layer = packed["layer", int8]
        self.tree = tree or DEFAULT_TREES["cpu"]
        if isinstance(lookup, bool) or not isinstance(lookup, int) or lookup < 0:
            raise ValueError(f"eagle_lookup must be a non-negative integer, got {lookup!r}")
        self.vocab_size = target.vocab_size
        self.num_tokens = self.tree.tokens + lookup
        # Prompt lookup grafted onto the tree (0: off): its continuation is one more branch.
        self.lookup = NGramDrafter(self.vocab_size, lookup, *lookup_ngram) if lookup else None
        # Target decoder layers whose outputs the drafter reads: the inputs of the feature
        # layers are the outputs of the layers below.
        taps = tuple(layer - 1 for layer in config.feature_layers)
        self.needs = Needs(
            tokens=self.num_tokens,
            depth=max(self.tree.depth, lookup),
            hidden=True,
            taps=taps,
            caps_depth=True,
            resumes=True,
            text_draft=lookup > 0,
        )
        self.embed = target.embed
        self.shortlist = shortlist
        # The sequence's tokens, for shortlists that add them (the hybrid DynaSpec kinds).
        self.shortlist_context = (
            ShortlistContext(shortlist)
            if shortlist is not None and shortlist.uses_context
            else None
        )
        if shortlist is not None and config.own_head:
            raise ValueError(
                "draft_shortlist: this EAGLE drafter scores an LM head of its own; shortlists "
                "cut the target's head rows (train one with --score-full-vocab)"
            )
        if shortlist is None:
            vocab = net.draft_vocab
            self.draft_vocab = vocab.to(self.device)
            self.head: Any = None
            if config.own_head:  # packed with the rest of the network
                self.head = self.net.lm_head
            elif ("head", int8) in packed:  # packed once: the target's rows of the draft
                self.head = packed["head", int8]  # vocabulary
            else:
                head = target.head_weight[vocab].to(torch.float32)
                self.head = packed["head", int8] = draft_linear(head, quantize=int8)
        else:  # the shortlist packs the target's rows in segments of its own
            shortlist.bind(target.head_weight, target.embed, self.vocab_size, int8)
            self.head = None
        self.cache: KVCache | None = None
        self._root = torch.zeros(0)
        self._root_feature = torch.zeros(0)  # the feature the root's entry read (router input)
        self._fresh: list[list[tuple]] = []  # per row: features waiting to be entries

    @property
    def head_rows(self) -> int:
        """Rows of the LM head one draft position scores: the draft vocabulary, or the
        shortlist's mean so far (the target's whole head before any draft)."""
        if self.shortlist is None:
            return int(self.draft_vocab.numel())
        mean = self.shortlist.mean_size()
        return self.vocab_size if math.isnan(mean) else round(mean)

    # -- the protocol ---------------------------------------------------------------------

    def reserve(self, rows: int, capacity: int) -> None:
        config = self.net.config
        self.cache = KVCache(
            1,
            rows,
            capacity + self.tree.depth * self.tree.topk + 1,
            config.num_kv_heads,
            config.head_dim,
            dtype=torch.float32,
            device=self.device,
        )
        self._root = torch.zeros(rows, config.hidden_size, device=self.device)
        self._root_feature = torch.zeros_like(self._root)
        if self.shortlist_context is not None:
            self.shortlist_context.reserve(rows, self.device)
        self._fresh = [[] for _ in range(rows)]
        if self.lookup is not None:
            self.lookup.reserve(rows, capacity)

    def resumable(self) -> torch.Tensor:
        """[slots] entries each slot holds of its last text (``Needs.resumes``), those made and
        those whose features wait for a propose (the last steps', or every step's when
        suffix decoding drafted them): entry i reads position i's feature and token i + 1,
        so a prompt sharing tokens 0..r with the slot's text keeps r."""
        assert self.cache is not None, "reserve() first"
        waiting = [sum(h.shape[0] for h, _ in row) for row in self._fresh]
        return self.cache.lengths + torch.tensor(waiting, device=self.cache.lengths.device)

    def begin(self, start: StepResult) -> None:
        """The prompt's features wait to become the new slots' entries, after the r entries
        a reused prefix keeps (r: the prompt less its last token less the features that
        came): the made ones past r are dropped, waiting features before r are kept."""
        assert self.cache is not None, "reserve() first"
        slots = start.batch.slots
        view, reused = self.cache.select(slots), start.batch.lengths - 1 - start.kept
        keep, made = reused.tolist(), view.lengths.tolist()
        view.rollback(torch.minimum(reused, view.lengths))
        slots.put(self._root, 0.0)  # nothing of a slot's last request
        slots.put(self._root_feature, 0.0)
        for b, (slot, fresh) in enumerate(zip(slots.host, self._features(start), strict=True)):
            self._fresh[slot] = _first_rows(self._fresh[slot], keep[b] - made[b]) + fresh
        if self.shortlist_context is not None:
            self.shortlist_context.begin(start.batch)
        if self.lookup is not None:
            self.lookup.begin(start)

    def release(self, slot: int, completed: bool) -> None:
        """Nothing to do: the slot's next ``begin`` overwrites its state."""

    def observe(self, result: StepResult) -> None:
        """The kept tokens' features wait for the next propose: a step the batch policy left
        undrafted costs nothing here, and a request that finishes before drafting resumes
        never pays for them."""
        for slot, fresh in zip(result.batch.slots.host, self._features(result), strict=True):
            self._fresh[slot] += fresh

    def describe(self) -> str:
        tree = self.tree
        shape = f"dynamic tree: depth {tree.depth}, top-{tree.topk}, {tree.tokens} tokens"
        if tree.min_prob:
            shape += f" of path probability >= {tree.min_prob:g}"
        if self.lookup is not None:
            shape += f", + up to {self.lookup.num_tokens} of prompt lookup"
        return shape

    @torch.inference_mode()
    def propose(self, batch: Batch) -> Draft:
        assert self.cache is not None, "reserve() first"
        if batch.text_only:  # the network rests: prompt lookup's draft alone
            assert self.lookup is not None, "Needs.text_draft only with a grafted lookup"
            return self.lookup.propose(batch)
        cache = self.cache.select(batch.slots)
        self._flush(cache, batch)
        if self.shortlist_context is not None:
            self.shortlist_context.catch_up(batch)
        draft = self._expand(cache, batch, batch.slots.take(self._root))
        return draft if self.lookup is None else self._graft(batch, draft)

    def _features(self, result: StepResult) -> list[list[tuple]]:
        """Per row, the (hidden [m, D], {layer: [m, D]}) its pass kept (none for m = 0)."""
        assert result.hidden is not None, "Needs.hidden brings the target's hidden states"
        kept = result.kept.tolist()  # host sync: how many each row kept
        return [
            [(result.hidden[b, :m], {i: t[b, :m] for i, t in result.taps.items()})] if m else []
            for b, m in enumerate(kept)
        ]

    def _flush(self, cache: KVCache, batch: Batch) -> None:
        """Step 1: the waiting features of every row become entries in one pass; each row's
        root (the pending token's entry's output) is refreshed where features arrived."""
        slots = batch.slots
        fresh = [self._fresh[slot] for slot in slots.host]
        if not any(fresh):
            return
        counts = torch.tensor([sum(h.shape[0] for h, _ in row) for row in fresh])
        hidden = pad_rows([[h for h, _ in row] for row in fresh])
        taps = {i: pad_rows([[t[i] for _, t in row] for row in fresh]) for i in self.needs.taps}
        counts = counts.to(self.device)
        roots, features = self._catch_up(cache, StepResult(batch, counts, hidden, taps))
        arrived = (counts > 0).unsqueeze(1)
        slots.put(self._root, torch.where(arrived, roots, slots.take(self._root)))
        kept = slots.take(self._root_feature)
        slots.put(self._root_feature, torch.where(arrived, features, kept))
        for row in fresh:
            row.clear()

    # -- steps --------------------------------------------------------------------------

    def _catch_up(self, cache: KVCache, result: StepResult) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 1: real entries for the target's kept features; returns the output of each
        row's last one and the feature it read, [B, d] each (zeros for a row with none: a
        one-token prompt)."""
        net, batch, count = self.net, result.batch, result.kept
        assert result.hidden is not None
        if result.hidden.shape[1] == 0:
            zeros = torch.zeros(batch.size, net.config.hidden_size, device=self.device)
            return zeros, zeros
        taps = [result.taps[layer].float() for layer in self.needs.taps]
        feature = net.fuse(result.hidden.float(), taps)  # [B, M, d]
        num = feature.shape[1]
        first = batch.lengths - 1 - count  # position of each row's first kept feature
        positions = first.unsqueeze(1) + torch.arange(num, device=self.device)  # [B, M]
        following = batch.tokens.gather(1, (positions + 1).clamp(0, batch.capacity - 1))
        attn_input, residual = net.project(self.embed[following].float(), feature)
        ancestors = torch.ones(num, num, dtype=torch.bool, device=self.device).tril()
        output = self._attend(cache, attn_input, residual, positions, ancestors, 0)
        cache.commit(count)
        rows, last = torch.arange(batch.size, device=self.device), (count - 1).clamp_min(0)
        some = (count > 0).unsqueeze(1)
        return torch.where(some, output[rows, last], 0.0), torch.where(
            some, feature[rows, last], 0.0
        )

    def _attend(
        self,
        cache: KVCache,
        attn_input: torch.Tensor,
        residual: torch.Tensor,
        positions: torch.Tensor,
        ancestors: torch.Tensor,
        offset: int,
    ) -> torch.Tensor:
        """One pass of the layer for T new entries written at scratch slots offset..offset+T-1
        past each row's committed length. ancestors: [T, offset + T] bool, which scratch
        entries each new one sees (itself and its ancestors); committed entries are always
        visible. Returns the outputs [B, T, d]."""
        if self.layer is not None:
            output = self.layer.run(cache, attn_input, residual, positions, ancestors, offset)
            if output is not None:
                return output
        net = self.net
        num = attn_input.shape[1]
        lengths = cache.lengths
        steps = torch.arange(num, device=self.device)
        write = lengths.unsqueeze(1) + offset + steps  # [B, T] the new entries' slots
        used = int(lengths.max()) + offset + num  # host sync: the attention's width
        mask = prefix_tree_mask(lengths, used, ancestors, num)
        q, k, v = net.qkv(attn_input, positions)
        cache.write(0, k.transpose(1, 2), v.transpose(1, 2), write)
        keys, values = cache.view(0, used)
        attended = torch.nn.functional.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, enable_gqa=q.shape[1] != keys.shape[1]
        )
        return net.finish(attended, residual)

    def _route(self, tokens: torch.Tensor, feature: torch.Tensor, depth: int) -> None:
        """Chooses the shortlist's rows for the outputs that ``tokens`` [..] and ``feature``
        [.., d] are about to produce at draft ``depth`` (the router's inputs). Called before
        the drafter's body runs on them, so a shortlist built with ``parallel`` routes on its
        own thread meanwhile."""
        if self.shortlist is not None:
            width = feature.shape[-1]
            self.shortlist.prepare(depth, tokens.reshape(-1), feature.reshape(-1, width).float())

    def _top(self, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``tree.topk`` most likely draft tokens after each output [.., d]: (their
        log-probabilities, their token ids), each [.., K]; with a shortlist, over the rows
        ``_route`` chose."""
        k, hidden = self.tree.topk, self.net.head_input(output)
        if self.shortlist is None:
            assert self.head is not None
            top = self.head(hidden).float().log_softmax(-1).topk(k, dim=-1)
            return top.values, self.draft_vocab[top.indices]
        lead, width = hidden.shape[:-1], hidden.shape[-1]
        ids, logits = self.shortlist.logits(hidden.reshape(-1, width))
        top = logits.log_softmax(-1).topk(min(k, ids.numel()), dim=-1)
        values, chosen = top.values, ids.to(self.device)[top.indices]
        if values.shape[-1] < k:  # a shortlist smaller than top-k: repeat the best, unscored
            short = k - values.shape[-1]
            values = torch.cat([values, values.new_full((values.shape[0], short), -math.inf)], 1)
            chosen = torch.cat([chosen, chosen[:, :1].expand(-1, short)], 1)
        return values.reshape(*lead, k), chosen.reshape(*lead, k)

    def _expand(self, cache: KVCache, batch: Batch, root: torch.Tensor) -> Draft:
        """Steps 2 and 3: grow the tree level by level, then keep the best ``tokens`` nodes."""
        tree, net = self.tree, self.net
        rows = root.shape[0]
        pending = batch.tokens.gather(1, (batch.lengths - 1).unsqueeze(1)).squeeze(1)
        self._route(pending, batch.slots.take(self._root_feature), 0)
        top_values, top_tokens = self._top(root)
        # Every candidate node so far: token [B], score [B] (log of its path probability),
        # parent (candidate index, -1 for the root's children), depth.
        tokens = [top_tokens]  # per level: [B, C]
        scores = [top_values]
        parents = [torch.full((tree.topk,), -1, device=self.device)]
        level_start = [0]
        # Expanded nodes: their entries sit at scratch slots 0.. in this order.
        entry_of: dict[int, int] = {}  # candidate index -> scratch entry
        entry_parent: list[int] = []  # scratch entry -> its parent's entry (-1: committed)
        # The outputs the current level's nodes read as features, and which slot of them
        # each parent's is (the root's children read the root's output).
        outputs_of_level = root.unsqueeze(1)
        parent_slot = {-1: 0}
        anchor = batch.lengths - 2  # position of the pending token's entry
        # Scores are summed over rows (one shared shape), so the floor is too.
        floor = rows * math.log(tree.min_prob) if tree.min_prob > 0 else -math.inf
        depth = tree.depth if batch.max_depth is None else min(tree.depth, batch.max_depth)
        for level in range(1, depth):
            level_total = scores[-1].sum(0)
            # Nodes under the floor are never drafted, nor are their children.
            # (A shortlist smaller than top-k pads with -inf: never expanded.)
            width = min(tree.topk, int(((level_total >= floor) & (level_total > -math.inf)).sum()))
            if width == 0:
                break
            chosen = level_total.topk(width).indices  # [W] within the level, shared
            base = level_start[-1]
            level_parents = parents[-1][chosen]  # candidate index of each one's parent
            feature_index = torch.tensor(
                [parent_slot[int(p)] for p in level_parents], device=self.device
            )
            feature = outputs_of_level[:, feature_index]  # [B, W, d]
            chosen_tokens = tokens[-1][:, chosen]  # [B, W]
            self._route(chosen_tokens, feature, level)
            attn_input, residual = net.project(self.embed[chosen_tokens].float(), feature)
            offset = len(entry_parent)
            for slot, candidate in enumerate(chosen.tolist()):
                parent = int(parents[-1][candidate])
                entry_parent.append(entry_of[parent] if parent >= 0 else -1)
                entry_of[base + candidate] = offset + slot
            ancestors = ancestor_mask(entry_parent)[offset:].to(self.device)  # [W, offset + W]
            positions = (anchor + level).unsqueeze(1).expand(rows, width)
            output = self._attend(cache, attn_input, residual, positions, ancestors, offset)
            values, children = self._top(output)  # [B, W, K]
            level_scores = scores[-1][:, chosen].unsqueeze(-1) + values
            tokens.append(children.flatten(1))
            scores.append(level_scores.flatten(1))
            parents.append((base + chosen).repeat_interleave(tree.topk))
            # The next level reads these outputs: candidate (w, k) has parent slot w.
            parent_slot = {base + int(c): w for w, c in enumerate(chosen.tolist())}
            outputs_of_level = output
            level_start.append(base + scores[-2].shape[1])
        return rerank(tokens, scores, parents, floor, tree.tokens)

    def _graft(self, batch: Batch, draft: Draft) -> Draft:
        """Prompt lookup's continuation as one more branch of the tree (``graft.graft``)."""
        assert self.lookup is not None
        continuation = self.lookup.propose(batch)
        if batch.max_depth is not None:  # no node deeper than asked, the branch's either
            continuation = continuation.cut(batch.max_depth)
        return graft(draft, continuation)
