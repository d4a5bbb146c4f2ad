"""One choice's output as it grows, and the OpenAI response bodies built from it: whole
responses, stream chunks, usage, logprobs, and the ``quickdraft`` extension object."""

from __future__ import annotations

import math
from typing import Any

from quickdraft.config import SamplingParams
from quickdraft.engine.requests import RequestOutput, StepDetail, TokenLogprob
from quickdraft.models.tokenizer import HFTokenizer
from quickdraft.server.detok import TextStream
from quickdraft.server.tokens import TokenTexts
from quickdraft.stats import Stats

LOGPROB_FLOOR = -9999.0  # what OpenAI reports for a token the model rules out; JSON has no -inf


class Choice:
    """One engine request of an HTTP request: choice ``index`` of its response."""

    def __init__(
        self,
        index: int,
        request_id: str,
        prompt: list[int],
        sampling: SamplingParams,
        tokenizer: HFTokenizer,
        tokens: TokenTexts,
        *,
        keep_steps: bool = True,
        redact: bool = False,
    ):
        """keep_steps: keep the verify steps' JSON for the whole response (a stream sends
        each with its chunk and keeps none). redact: show no draft token the target rejected
        (a drafter that pools requests' text: it may be another client's)."""
        self.index, self.request_id = index, request_id
        self.redact = redact
        self.prompt, self.sampling = prompt, sampling
        self.tokens = tokens
        self.stream = TextStream(tokenizer, sampling.stop)
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.text = ""  # the whole output's text once finished (the engine's, stop-cut)
        self.offset = 0  # characters of token text reported in logprobs (text_offset)
        self.finish_reason: str | None = None
        self.stats: Stats | None = None
        self.steps: list[dict[str, Any]] | None = None
        if sampling.draft_steps and keep_steps:
            self.steps = []

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, out: RequestOutput) -> tuple[str, list[TokenLogprob], list[dict[str, Any]]]:
        """(new text safe to send, new tokens' logprobs, new verify steps as JSON) from one
        step's output."""
        self.token_ids += out.new_token_ids
        new_logprobs = out.new_logprobs or []
        self.logprobs += new_logprobs
        steps = [self.step_json(detail) for detail in out.new_steps or []]
        if self.steps is not None:
            self.steps += steps
        if out.finished:  # the final text, cut before a stop string the last tokens made
            self.finish_reason = out.finish_reason
            self.stats = out.stats
            self.text = out.text or ""
            piece = self.stream.finish(self.text)
        else:
            piece = self.stream.add(out.new_token_ids)
        return piece, new_logprobs, steps

    def _token(self, token_id: int) -> dict[str, Any]:
        """A token of a step: its id, its text (U+FFFD for bytes of a character it does not
        complete) and its bytes, which a client decodes in order to show the output's text."""
        return {
            "id": token_id,
            "text": self.tokens.text(token_id),
            "bytes": list(self.tokens.bytes(token_id)),
        }

    def step_json(self, step: StepDetail) -> dict[str, Any]:
        """One verify step as the ``steps`` extension sends it: each draft node (token, its
        text and bytes, its parent), the accepted nodes, the target's own token and its
        origin, and how many of the step's tokens the output kept. A redacted node (see
        ``redact``) keeps its place and parent, its id, text and bytes null: the accepted
        nodes are the client's own output, the rejected ones may be another's text."""
        kept = set(step.accepted)
        return {
            "draft": [
                {**self._token(token), "parent": parent}
                if node in kept or not self.redact
                else {"id": None, "text": None, "bytes": None, "parent": parent}
                for node, (token, parent) in enumerate(zip(step.draft, step.parents, strict=True))
            ],
            "accepted": list(step.accepted),
            "token": self._token(step.token),
            "origin": step.origin,
            "emitted": step.emitted,
        }

    # -- logprobs in the two endpoints' shapes ----------------------------------------------

    def completion_logprobs(self, items: list[TokenLogprob]) -> dict[str, Any] | None:
        if self.sampling.logprobs is None:
            return None
        tokens, offsets = [], []
        for item in items:
            text = self.tokens.text(item.token_id)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [_finite(item.logprob) for item in items],
            "top_logprobs": [
                {self.tokens.text(t): _finite(lp) for t, lp in item.top} for item in items
            ],
            "text_offset": offsets,
        }

    def chat_logprobs(self, items: list[TokenLogprob]) -> dict[str, Any] | None:
        if self.sampling.logprobs is None:
            return None

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            raw = self.tokens.bytes(token_id)
            return {
                "token": self.tokens.text(token_id),
                "logprob": _finite(logprob),
                "bytes": list(raw),
            }

        return {
            "content": [
                {
                    **entry(item.token_id, item.logprob),
                    "top_logprobs": [entry(*t) for t in item.top],
                }
                for item in items
            ],
            "refusal": None,
        }

    def extension(self) -> dict[str, Any]:
        """The ``quickdraft`` object of a finished choice: its speculation at a glance."""
        stats = self.stats
        if stats is None:
            return {}
        steps = stats.verify_steps
        return {
            "accepted_length": _finite_or_none(stats.mean_accepted_length),
            # Draft tokens its verify steps held on average: k, or what adaptive k chose.
            "draft_tokens_per_step": sum(stats.drafted) / steps if steps else None,
            "target_forwards": stats.target_forwards,
            "accepted_drafts": sum(stats.accepted_drafts),
            "time_s": stats.time_total,
        }


def usage(choices: list[Choice]) -> dict[str, Any]:
    """OpenAI's usage: each distinct prompt counted once, every choice's tokens; of the
    prompt tokens, those found cached (prefix caching: a distinct prompt's most), counting
    only prefixes a request of the same tenant (API key) left: the cache is shared, but
    whether another client sent a prefix is not told (``Stats.cached_own_tokens``)."""
    prompts: dict[int, int] = {}
    cached: dict[int, int] = {}
    for choice in choices:
        prompts.setdefault(id(choice.prompt), len(choice.prompt))
        found = 0 if choice.stats is None else choice.stats.cached_own_tokens
        cached[id(choice.prompt)] = max(cached.get(id(choice.prompt), 0), found)
    prompt_tokens = sum(prompts.values())
    completion = sum(len(c.token_ids) for c in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": sum(cached.values())},
    }


def extension(choices: list[Choice], method: str) -> dict[str, Any]:
    """The response's ``quickdraft`` object: the method, and every choice's verify steps
    together (accepted length: tokens a verify step gave, on average)."""
    steps = accepted = drafted = forwards = 0
    for choice in choices:
        if choice.stats is not None:
            steps += choice.stats.verify_steps
            accepted += sum(choice.stats.accepted_drafts)
            drafted += sum(choice.stats.drafted)
            forwards += choice.stats.target_forwards
    return {
        "method": method,
        "accepted_length": 1 + accepted / steps if steps else None,
        "draft_tokens_per_step": drafted / steps if steps else None,
        "target_forwards": forwards,
    }


def _finite(value: float) -> float:
    return value if math.isfinite(value) else LOGPROB_FLOOR


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
