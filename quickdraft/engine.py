"""The decoding loop: draft, verify, accept, commit; plain decoding is the same loop with k = 0.

The loop knows neither which drafter nor which model family it runs: drafters implement
``Drafter``, models implement ``Model``, acceptance rules are pure functions from ``accept.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from numbers import Integral

import torch

from quickdraft.accept import (
    ACCEPT_RULES,
    TREE_RULES,
    AcceptFn,
    TreeAcceptFn,
    rejection_sampling,
    tree_rejection_sampling,
)
from quickdraft.config import Method, SamplingParams, SpecConfig
from quickdraft.drafters import Drafter, build_drafter
from quickdraft.drafters.base import DecodeState, Draft
from quickdraft.models.base import Model, Tokenizer
from quickdraft.models.tokenizer import valid_text
from quickdraft.output import BatchGeneration, Generation, StepOutput
from quickdraft.sampling import make_generator, probs_from_logits
from quickdraft.stats import Stats
from quickdraft.tree import TreeShape


class SpeculativeDecoder:
    """Runs one batch of equal-length prompts to completion.

    target: the model whose distribution the output follows.
    drafter: proposes tokens; None decodes autoregressively through the same loop.
    accept_fn: the acceptance rule for chain drafts (see ``accept.ACCEPT_RULES``).
    tree_accept_fn: the rule for tree drafts (``accept.TREE_RULES``), the same rule's tree form.
    tokenizer: optional; needed for text output and stop strings.
    """

    def __init__(
        self,
        target: Model,
        drafter: Drafter | None = None,
        accept_fn: AcceptFn = rejection_sampling,
        tokenizer: Tokenizer | None = None,
        tree_accept_fn: TreeAcceptFn = tree_rejection_sampling,
    ):
        if drafter is not None and drafter.vocab_size != target.vocab_size:
            raise ValueError(
                f"drafter: its vocabulary ({drafter.vocab_size}) differs from the target's "
                f"({target.vocab_size})"
            )
        taps = tuple(getattr(drafter, "target_taps", ()))
        if taps and not set(taps) <= set(getattr(target, "tap_layers", ())):
            tapping = getattr(target, "with_taps", None)
            if tapping is None:
                raise ValueError(
                    f"target: the drafter reads target layers {list(taps)}, which "
                    f"{type(target).__name__} cannot return"
                )
            target = tapping(taps)  # a view of the same weights that also returns them
        self.target = target
        self.drafter = drafter
        self.accept_fn = accept_fn
        self.tree_accept_fn = tree_accept_fn
        self.tokenizer = tokenizer

    @property
    def k(self) -> int:
        return 0 if self.drafter is None else self.drafter.num_tokens

    @property
    def depth(self) -> int:
        """Draft positions a verify step can accept: k for chains, a tree drafter's depth."""
        if self.drafter is None:
            return 0
        return int(getattr(self.drafter, "depth", self.drafter.num_tokens))

    def run(
        self,
        prompts: torch.Tensor,
        sampling: SamplingParams,
        on_step: Callable[[StepOutput], None] | None = None,
    ) -> BatchGeneration:
        """prompts: [B, L] long. Returns every row's new tokens and the run's statistics.

        on_step: called after every verify step with the output so far (for streaming).
        """
        self._validate(prompts, sampling)
        start = time.perf_counter()
        batch, prompt_len = prompts.shape
        k, target = self.k, self.target
        # The verify pass writes the pending token, k draft nodes and any side branch.
        side = int(getattr(self.drafter, "side_tokens", 0))
        capacity = prompt_len + sampling.max_new_tokens + k + side + 1
        generator = make_generator(sampling.seed)
        stats = Stats(k=self.depth, batch_size=batch)

        # 1. Prefill: the target caches all prompt tokens but the last, which stays pending.
        #    The first verify step then reads [last prompt token, d_1 .. d_k], exactly like
        #    every later step, so even the first generated token can come from the draft.
        cache = target.new_cache(batch, capacity)
        tokens = torch.zeros(batch, capacity, dtype=torch.long)
        tokens[:, :prompt_len] = prompts
        state = DecodeState(
            tokens, torch.full((batch,), prompt_len), prompt_len, sampling, generator
        )
        if prompt_len > 1:
            positions = torch.arange(prompt_len - 1).expand(batch, -1)
            prefill = target.forward(prompts[:, :-1], positions, cache)
            cache.commit(prompt_len - 1)
            state.target_hidden = prefill.hidden[:, -1]
            state.fresh_hidden, state.fresh_taps = prefill.hidden, prefill.taps
            state.fresh_count = torch.full((batch,), prompt_len - 1)
        output = StepOutput(state, sampling, self.tokenizer)
        if self.drafter is not None:
            self.drafter.begin(state)  # the drafter's own prompt pass counts as prefill
        stats.time_prefill = time.perf_counter() - start

        while output.active.any():
            # 2. Draft: k candidate tokens after the pending one.
            tick = time.perf_counter()
            draft = self._propose(state)
            tock = time.perf_counter()
            stats.time_draft += tock - tick

            # 3. Verify: one target forward over [pending, draft nodes]; a tree draft attends
            #    along its branches only.
            #    A side branch (lookahead) rides along after the draft, seen by nothing else.
            side = draft.side
            tree = side is not None or not draft.is_chain
            shape = TreeShape.from_parents(draft.parents) if tree else None
            lengths = state.lengths
            inputs = torch.cat([tokens.gather(1, (lengths - 1).unsqueeze(1)), draft.tokens], 1)
            offsets = torch.arange(inputs.shape[1]) if shape is None else shape.position_offsets
            mask = None if shape is None else shape.mask
            if side is not None:
                assert shape is not None
                inputs = torch.cat([inputs, side.tokens], 1)
                offsets = torch.cat([offsets, side.offsets])
                mask = _with_side(shape.mask, side.mask)
            positions = (lengths - 1).unsqueeze(1) + offsets
            verified = target.forward(inputs, positions, cache, tree_mask=mask)
            stats.target_forwards += 1
            verified_logits = verified.logits
            if side is not None:
                state.side_logits = verified_logits[:, draft.tokens.shape[1] + 1 :]
                verified_logits = verified_logits[:, : draft.tokens.shape[1] + 1]

            # 4. Accept: the accepted drafts (a path, for a tree), and the corrected or bonus
            #    token.
            target_probs = probs_from_logits(verified_logits.cpu(), sampling)
            if shape is None:
                verdict = self.accept_fn(draft.tokens, draft.probs, target_probs, generator)
                path = torch.arange(draft.tokens.shape[1]).expand(batch, -1)
            else:
                verdict = self.tree_accept_fn(
                    draft.tokens, shape, draft.probs, target_probs, generator
                )
                assert verdict.path is not None
                path = verdict.path
            stats.time_verify += time.perf_counter() - tock

            # 5. Commit: the output gains the accepted drafts and the next token; the target's
            #    cache keeps the pending token and the accepted nodes of rows still going.
            num_accepted = verdict.num_accepted
            depth = path.shape[1] if shape is None else shape.max_depth
            stats.record(num_accepted[output.active], depth)
            accepted = draft.tokens.gather(1, path.clamp_min(0))  # [B, depth]
            chunk = torch.cat([accepted, verdict.next_token.unsqueeze(1)], 1)
            chunk.scatter_(1, num_accepted.unsqueeze(1), verdict.next_token.unsqueeze(1))
            output.append(chunk, num_accepted + 1, num_accepted)
            if on_step is not None:
                on_step(output)
            # Verify-input index of each kept node: the root (0), then the path's nodes.
            kept = torch.cat([torch.zeros(batch, 1, dtype=torch.long), path.clamp_min(0) + 1], 1)
            num_kept = torch.where(output.active, num_accepted + 1, 0)
            if shape is None:
                cache.commit(num_kept)
            else:
                cache.commit_path(kept, num_kept)
            last = kept.gather(1, num_accepted.unsqueeze(1)).squeeze(1)  # made next_token
            hidden = verified.hidden
            rows = torch.arange(batch, device=hidden.device)
            state.target_hidden = hidden[rows, last.to(hidden.device)]
            fresh = kept.to(hidden.device)
            state.fresh_hidden = hidden[rows.unsqueeze(1), fresh]
            state.fresh_taps = {i: t[rows.unsqueeze(1), fresh] for i, t in verified.taps.items()}
            state.fresh_count = num_kept
            if self.drafter is not None:
                self.drafter.observe(state, verdict)

        stats.time_total = time.perf_counter() - start
        return output.result(stats)

    def _propose(self, state: DecodeState) -> Draft:
        if self.drafter is None:
            empty = torch.zeros(state.batch_size, 0, dtype=torch.long)
            return Draft.chain(empty, None)
        return self.drafter.propose(state)

    def _validate(self, prompts: torch.Tensor, sampling: SamplingParams) -> None:
        if prompts.dim() != 2 or prompts.dtype != torch.long:
            raise ValueError(
                f"prompts must be a [B, L] long tensor, got {tuple(prompts.shape)} {prompts.dtype}"
            )
        if prompts.shape[1] == 0:
            raise ValueError("prompt: empty prompt; give at least one token")
        if bool((prompts < 0).any()) or bool((prompts >= self.target.vocab_size).any()):
            raise ValueError(f"prompt: token ids must lie in [0, {self.target.vocab_size})")
        needed = prompts.shape[1] + sampling.max_new_tokens
        if needed > self.target.max_positions:
            raise ValueError(
                f"prompt: {prompts.shape[1]} prompt tokens + max_new_tokens "
                f"{sampling.max_new_tokens} exceed the model's context of "
                f"{self.target.max_positions} positions"
            )
        if sampling.stop and self.tokenizer is None:
            raise ValueError("stop: stop strings need a tokenizer")


