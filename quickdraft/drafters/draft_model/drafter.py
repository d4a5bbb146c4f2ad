"""Classic speculative decoding: a smaller model drafts k tokens autoregressively."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.drafters.base import (
    Batch,
    BuildContext,
    Draft,
    Needs,
    ShortlistContext,
    StepResult,
)
from quickdraft.drafters.draft_model.options import DraftModelOptions
from quickdraft.models.base import Cache, FeatureModel, Model
from quickdraft.sampling import probs_for_rows, sample_rows
from quickdraft.vocab import shortlist_for
from quickdraft.vocab.shortlist import Shortlist


class DraftModelDrafter:
    """Drafts a chain of ``num_tokens`` tokens with its own model and cache.

    Cache bookkeeping, per row: ``valid`` counts the draft cache's entries known to match the
    text (the draft tokens the target accepted among them). Each step feeds the tokens from
    there to the pending one, rolling every row back to the batch's widest gap so that the
    rows run one shape (rewriting entries with identical values); then one token per further
    draft. Usually the gap is one or two tokens; after steps the batch policy left undrafted,
    the draft catches up on all of them at once.

    shortlist: restricts the draft's head to a subset of the vocabulary (``quickdraft.vocab``);
    the draft distribution is renormalised over it, so decoding stays exact. Needs a feature
    model (the native runner) for its separate body and head rows.
    """

    def __init__(
        self,
        model: Model,
        num_tokens: int,
        temperature: float | None = None,
        vocab_size: int | None = None,
        shortlist: Shortlist | None = None,
    ):
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        self.model = model
        # The target's vocabulary size. Checkpoints of one tokenizer are often padded to
        # different sizes (Qwen); the draft's logits are cut or padded with -inf to match.
        self.vocab_size = vocab_size or model.vocab_size
        self.num_tokens = num_tokens
        self.needs = Needs(tokens=num_tokens, depth=num_tokens, shortens=True)
        self.temperature = temperature
        # A feature model's body and head run separately: the head only on the last row.
        self._features: FeatureModel | None = model if isinstance(model, FeatureModel) else None
        self.shortlist = shortlist
        if shortlist is not None:
            if self._features is None:
                raise ValueError(
                    "shortlist: needs a draft model on the native runner "
                    f"(got {type(model).__name__})"
                )
            features = self._features
            shortlist.bind(features.head_weight, features.embed, self.vocab_size, features.int8)
        # The sequence's tokens, for shortlists that add them (the hybrid DynaSpec kinds).
        self.shortlist_context = (
            ShortlistContext(shortlist)
            if shortlist is not None and shortlist.uses_context
            else None
        )
        self._cache: Cache | None = None
        self._valid = torch.zeros(0, dtype=torch.long)
        self._drafted = False  # whether this step proposed (the batch policy may skip it)

    # -- slots ----------------------------------------------------------------------------

    def reserve(self, rows: int, capacity: int) -> None:
        self._cache = self.model.new_cache(rows, capacity)
        self._valid = torch.zeros(rows, dtype=torch.long, device=self._cache.lengths.device)
        if self.shortlist_context is not None:
            self.shortlist_context.reserve(rows, self._valid.device)

    def begin(self, start: StepResult) -> None:
        """The draft model's own prefill of the new prompts (all but the pending token), in
        their slots of its cache."""
        assert self._cache is not None, "reserve() first"
        batch = start.batch
        lengths = batch.lengths.tolist()  # one host sync per joining group
        # Ids past the draft's vocabulary (a padded target's) read as its last id, as in
        # propose(); only the proposals can change.
        prompts = batch.tokens[:, : max(lengths)].clamp_max(self.model.vocab_size - 1)
        if self.shortlist_context is not None:
            self.shortlist_context.begin(batch)
        cache = self._cache.select(batch.slots)
        cache.rollback(0)
        head = max(lengths) - 1
        if head > 0:
            positions = torch.arange(head, device=prompts.device).expand(batch.size, -1)
            self._body(prompts[:, :head], positions, cache)
            cache.commit(batch.lengths - 1)
        batch.slots.put(self._valid, batch.lengths - 1)

    def release(self, slot: int, completed: bool) -> None:
        """Nothing to do: the slot's next ``begin`` overwrites its state."""

    def observe(self, result: StepResult) -> None:
        """The draft entries of the tokens the target accepted stay valid."""
        if not self._drafted:
            return
        self._drafted = False
        slots = result.batch.slots
        before = result.batch.lengths - result.kept  # the first draft token's position
        assert self._cache is not None and result.accepted is not None
        fed = slots.take(self._cache.lengths)
        slots.put(self._valid, torch.minimum(fed, before + result.accepted))

    # -- drafting -------------------------------------------------------------------------

    @property
    def head_rows(self) -> int:
        """Vocabulary rows its head scores a draft token: the target's vocabulary (a
        shortlist's rows per position are in ``shortlist.mean_size()``)."""
        return self.vocab_size

    def describe(self) -> str:
        return f"k={self.num_tokens}"

    def propose(self, batch: Batch) -> Draft:
        assert self._cache is not None, "reserve() first"
        self._drafted = True
        steps = min(self.num_tokens, batch.limit or self.num_tokens)
        cache = self._cache.select(batch.slots)
        params = [self._params(p) for p in batch.sampling]
        lengths, valid = batch.lengths, batch.slots.take(self._valid)
        width = int((lengths - valid).max())  # host sync: the catch-up's width
        start = (lengths - width).clamp_min(0)  # <= valid: rows only rewrite known entries
        cache.rollback(start)
        positions = start.unsqueeze(1) + torch.arange(width, device=lengths.device)
        # A padded target vocabulary can hold ids past the draft's: the draft reads such a
        # token as its last id. Only its proposal can change; the target verifies as always.
        inputs = batch.tokens.gather(1, positions.clamp_max(batch.capacity - 1))
        inputs = inputs.clamp_max(self.model.vocab_size - 1)
        pending = lengths - 1 - start  # each row's pending token among the inputs
        if self.shortlist is not None:
            return self._propose_shortlisted(
                batch, cache, inputs, positions, pending, params, steps
            )
        logits = self._logits(inputs, positions, cache, pending)
        cache.commit(pending + 1)
        grammar = _Grammar(batch.matchers)
        tokens, probs = [], []
        for i in range(steps):
            token, prob = self._choose(grammar.mask(logits), params, batch)
            grammar.advance(token)
            tokens.append(token)
            probs.append(prob)
            if i + 1 < steps:
                position = (batch.lengths + i).unsqueeze(1)
                logits = self._logits(token.unsqueeze(1), position, cache)
                cache.commit(1)
        grammar.rollback()
        return Draft.chain(torch.stack(tokens, dim=1), torch.stack(probs, dim=1))

    def _propose_shortlisted(
        self,
        batch: Batch,
        cache: Cache,
        inputs: torch.Tensor,
        positions: torch.Tensor,
        pending: torch.Tensor,
        params: list[SamplingParams],
        steps: int,
    ) -> Draft:
        """The draft loop with a shortlisted head, ``steps`` tokens. The router of draft
        position t reads the token fed at t and the hidden state before it: at t = 0 both come
        from the first forward; later it can run while the body processes the previous draft
        token."""
        assert self.shortlist is not None
        shortlist = self.shortlist
        if self.shortlist_context is not None:  # the tokens each row gained since its last step
            self.shortlist_context.catch_up(batch)
        hidden = self._body(inputs, positions, cache)
        cache.commit(pending + 1)
        rows = torch.arange(batch.size, device=hidden.device)
        last = hidden[rows, pending]
        before = hidden[rows, (pending - 1).clamp_min(0)]
        prev = torch.where((pending > 0).unsqueeze(1), before, 0.0)
        shortlist.prepare(0, inputs[rows, pending], prev)
        tokens, probs = [], []
        for i in range(steps):
            if i:
                last = hidden[:, -1]
            ids, logits = shortlist.logits(last)
            token, full = self._choose_among(ids, logits, params, batch)
            tokens.append(token)
            probs.append(full)
            if i + 1 < steps:
                shortlist.prepare(i + 1, token, last)
                position = (batch.lengths + i).unsqueeze(1)
                hidden = self._body(token.unsqueeze(1), position, cache)
                cache.commit(1)
        return Draft.chain(torch.stack(tokens, dim=1), torch.stack(probs, dim=1))

    def _choose(
        self, logits: torch.Tensor, params: list[SamplingParams], batch: Batch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft token per row from logits [B, V]: (tokens [B], probs [B, V])."""
        probs = probs_for_rows(logits, params)
        return sample_rows(probs, batch.generators, batch.generator), probs

    def _choose_among(
        self, ids: torch.Tensor, logits: torch.Tensor, params: list[SamplingParams], batch: Batch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample among the shortlisted ``ids`` [S] from their logits [B, S]: the draft
        distribution renormalised over the shortlist, zero elsewhere in the [B, V] result."""
        sub = probs_for_rows(logits, params)
        index = sample_rows(sub, batch.generators, batch.generator)
        probs = torch.zeros(batch.size, self.vocab_size, dtype=sub.dtype, device=sub.device)
        probs.scatter_(1, ids.expand(batch.size, -1), sub)
        return ids[index], probs

    def _body(self, tokens: torch.Tensor, positions: torch.Tensor, cache: Cache) -> torch.Tensor:
        """Final hidden states [B, T, D], or logits for a model without a separate head."""
        if self._features is not None:
            return self._features.body(tokens, positions, cache)[0]
        return self.model.forward(tokens, positions, cache).logits

    def _logits(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: Cache,
        last: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Full-vocabulary logits [B, V] after each row's token ``last`` ([B] indices into
        ``tokens``; None: the last column)."""
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        column = torch.full_like(rows, tokens.shape[1] - 1) if last is None else last
        if self._features is not None:
            hidden = self._features.body(tokens, positions, cache)[0]
            logits = self._features.head(hidden[rows, column]).float()
        else:
            logits = self.model.forward(tokens, positions, cache).logits[rows, column]
        extra = self.vocab_size - logits.shape[-1]
        if extra > 0:
            return F.pad(logits, (0, extra), value=float("-inf"))
        return logits[..., : self.vocab_size] if extra < 0 else logits

    def _params(self, target: SamplingParams) -> SamplingParams:
        if self.temperature is None:
            return target
        return dataclasses.replace(target, temperature=self.temperature)


def build(spec: SpecConfig, context: BuildContext) -> DraftModelDrafter:
    """The registry's builder: ``spec.options`` are ``DraftModelOptions``; the draft model
    must share the target's tokenizer (padded vocabulary sizes may differ when the caller
    says the tokenizers agree)."""
    options = spec.options
    assert isinstance(options, DraftModelOptions)
    target, draft = context.target, context.draft
    assert draft is not None  # build_drafter checks that a draft model is given
    if context.same_tokenizer is False:
        raise ValueError(
            "draft: the draft model's tokenizer differs from the target's; "
            "draft and target must share one vocabulary"
        )
    if draft.vocab_size != target.vocab_size and not context.same_tokenizer:
        raise ValueError(
            f"draft: its vocabulary ({draft.vocab_size}) differs from the target's "
            f"({target.vocab_size}); pass both tokenizers to check they agree"
        )
    shortlist = shortlist_for(
        options.draft_shortlist,
        options.shortlist_dir,
        context.draft_name,
        spec.num_speculative_tokens,
    )
    drafter = DraftModelDrafter(
        draft,
        spec.num_speculative_tokens,
        options.draft_temperature,
        vocab_size=target.vocab_size,
        shortlist=shortlist,
    )
    if options.suffix_first:
        from quickdraft.drafters.suffix.hybrid import suffix_first

        return suffix_first(drafter)  # type: ignore[return-value]
    return drafter


class _Grammar:
    """Structured outputs in the draft loop: the draft samples from its own distribution
    masked to what each constrained row's grammar allows after the draft so far (``q`` is
    that masked distribution, so the rule stays exact), which keeps drafts the target would
    reject for certain out of the chain. Rows past a refused token, or whose grammar allows
    nothing, draw unmasked: the verify rejects them anyway."""

    def __init__(self, matchers: tuple):
        self.rows = [(b, m) for b, m in enumerate(matchers) if m is not None]
        self.taken = [0] * len(self.rows)
        self.live = [True] * len(self.rows)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [B, V] with each live constrained row's forbidden tokens at -inf."""
        if not any(self.live):
            return logits
        logits = logits.clone()
        for i, (b, matcher) in enumerate(self.rows):
            if self.live[i]:
                allowed = matcher.allowed()[: logits.shape[-1]].to(logits.device)
                if bool(allowed.any()):
                    logits[b].masked_fill_(~allowed, float("-inf"))
        return logits

    def advance(self, token: torch.Tensor) -> None:
        """The rows' matchers take the token [B] each drew (one host read, constrained only)."""
        if not any(self.live):
            return
        drawn = token.tolist()
        for i, (b, matcher) in enumerate(self.rows):
            if self.live[i]:
                took = matcher.advance([drawn[b]])
                self.taken[i] += took
                self.live[i] = took == 1 and not matcher.done

    def rollback(self) -> None:
        for (_, matcher), taken in zip(self.rows, self.taken, strict=True):
            matcher.rollback(taken)
