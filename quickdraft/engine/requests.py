"""A request's life in the engine: its sampling, its own generator, its output as it grows,
the checks that finish it, and what ``Engine.step`` reports of it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum, StrEnum

import torch

from quickdraft.config import SamplingParams
from quickdraft.constraints import Matcher
from quickdraft.drafters.base import Draft
from quickdraft.models.base import Tokenizer
from quickdraft.sampling import make_generator
from quickdraft.stats import Stats


class Status(Enum):
    WAITING = "waiting"  # added, not yet in a slot
    PREFILL = "prefill"  # in a slot, its prompt going through the target chunk by chunk
    RUNNING = "running"  # decoding with the others
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """An emitted token's log-probability under the target, and the most likely tokens' at
    its position, most likely first (``SamplingParams.logprobs`` of them)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class Origin(StrEnum):
    """Where a step's last token comes from (``StepDetail.origin``)."""

    CORRECTED = "corrected"  # the target rejected every draft child of the last accepted node
    BONUS = "bonus"  # the accepted path reached the end of its branch
    PLAIN = "plain"  # nothing was drafted


@dataclass(frozen=True, slots=True)
class StepDetail:
    """One verify step of one request, as a page showing speculation draws it
    (``SamplingParams.draft_steps``).

    draft: the draft's token ids for this request, () when the step drafted nothing. A
        lookup drafter pads a row that found no match with a filler token when other rows of
        the batch did match: the filler shows here as a (rejected) draft, as it does in the
        statistics.
    parents: each draft node's parent (-1: a child of the pending token); a chain's are
        -1, 0, 1, ...
    accepted: the accepted nodes' indices into ``draft``, root first.
    token: the target's own token after them: drawn from the residual (the target's argmax
        at temperature 0) when it corrects a rejection, from the target's distribution when
        it is a bonus or plain decoding.
    origin: ``Origin`` of ``token``.
    emitted: how many of the step's tokens (the accepted drafts, then ``token``) the output
        kept: fewer when a stop token, a stop string or max_new_tokens ends it inside the
        step.
    """

    draft: tuple[int, ...]
    parents: tuple[int, ...]
    accepted: tuple[int, ...]
    token: int
    origin: Origin
    emitted: int


def step_details(
    rows: list[list[int]], parents: tuple[int, ...], emitted: list[int]
) -> list[StepDetail]:
    """The ``StepDetail`` of each row of one step from one host copy: rows [R][N + D + 2],
    each row's draft tokens (N), accepted path (D, -1 past the accepted count), accepted
    count and next token; parents [N], shared by the rows; emitted [R]."""
    width = len(parents)
    branching = set(parents)  # nodes with a child; -1 stands for the pending token
    details = []
    for row, kept in zip(rows, emitted, strict=True):
        draft, path, (count, token) = row[:width], row[width:-2], row[-2:]
        nodes = tuple(path[:count])
        last = nodes[-1] if nodes else -1
        origin = Origin.CORRECTED if last in branching else Origin.BONUS
        if not draft:
            origin = Origin.PLAIN
        details.append(StepDetail(tuple(draft), parents, nodes, token, origin, kept))
    return details


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """What one ``step`` did for one request.

    new_token_ids: the tokens it gained this step; new_from_draft: for each, whether it was a
    draft token the target accepted. token_ids / from_draft: everything so far.
    finish_reason: "stop" (a stop token or string), "length" (max_new_tokens), "abort", or
    None while it runs. text: the output's text (cut before a stop string) once finished,
    when the engine has a tokenizer; None before (decode ``token_ids`` to stream text).
    new_logprobs: one ``TokenLogprob`` per new token when the request asked for them
    (``SamplingParams.logprobs``), else None.
    new_steps: the verify steps since the last report (``StepDetail``) when the request asked
    for them (``SamplingParams.draft_steps``), else None.
    """

    request_id: str
    new_token_ids: list[int]
    new_from_draft: list[bool]
    token_ids: list[int]
    from_draft: list[bool]
    finished: bool
    finish_reason: str | None
    text: str | None
    stats: Stats
    new_logprobs: list[TokenLogprob] | None = None
    new_steps: list[StepDetail] | None = None


