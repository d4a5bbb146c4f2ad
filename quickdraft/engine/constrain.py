"""Structured outputs in the engine's step: each constrained request's matcher masks the
target's logits at every position of the verify pass (after the pending token and after each
draft node, along the node's own path), and then consumes what the request emitted.

Masking comes before temperature, top-k and top-p (vLLM's order), so top-k picks among the
allowed tokens. A draft token the grammar forbids has no probability under the masked target,
so every acceptance rule rejects it; the positions past it are never reached (they get its
parent's mask, any non-empty one would do). The logprobs a request asks for stay the raw
distribution's, as without a constraint.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

import torch

from quickdraft.constraints import Constraint, Grammars, Matcher
from quickdraft.drafters.base import Draft
from quickdraft.engine.requests import Request
from quickdraft.models.base import Tokenizer

log = logging.getLogger(__name__)

# Compiled constraints an engine keeps (the most recently used): a server that meets many
# distinct schemas compiles an old one again rather than growing without bound.
MAX_COMPILED = 256
HELD_SECONDS = 60.0  # how long a constraint compiled ahead of its request stays compiled


class Constraints:
    """The engine's grammars: its tokenizer's index (built at the first constrained request)
    and one compiled matcher per distinct constraint, copied for each request."""

    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.grammars: Grammars | None = None
        self.compiled: OrderedDict[Constraint, Matcher] = OrderedDict()
        # A server binds a request's constraint on a worker thread before it queues (a 400
        # there, and the compiling off the engine's thread) while the engine admits others.
        self._lock = threading.Lock()
        self._held: dict[Constraint, float] = {}  # compiled for a request not yet added

    def matcher(self, constraint: Constraint, held: bool = False) -> Matcher:
        """A matcher at the start of a request's output; ValueError naming the constraint's
        kind when this model cannot follow it. Safe from any thread. ``held``: a front end
        compiling ahead of ``Engine.add_request`` (on a worker, within its time bound), whose
        entry then outlives ``HELD_SECONDS`` of other constraints, so that the engine's thread
        finds it compiled and never compiles (and waits) itself."""
        if self.tokenizer is None:
            raise ValueError(f"{constraint.kind}: a constraint needs the engine's tokenizer")
        with self._lock:  # the tokenizer's index, built once
            if self.grammars is None:
                self.grammars = Grammars(self.tokenizer, self.vocab_size)
            template = self.compiled.get(constraint)
            if template is not None:
                self.compiled.move_to_end(constraint)
                return template.copy()
        # Compiled outside the lock: the engine adding a request whose constraint is
        # compiled never waits behind a worker compiling another's (two compiling one
        # constraint at once both do; the second's replaces the first's).
        template = self.grammars.matcher(constraint)
        with self._lock:
            self.compiled[constraint] = template
            self.compiled.move_to_end(constraint)
            if held:
                self._held[constraint] = time.monotonic()
            if len(self.compiled) > MAX_COMPILED:
                self._evict()
        return template.copy()

    def _evict(self) -> None:
        """Drop the least recently used entry that no front end compiled for a request in the
        last HELD_SECONDS (the oldest, if all were)."""
        now = time.monotonic()
        for key in list(self._held):
            if now - self._held[key] > HELD_SECONDS:
                del self._held[key]
        victim = next((key for key in self.compiled if key not in self._held), None)
        if victim is None:
            victim = next(iter(self.compiled))
        del self.compiled[victim]
        self._held.pop(victim, None)


def forced_draft(requests: list[Request], room: int, device: torch.device | str) -> Draft | None:
    """The grammar's forced continuation (keys, punctuation, closing brackets: what it allows
    as the only way on) as a draft of point masses, when every running request has one: a
    draft for free, no network run. ``room``: the most draft tokens a verify pass holds.
    None when some request has none (the drafter drafts as usual)."""
    if room < 1 or any(request.matcher is None for request in requests):
        return None
    forced = [request.matcher.forced()[:room] for request in requests]  # type: ignore[union-attr]
    if not all(forced):
        return None
    width = max(map(len, forced))
    rows = [row + [row[-1]] * (width - len(row)) for row in forced]  # filler: rejected or not
    return Draft.chain(torch.tensor(rows, dtype=torch.long, device=device))


def prune(draft: Draft, requests: list[Request]) -> Draft:
    """A point-mass draft without the nodes whose path the grammar forbids in every row (rows
    share the draft's shape; an unconstrained row keeps every node): no verify position is
    spent on a token that cannot be accepted. A sampled draft is left whole: dropping a node
    because of the token drawn there would change which distribution the rule samples."""
    if draft.probs is not None or draft.tokens.shape[1] == 0:
        return draft
    if any(request.matcher is None for request in requests):
        return draft
    parents, tokens = draft.parents.tolist(), draft.tokens.tolist()
    kept = torch.zeros(len(parents), dtype=torch.bool)
    for b, request in enumerate(requests):
        assert request.matcher is not None
        kept |= torch.tensor(reachable(request.matcher, tokens[b], parents), dtype=torch.bool)
    return draft.keep(kept)


def reachable(matcher: Matcher, tokens: list[int], parents: list[int]) -> list[bool]:
    """For each draft node, whether the grammar allows the tokens along its path from the
    root. The matcher ends where it began."""
    allowed = []
    for node in range(len(tokens)):
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        walk = [tokens[i] for i in reversed(path)]
        taken = matcher.advance(walk)
        # A token the matcher does not consume may still be allowed: the end token where the
        # output may end (the request stops there, so only as the path's last token).
        ends = taken == len(walk) - 1 and bool(matcher.allowed()[walk[-1]])
        allowed.append(taken == len(walk) or ends)
        matcher.rollback(taken)
    return allowed


def failed(requests: list[Request]) -> list[bool]:
    """Per request, whether its grammar has failed (``Matcher.error``): it allows nothing, so
    its row would be all -inf (NaN probabilities at a temperature, token 0 when greedy)."""
    return [request.matcher is not None and request.matcher.error is not None
            for request in requests]  # fmt: skip


def end_failed(requests: list[Request], before: list[bool], emitted: list[int]) -> None:
    """Finish with reason "error" every request whose grammar failed: those that had failed
    before this step's verify lose the tokens it gave them (their rows were left unmasked),
    those whose grammar failed consuming them keep them (they were allowed). The other
    requests of the batch go on."""
    for request, was, count in zip(requests, before, emitted, strict=True):
        if not was and (request.matcher is None or request.matcher.error is None):
            continue
        if was:
            request.drop_last(count)
        assert request.matcher is not None
        log.warning("request %s: its constraint failed (%s); it ends with finish reason "
                    "\"error\"", request.request_id, request.matcher.error)  # fmt: skip
        request.finish_reason = "error"


def mask_logits(
    logits: torch.Tensor, requests: list[Request], draft: Draft, skip: list[bool]
) -> torch.Tensor:
    """logits [B, N + 1, V] of the verify pass's pending token and draft nodes, with every
    constrained row's disallowed tokens at -inf (a copy; unconstrained rows unchanged, and
    the ``skip`` rows: requests whose grammar failed, which ``end_failed`` ends)."""
    rows = [b for b, request in enumerate(requests) if request.matcher is not None and not skip[b]]
    if not rows:
        return logits
    logits = logits.clone()
    parents = draft.parents.tolist()
    tokens = draft.tokens.tolist()
    for b in rows:
        matcher = requests[b].matcher
        assert matcher is not None
        masks = node_masks(matcher, tokens[b], parents)
        logits[b].masked_fill_(~masks.to(logits.device)[:, : logits.shape[-1]], float("-inf"))
    return logits


def node_masks(matcher: Matcher, tokens: list[int], parents: list[int]) -> torch.Tensor:
    """[1 + N, V] bool: the allowed tokens after the text (row 0) and after each draft node
    (row i + 1), along the node's path from the root. The matcher ends where it began."""
    masks = torch.zeros(1 + len(tokens), matcher.vocab_size, dtype=torch.bool)
    masks[0] = matcher.allowed()
    for node in range(len(tokens)):
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path.reverse()
        taken = matcher.advance([tokens[i] for i in path])
        if taken == len(path):
            masks[node + 1] = matcher.allowed()
        else:  # unreachable: a token on the path is forbidden, so the verify stops before
            masks[node + 1] = masks[parents[node] + 1]
        matcher.rollback(taken)
    return masks


def advance(requests: list[Request], chunk: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """Each constrained request consumes what it emitted this step (its accepted drafts and
    next token: chunk[b, : num_accepted[b] + 1])."""
    rows = [b for b, request in enumerate(requests) if request.matcher is not None]
    if not rows:
        return
    counts = num_accepted.tolist()
    emitted = chunk.tolist()
    for b in rows:
        matcher = requests[b].matcher
        assert matcher is not None
        matcher.advance(emitted[b][: counts[b] + 1])
