"""Classic speculative decoding: a smaller model drafts k tokens autoregressively."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from quickdraft.accept import Verdict
from quickdraft.config import SamplingParams
from quickdraft.drafters.base import DecodeState, Draft
from quickdraft.models.base import Cache, Model
from quickdraft.sampling import probs_from_logits, sample
from quickdraft.vocab.shortlist import Shortlist


class DraftModelDrafter:
    """Drafts a chain of ``num_tokens`` tokens with its own model and cache.

    Cache bookkeeping: the draft cache lags the sequence by at most its last two tokens. Each step
    rolls it back to ``lengths - 2`` and feeds [second-to-last, pending] (rewriting one entry with
    identical values when it was already there), then one token per further draft. Every row of
    a batch thus runs the same shapes, whatever each row accepted in the last step.

    shortlist: restricts the draft's head to a subset of the vocabulary (``quickdraft.vocab``);
    the draft distribution is renormalised over it, so decoding stays exact. Needs a model
    with a separate ``body`` and head weight (the native runner).
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
        self.temperature = temperature
        self._cache: Cache | None = None
        # The native runner's body and head run separately: the head only on the last row.
        self._split_head = hasattr(model, "body") and hasattr(model, "head")
        self.shortlist = shortlist
        if shortlist is not None:
            if not self._split_head or not hasattr(model, "head_weight"):
                raise ValueError(
                    "shortlist: needs a draft model on the native runner "
                    f"(got {type(model).__name__})"
                )
            shortlist.bind(model.head_weight, model.embed, self.vocab_size, model.int8)

    def begin(self, state: DecodeState) -> None:
        prompt = state.tokens[:, : state.prompt_length]
        if bool((prompt >= self.model.vocab_size).any()):  # one host sync per request
            raise ValueError(
                f"draft: its vocabulary of {self.model.vocab_size} tokens is smaller than "
                f"token id {int(prompt.max())} in the prompt; use a draft with the target's "
                "tokenizer"
            )
        self._cache = self.model.new_cache(state.batch_size, state.capacity)
        if self.shortlist is not None:
            self.shortlist.begin(state.tokens[:, : state.prompt_length])
            self._seen = torch.full((state.batch_size,), state.prompt_length)
        head = state.prompt_length - 2  # propose() feeds the last two prompt tokens itself
        if head > 0:
            positions = torch.arange(head).expand(state.batch_size, -1)
            if self._split_head:  # the prompt's logits are not needed: skip the head
                self.model.body(state.tokens[:, :head], positions, self._cache)  # type: ignore[attr-defined]
            else:
                self.model.forward(state.tokens[:, :head], positions, self._cache)
            self._cache.commit(head)

    def propose(self, state: DecodeState) -> Draft:
        if self._cache is None:
            raise RuntimeError("propose() called before begin()")
        cache, params = self._cache, self._params(state.sampling)
        # Two tokens a step keep the batch on one shape; one only for a 1-token prompt's start.
        width = 2 if int(state.lengths.min()) >= 2 else 1
        cache.rollback(state.lengths - width)
        positions = (state.lengths - width).unsqueeze(1) + torch.arange(width)  # [B, width]
        # A padded target vocabulary can hold ids past the draft's: the draft reads such a
        # token as its last id. Only its proposal can change; the target verifies as always.
        inputs = state.tokens.gather(1, positions).clamp_max(self.model.vocab_size - 1)
        if self.shortlist is not None:
            # The tokens each row gained since the last step (its accepted output).
            lo, hi = int(self._seen.min()), int(state.lengths.max())
            index = torch.arange(lo, hi)
            valid = (index >= self._seen.unsqueeze(1)) & (index < state.lengths.unsqueeze(1))
            self.shortlist.extend(state.tokens[:, lo:hi][valid])
            self._seen = state.lengths.clone()
            return self._propose_shortlisted(state, inputs, positions, params)
        logits = self._logits(inputs, positions, cache)
        cache.commit(width)
        tokens, probs = [], []
        for i in range(self.num_tokens):
            token, prob = self._choose(logits, params, state.generator)
            tokens.append(token)
            probs.append(prob)
            if i + 1 < self.num_tokens:
                position = (state.lengths + i).unsqueeze(1)
                logits = self._logits(token.unsqueeze(1), position, cache)
                cache.commit(1)
        stacked = None if probs[0] is None else torch.stack(probs, dim=1)
        return Draft.chain(torch.stack(tokens, dim=1), stacked)

    def _propose_shortlisted(
        self,
        state: DecodeState,
        inputs: torch.Tensor,
        positions: torch.Tensor,
        params: SamplingParams,
    ) -> Draft:
        """The draft loop with a shortlisted head. The router of draft position t reads the
        token fed at t and the hidden state before it: at t = 0 both come from the first
        forward; later it can run while the body processes the previous draft token."""
        assert self._cache is not None and self.shortlist is not None
        cache, shortlist, model = self._cache, self.shortlist, self.model
        hidden = model.body(inputs, positions, cache)[0]
        cache.commit(inputs.shape[1])
        prev = hidden[:, -2] if inputs.shape[1] > 1 else torch.zeros_like(hidden[:, -1])
        shortlist.prepare(0, inputs[:, -1], prev)
        tokens, probs = [], []
        for i in range(self.num_tokens):
            last = hidden[:, -1]
            ids, logits = shortlist.logits(last)
            token, prob = self._choose_among(ids, logits.cpu(), params, state.generator)
            tokens.append(token)
            probs.append(prob)
            if i + 1 < self.num_tokens:
                shortlist.prepare(i + 1, token, last)
                position = (state.lengths + i).unsqueeze(1)
                hidden = model.body(token.unsqueeze(1), position, cache)[0]
                cache.commit(1)
        return Draft.chain(torch.stack(tokens, dim=1), torch.stack(probs, dim=1))

    def _choose_among(
        self,
        ids: torch.Tensor,
        logits: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample among the shortlisted ``ids`` [S] from their logits [B, S]: the draft
        distribution renormalised over the shortlist, zero elsewhere in the [B, V] result."""
        sub = probs_from_logits(logits, params)
        index = sample(sub, generator)
        probs = torch.zeros(logits.shape[0], self.vocab_size, dtype=sub.dtype)
        probs.scatter_(1, ids.expand(logits.shape[0], -1), sub)
        return ids[index], probs

    def observe(self, state: DecodeState, verdict: Verdict) -> None:
        """Nothing to learn: the next propose() rolls the cache back to what was accepted."""

    def _logits(self, tokens: torch.Tensor, positions: torch.Tensor, cache: Cache) -> torch.Tensor:
        """Full-vocabulary logits [B, V] after the last of ``tokens``."""
        if self._split_head:
            hidden = self.model.body(tokens, positions, cache)[0]  # type: ignore[attr-defined]
            logits = self.model.head(hidden[:, -1]).float().cpu()  # type: ignore[attr-defined]
        else:
            logits = self.model.forward(tokens, positions, cache).logits[:, -1].cpu()
        extra = self.vocab_size - logits.shape[-1]
        if extra > 0:
            return F.pad(logits, (0, extra), value=float("-inf"))
        return logits[..., : self.vocab_size] if extra < 0 else logits

    def _params(self, target: SamplingParams) -> SamplingParams:
        if self.temperature is None:
            return target
        return dataclasses.replace(target, temperature=self.temperature)

    def _choose(
        self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One draft token per row from logits [B, V]: (tokens [B], probs [B, V])."""
        probs = probs_from_logits(logits, params)
        return sample(probs, generator), probs