class Request:
    """One prompt and everything the engine keeps of it between steps (outside the per-slot
    tables, which hold its tokens and cache)."""

    def __init__(
        self,
        request_id: str,
        prompt: list[int],
        sampling: SamplingParams,
        tokenizer: Tokenizer | None,
        depth: int,
    ):
        self.request_id = request_id
        self.prompt = prompt
        self.sampling = sampling
        self.tokenizer = tokenizer
        # Seeded: its own generator, so its draws never depend on the batch around it.
        self.generator = None if sampling.seed is None else make_generator(sampling.seed)
        self.status = Status.WAITING
        self.slot = -1  # its slot (row of every per-row table) while it holds one
        self.prefilled = 0  # prompt tokens the target has cached (all but the last, at most)
        self.prompt_hidden: list[torch.Tensor] = []  # per prefill chunk, for Needs.hidden
        self.prompt_taps: list[dict[int, torch.Tensor]] = []
        self.output: list[int] = []
        self.from_draft: list[bool] = []
        self.logprobs: list[TokenLogprob] | None = None if sampling.logprobs is None else []
        self.steps: list[StepDetail] | None = [] if sampling.draft_steps else None
        self.reported = 0  # output tokens already returned by step()
        self.reported_steps = 0
        self.finish_reason: str | None = None
        self.stats = Stats(k=depth)
        self.matcher: Matcher | None = None  # its place in its constraint's grammar
        self.arrival = time.perf_counter()
        stop_ids = set(sampling.stop_token_ids)
        if tokenizer is not None and not sampling.ignore_eos:
            stop_ids.update(tokenizer.eos_token_ids)
        self.stop_ids = frozenset(stop_ids)

    @property
    def to_prefill(self) -> int:
        """Prompt tokens the target still has to cache: all but the last, which stays
        pending for the first verify step."""
        return len(self.prompt) - 1 - self.prefilled

    def extend(
        self, tokens: list[int], drafted: int, logprobs: list[TokenLogprob] | None = None
    ) -> int:
        """Append a step's tokens (the first ``drafted`` accepted drafts) and their logprobs
        when asked for, stopping at a stop token, max_new_tokens or a stop string. Returns how
        many were kept."""
        room = self.sampling.max_new_tokens - len(self.output)
        keep = min(len(tokens), room)
        for i, token in enumerate(tokens[:keep]):
            if token in self.stop_ids:
                keep = i + 1
                self.finish_reason = "stop"
                break
        self.output += tokens[:keep]
        self.from_draft += [i < drafted for i in range(keep)]
        if self.logprobs is not None and logprobs is not None:
            self.logprobs += logprobs[:keep]
        if self.finish_reason is None and len(self.output) >= self.sampling.max_new_tokens:
            self.finish_reason = "length"
        if self.sampling.stop:
            cut = self._stop_string_cut(keep)
            if cut is not None:
                removed = len(self.output) - cut
                del self.output[cut:], self.from_draft[cut:]
                if self.logprobs is not None:
                    del self.logprobs[cut:]
                keep -= removed
                self.finish_reason = "stop"
        return keep

    def drop_last(self, count: int) -> None:
        """Forget the last ``count`` output tokens (a step's, when its request fails)."""
        if count:
            del self.output[-count:], self.from_draft[-count:]
            if self.logprobs is not None:
                del self.logprobs[-count:]

    def _stop_string_cut(self, added: int) -> int | None:
        """The output length that ends at the first token completing a stop string, when the
        last ``added`` tokens completed one. Only a tail is decoded: the new tokens and as
        many before them as the longest stop string has UTF-8 bytes, so a long output costs no
        more per step than a short one. Bytes, not characters: a byte-level tokenizer splits
        one character over several tokens (SmolLM2 spends two on 结), and counting characters
        missed such a stop when the tokens came one a step but found it when a speculative
        step brought them together, so the output depended on speculation. Every token but
        the special ones (which decode to nothing and are stop ids when they end a turn)
        decodes to at least one byte."""
        assert self.tokenizer is not None
        decode, stops = self.tokenizer.decode, self.sampling.stop
        reach = max(len(s.encode("utf-8")) for s in stops) + 1
        first = len(self.output) - added

        def completes(end: int) -> bool:
            text = decode(self.output[max(0, first - reach) : end])
            return any(s in text for s in stops)

        if not completes(len(self.output)):
            return None
        return next(n for n in range(max(1, first), len(self.output) + 1) if completes(n))

    def text(self) -> str | None:
        if self.tokenizer is None:
            return None
        text = self.tokenizer.decode(self.output)
        cut = min((text.find(s) for s in self.sampling.stop if s in text), default=len(text))
        return text[:cut]

    def report(self) -> RequestOutput:
        """The tokens since the last report, and the state now."""
        new = slice(self.reported, len(self.output))
        self.reported = len(self.output)
        steps = None
        if self.steps is not None:
            steps = self.steps[self.reported_steps :]
            self.reported_steps = len(self.steps)
        finished = self.status is Status.FINISHED
        if finished:
            self.stats.new_tokens = len(self.output)
            self.stats.time_total = time.perf_counter() - self.arrival
        return RequestOutput(
            self.request_id,
            self.output[new],
            self.from_draft[new],
            list(self.output),
            list(self.from_draft),
            finished,
            self.finish_reason,
            self.text() if finished else None,
            self.stats,
            None if self.logprobs is None else self.logprobs[new],
            steps,
        )