def _with_side(tree_mask: torch.Tensor, side_mask: torch.Tensor) -> torch.Tensor:
    """[1 + N + E]^2: the draft's tree mask, then the side branch, which sees the pending
    token (index 0) and its own tokens as ``side_mask`` says; the draft never sees it."""
    nodes, extra = tree_mask.shape[0], side_mask.shape[0]
    mask = torch.zeros(nodes + extra, nodes + extra, dtype=torch.bool)
    mask[:nodes, :nodes] = tree_mask
    mask[nodes:, 0] = True
    mask[nodes:, nodes:] = side_mask
    return mask


def _as_batch(
    prompt: str | Sequence[int] | torch.Tensor, tokenizer: Tokenizer | None
) -> torch.Tensor:
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("prompt: a text prompt needs a tokenizer")
        prompt = tokenizer.encode(valid_text("prompt", prompt))
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() != 1:
            raise ValueError(f"prompt must be one row of token ids, got shape {prompt.shape}")
        if prompt.dtype.is_floating_point or prompt.dtype == torch.bool:
            raise ValueError(f"prompt: token ids must be integers, got {prompt.dtype}")
        return prompt.to(torch.long).unsqueeze(0)
    try:
        ids = list(prompt)  # an iterator is read once, here
    except TypeError:
        raise ValueError(f"prompt must be a text or a list of token ids, got {prompt!r}") from None
    if not all(isinstance(t, Integral) and not isinstance(t, bool) for t in ids):
        raise ValueError("prompt: token ids must be integers (one row of them)")
    try:
        return torch.as_tensor(ids, dtype=torch.long).unsqueeze(0)
    except (RuntimeError, OverflowError, TypeError, ValueError):
        raise ValueError("prompt: token ids must be integers below 2**63") from None


