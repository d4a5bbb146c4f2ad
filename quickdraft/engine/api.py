"""``generate`` and ``generate_batch``: the engine, for callers who have their prompts now."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from quickdraft.config import Method, SamplingParams, SpecConfig
from quickdraft.drafters.base import Drafter
from quickdraft.engine.core import Engine
from quickdraft.engine.prompts import encode, token_ids
from quickdraft.engine.requests import RequestOutput
from quickdraft.models.base import Model, Tokenizer
from quickdraft.output import BatchGeneration, Generation


def generate(
    target: Model,
    prompt: str | Sequence[int],
    *,
    sampling: SamplingParams | None = None,
    spec: SpecConfig | None = None,
    draft: Model | Drafter | None = None,
    tokenizer: Tokenizer | None = None,
    draft_tokenizer: Tokenizer | None = None,
    on_step: Callable[[RequestOutput], None] | None = None,
) -> Generation:
    """Generate a continuation of one prompt.

    With neither ``spec`` nor ``draft`` this is plain autoregressive decoding; with a draft model
    and no spec it is draft-model speculation at k = 4 with rejection sampling. Give
    ``draft_tokenizer`` too when the draft's vocabulary size differs (padding) from the
    target's. ``on_step`` sees the request's output after every step, for streaming.
    """
    sampling = sampling or SamplingParams()
    ids = token_ids(encode(prompt, tokenizer), target.vocab_size)
    engine = _engine(target, spec, draft, tokenizer, draft_tokenizer, [ids], sampling)
    return run_request(engine, ids, sampling, on_step)


def run_request(
    engine: Engine,
    prompt_ids: Sequence[int],
    sampling: SamplingParams,
    on_step: Callable[[RequestOutput], None] | None = None,
) -> Generation:
    """One request through ``engine`` (an idle one: nothing else is queued or running), to
    its end: what ``generate`` does with the engine it builds, for callers that keep an
    engine between requests (its prefix cache and its drafter's memory carry over)."""
    rid = engine.add_request(prompt_ids, sampling)
    last = None
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid:
                last = out
                if on_step is not None:
                    on_step(out)
    assert last is not None and last.finish_reason is not None
    return Generation(last.token_ids, last.text, last.finish_reason, last.from_draft, last.stats)


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
    """Generate for a batch of prompts (token ids, of any lengths), all rows at once.

    The rows share ``sampling``; its seed seeds the batch as a whole (rows draw different
    samples). For a seed per prompt, use ``Engine`` with one ``SamplingParams`` each."""
    sampling = sampling or SamplingParams()
    if isinstance(prompts, torch.Tensor) and prompts.dim() != 2:
        raise ValueError(f"prompts must be [B, L] token ids, got shape {tuple(prompts.shape)}")
    if isinstance(prompts, str | bytes):
        raise ValueError("prompts must be rows of token ids, got text")
    rows = [token_ids(row, target.vocab_size) for row in prompts]
    if not rows:
        raise ValueError("prompts: give at least one prompt")
    engine = _engine(target, spec, draft, tokenizer, draft_tokenizer, rows, sampling)
    shared = dataclasses.replace(sampling, seed=None)  # the engine's generator has the seed
    ids = [engine.add_request(row, shared) for row in rows]
    finished: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    outs = [finished[i] for i in ids]
    stats = engine.stats
    stats.batch_size = len(rows)
    stats.new_tokens = sum(len(o.token_ids) for o in outs)
    return BatchGeneration(
        [o.token_ids for o in outs],
        None if tokenizer is None else [o.text or "" for o in outs],
        [o.finish_reason or "length" for o in outs],
        [o.from_draft for o in outs],
        stats,
    )


def _engine(
    target: Model,
    spec: SpecConfig | None,
    draft: Model | Drafter | None,
    tokenizer: Tokenizer | None,
    draft_tokenizer: Tokenizer | None,
    rows: list[list[int]],
    sampling: SamplingParams,
) -> Engine:
    """An engine sized for these prompts: a row each, every prompt prefilled in one pass, the
    batch's shared generator seeded with ``sampling.seed``. A drafter given as ``draft`` is
    used as it is, with the spec's acceptance rule, batch policy and adaptive k (its method is
    then the drafter's own); no spec means plain decoding, or draft-model speculation when a draft
    model is given."""
    sizing = {
        "max_batch": len(rows),
        "max_model_len": _length(target, rows, sampling),
        "prefill_chunk": max(len(r) for r in rows),
        "seed": sampling.seed,
    }
    return build_engine(target, spec, draft, tokenizer, draft_tokenizer, **sizing)


def build_engine(
    target: Model,
    spec: SpecConfig | None,
    draft: Model | Drafter | None,
    tokenizer: Tokenizer | None = None,
    draft_tokenizer: Tokenizer | None = None,
    **sizing: Any,
) -> Engine:
    """An engine for ``spec`` with ``draft`` (a draft model, or a built drafter used as it is,
    with the spec's acceptance rule, batch policy and adaptive k); ``sizing``: the other
    arguments of ``Engine`` (max_batch, max_model_len, prefill_chunk, seed, ...)."""
    sizing["tokenizer"] = tokenizer
    if draft is not None and not isinstance(draft, Model):
        policy = SpecConfig() if spec is None else spec
        return Engine(
            target,
            draft,
            acceptance=policy.acceptance,
            disable_by_batch_size=policy.disable_by_batch_size,
            adaptive_k=policy.adaptive_k,
            **sizing,
        )
    if spec is None:
        spec = SpecConfig(method=Method.AR if draft is None else Method.DRAFT_MODEL)
    return Engine.from_spec(target, spec, draft, draft_tokenizer=draft_tokenizer, **sizing)


def _length(target: Model, rows: list[list[int]], sampling: SamplingParams) -> int:
    """The engine length these prompts need; a clear error past the model's context."""
    longest = max(len(r) for r in rows)
    needed = longest + sampling.max_new_tokens
    if needed > target.max_positions:
        raise ValueError(
            f"prompt: {longest} prompt tokens + max_new_tokens {sampling.max_new_tokens} "
            f"exceed the model's context of {target.max_positions} positions"
        )
    return needed