def record_details(
    requests: list[Request],
    draft: Draft,
    path: torch.Tensor,
    num_accepted: torch.Tensor,
    next_token: torch.Tensor,
    emitted: list[int],
) -> None:
    """The step's draft and verdict for the requests that asked (``draft_steps``), appended
    to their ``steps``. path: [B, D]; num_accepted, next_token: [B] on the engine's device.
    A host read of those rows' draft, only when some request asked."""
    asking = [i for i, request in enumerate(requests) if request.steps is not None]
    if not asking:
        return
    rows = torch.tensor(asking, device=path.device)
    tokens = draft.tokens[rows.to(draft.tokens.device)].to(path.device)
    verdict = torch.cat([path, num_accepted[:, None], next_token[:, None]], 1)[rows]
    details = step_details(
        torch.cat([tokens, verdict], 1).tolist(),  # the one host read, only when asked
        tuple(draft.parents.tolist()),  # a host tensor (the tree's shape)
        [emitted[i] for i in asking],
    )
    for i, detail in zip(asking, details, strict=True):
        steps = requests[i].steps
        assert steps is not None
        steps.append(detail)


def extend_outputs(
    requests: list[Request],
    chunk: torch.Tensor,
    num_accepted: torch.Tensor,
    depth: int,
    logprobs: list,
    stats: Stats,
) -> list[int]:
    """Each request gains its row of the step's ``chunk`` [B, W] (its ``num_accepted`` [B]
    drafts and the next token) and checks its stops; the step's draft ``depth`` and
    acceptance go into its statistics and the engine's ``stats``. Returns how many of its
    chunk's tokens each request kept. The one read of the step's tokens to the host."""
    emitted = []
    accepted_rows = num_accepted.tolist()
    for request, row, accepted, row_logprobs in zip(
        requests, chunk.tolist(), accepted_rows, logprobs, strict=True
    ):
        emitted.append(request.extend(row[: accepted + 1], accepted, row_logprobs))
        request.stats.accepted_drafts.append(accepted)
        request.stats.drafted.append(depth)
    stats.accepted_drafts.extend(accepted_rows)
    stats.drafted.extend([depth] * len(requests))
    return emitted


def record_times(records: list[Stats], prefill: float, draft: float, verify: float) -> None:
    """One verify step's target forward and seconds, in each of these records."""
    for stats in records:
        stats.target_forwards += 1
        stats.time_prefill += prefill
        stats.time_draft += draft
        stats.time_verify += verify