def _decoder(
    target: Model,
    spec: SpecConfig | None,
    draft: Model | Drafter | None,
    tokenizer: Tokenizer | None,
    draft_tokenizer: Tokenizer | None,
) -> SpeculativeDecoder:
    if spec is None:
        spec = SpecConfig(method=Method.AR if draft is None else Method.DRAFT_MODEL)
    if draft is not None and hasattr(draft, "propose"):
        drafter: Drafter | None = draft  # type: ignore[assignment]
    else:
        same = None
        if tokenizer is not None and draft_tokenizer is not None:
            same = same_vocabulary(tokenizer, draft_tokenizer)
        drafter = build_drafter(spec, target, draft, same_tokenizer=same)  # type: ignore
    return SpeculativeDecoder(
        target, drafter, ACCEPT_RULES[spec.acceptance], tokenizer, TREE_RULES[spec.acceptance]
    )


def same_vocabulary(a: Tokenizer, b: Tokenizer) -> bool:
    """Whether two tokenizers map text to the same ids (padded model vocabularies may differ)."""
    if a is b:
        return True
    compare = getattr(a, "same_vocabulary", None)
    return bool(compare(b)) if compare is not None else False


def generate(
    target: Model,
    prompt: str | Sequence[int],
    *,
    sampling: SamplingParams | None = None,
    spec: SpecConfig | None = None,
    draft: Model | Drafter | None = None,
    tokenizer: Tokenizer | None = None,
    draft_tokenizer: Tokenizer | None = None,
    on_step: Callable[[StepOutput], None] | None = None,
) -> Generation:
    """Generate a continuation of one prompt.

    With neither ``spec`` nor ``draft`` this is plain autoregressive decoding; with a draft model
    and no spec it is draft-model speculation at k = 4 with rejection sampling. Give
    ``draft_tokenizer`` too when the draft's vocabulary size differs (padding) from the
    target's. ``on_step`` sees the output after every verify step, for streaming.
    """
    sampling = sampling or SamplingParams()
    decoder = _decoder(target, spec, draft, tokenizer, draft_tokenizer)
    out = decoder.run(_as_batch(prompt, tokenizer), sampling, on_step)
    return Generation(
        out.token_ids[0],
        None if out.texts is None else out.texts[0],
        out.finish_reasons[0],
        out.from_draft[0],
        out.stats,
    )


def generate_batch(
    target: Model,
    prompts: torch.Tensor | Sequence[Sequence[int]],
    *,
    sampling: SamplingParams | None = None,
    spec: SpecConfig | None = None,
    draft: Model | Drafter | None = None,
    tokenizer: Tokenizer | None = None,
    draft_tokenizer: Tokenizer | None = None,
) -> BatchGeneration:
    """Generate for a batch of equal-length prompts ([B, L] token ids), all rows at once."""
    batch = torch.as_tensor(prompts, dtype=torch.long)
    if batch.dim() != 2:
        raise ValueError(f"prompts must be [B, L] token ids of equal length, got {batch.shape}")
    decoder = _decoder(target, spec, draft, tokenizer, draft_tokenizer)
    return decoder.run(batch, sampling or SamplingParams())
