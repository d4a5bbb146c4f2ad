"""Which request holds which slot, which prompts prefill which chunk, and who decodes.

A slot is one row of every per-row table: the target's cache, the engine's token and length
tables, every drafter's per-row state. A request takes the lowest free slot when it is admitted
and keeps it, prefilling and then decoding, until it leaves; nothing ever moves between slots:

    slot     0          1          2          3          4          5
          [ running | prefill  |   free   | running  | running  |   free   ]

A step's decode batch is the running requests in slot order (here slots 0, 3, 4). When they are
contiguous (one request, a full table) every table gives views of them, with no copy; with
holes, as above, the tables are read by slot index (``Slots``, ``Cache.select``) and what the
step writes goes back to those slots. The scheduler only plans and keeps the bookkeeping; the
runner (``engine.runner``) executes the target.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from dataclasses import dataclass

import torch

from quickdraft.drafters.base import Batch, StepResult, pad_rows
from quickdraft.engine.requests import Request, Status
from quickdraft.models.base import ModelOutput, Slots

MIXED = object()  # a slot's kept text came from more than one tenant


@dataclass(frozen=True, slots=True)
class Usage:
    """``Engine.usage()``: where the requests are and what they hold."""

    waiting: int
    prefilling: int
    running: int
    rows_in_use: int
    rows: int
    cached_tokens: int
    # The drafter's own gauges, for drafters that keep some (``gauges()``: suffix decoding's
    # trie size, lookups and hits).
    drafter: dict[str, float] = dataclasses.field(default_factory=dict)


# Prefill passes a short prompt may sit out so as not to be padded to a long one's width.
MAX_PREFILL_WAITS = 2


class Rows:
    """The engine's own per-slot tables: each slot's tokens (prompt, then output) and length,
    and the request holding it (which knows its slot)."""

    def __init__(self, slots: int, capacity: int, device: torch.device):
        self.device = device
        self.tokens = torch.zeros(slots, capacity, dtype=torch.long, device=device)
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        self.requests: list[Request | None] = [None] * slots

    def batch(self, slots: Slots, generator: torch.Generator) -> Batch:
        """The ``Batch`` of these slots' requests: views of the tables when the slots are
        contiguous, else copies that ``append`` keeps in step with the tables."""
        requests = [r for r in (self.requests[slot] for slot in slots.host) if r is not None]
        assert len(requests) == len(slots), "a slot without a request"
        return Batch(
            slots.take(self.tokens),
            slots.take(self.lengths),
            slots,
            tuple(r.sampling for r in requests),
            tuple(r.generator for r in requests),
            generator,
        )

    def append(self, batch: Batch, chunk: torch.Tensor, counts: torch.Tensor) -> None:
        """Write each row's chunk [B, W] after its length and advance the lengths by counts
        [B] (entries of a chunk past its count are scratch past the new length). A view
        writes through; a gathered batch is written, then its new tokens and lengths go back
        to its slots in the tables."""
        positions = batch.lengths.unsqueeze(1) + torch.arange(chunk.shape[1], device=self.device)
        positions = positions.clamp_max(batch.capacity - 1)
        batch.tokens.scatter_(1, positions, chunk)
        batch.lengths.add_(counts)
        slots = batch.slots
        if slots.first is None:  # a gathered copy: write back what changed
            self.tokens[slots.index.unsqueeze(1), positions] = chunk
            self.lengths[slots.index] = batch.lengths


@dataclass(frozen=True, slots=True)
class Prefill:
    """One step's prefill: the next chunk of each prefilling prompt, in slot order.

    requests: the prompts' requests; slots: theirs.
    starts:   the first prompt position of each chunk (what its slot has cached so far).
    counts:   the tokens of each chunk (at least one).
    """

    requests: tuple[Request, ...]
    slots: Slots
    starts: tuple[int, ...]
    counts: tuple[int, ...]


class Scheduler:
    """Admits waiting requests into the lowest free slots, plans the prefill of their prompts
    in chunks of at most ``prefill_chunk`` tokens a step, starts them decoding when their
    prompts are cached and frees their slots when they leave.

    keep_hidden: (whether the drafter reads the prompt's final hidden states, the target
        layers whose outputs it reads), kept from the prefill chunks until the request joins.
    generator: the engine's, for requests without their own (it goes into every ``Batch``)."""

    def __init__(
        self,
        rows: Rows,
        prefill_chunk: int,
        keep_hidden: tuple[bool, tuple[int, ...]],
        generator: torch.Generator,
    ):
        self.rows = rows
        self.prefill_chunk = prefill_chunk
        self.keep_hidden, self.keep_taps = keep_hidden
        # A feature drafter resumes a slot at r cached tokens with the features of position r
        # on (its entry r - 1 pairs position r - 1's feature with token r): the target keeps
        # one token less than the prompts share, and recomputes the feature there.
        self.features = bool(self.keep_hidden or self.keep_taps)
        self.generator = generator
        self.waiting: deque[Request] = deque()
        self._running: Slots | None = None  # the running requests' slots; None: to rebuild
        self._passed_over: dict[int, int] = {}  # slot -> prefill passes its prompt sat out
        self._left_by: dict[int, object] = {}  # slot -> tenant of its last request, or MIXED

    @property
    def num_rows(self) -> int:
        """Slots in all: the most requests prefilling and decoding at once."""
        return len(self.rows.requests)

    def held(self, status: Status) -> list[Request]:
        """The requests in this status (PREFILL or RUNNING), in slot order."""
        return [r for r in self.rows.requests if r is not None and r.status is status]

    @property
    def running(self) -> int:
        return len(self.held(Status.RUNNING))

    @property
    def prefilling(self) -> int:
        return len(self.held(Status.PREFILL))

    def usage(self, cache_lengths: torch.Tensor, gauges: dict[str, float]) -> Usage:
        """``Engine.usage``: ``cache_lengths`` [slots] the target cache's per slot."""
        held = [r.slot for r in self.rows.requests if r is not None]
        index = torch.tensor(held, dtype=torch.long, device=cache_lengths.device)
        return Usage(
            waiting=len(self.waiting),
            prefilling=self.prefilling,
            running=self.running,
            rows_in_use=len(held),
            rows=self.num_rows,
            cached_tokens=int(cache_lengths[index].sum()) if held else 0,
            drafter=gauges,
        )

    # -- joining ----------------------------------------------------------------------------

    def admit(self, cached: torch.Tensor | None = None) -> tuple[Slots, torch.Tensor] | None:
        """Waiting requests take free slots, their prompts written there; their slots and the
        prompt tokens each finds cached already (None when none was admitted).

        cached: [slots] the target cache's entries per slot, for prefix caching: a freed slot
            keeps the last request's entries until it is taken again, so a prompt that begins
            with that request's text (a session's next turn: the last prompt and reply, then
            more) takes the free slot holding the most of its prefix and prefills only the
            rest; a prompt that shares nothing takes the lowest free slot holding no reusable
            cache, so caches live as long as there is room. None: no prefix caching; a
            request takes the lowest free slot."""
        free = [slot for slot, r in enumerate(self.rows.requests) if r is None]
        if not self.waiting or not free:
            return None
        valid: list[int] = []
        if cached is not None:  # a host read of both tables' lengths per admission
            valid = torch.minimum(cached.cpu(), self.rows.lengths.cpu() - 1).tolist()
        reusable = [slot for slot in free if valid and valid[slot] > 0]
        holding = set(reusable)
        plain = iter([slot for slot in free if slot not in holding] + reusable)
        coming = list(itertools.islice(self.waiting, len(free)))
        shared = self._shared(coming, reusable, valid)  # [requests, reusable slots]
        taken: set[int] = set()
        admitted: list[Request] = []
        for row, request in enumerate(coming):
            self.waiting.popleft()
            slot, reused = -1, 0
            if shared is not None:
                best = int(shared[row].argmax())  # the first of the longest: slots ascend
                reused = max(int(shared[row, best]) - self.features, 0)
                if reused > 0:
                    slot = reusable[best]
                    shared[:, best] = -1  # taken
            if slot < 0:
                slot = next(s for s in plain if s not in taken)
                if shared is not None and slot in holding:
                    shared[:, reusable.index(slot)] = -1
            taken.add(slot)
            request.slot, request.prefilled = slot, reused
            request.stats.cached_prompt_tokens = reused
            same = self._left_by.get(slot, "") == request.sampling.tenant  # "": no tenant's
            request.stats.cached_own_tokens = reused if same else 0
            # A slot whose kept prefix came from another tenant holds both tenants' text from
            # now on: it counts as nobody's own (MIXED equals no tenant), else a later request
            # of either could learn how much of the other's text it shares.
            self._left_by[slot] = request.sampling.tenant if same or not reused else MIXED
            request.status = Status.PREFILL
            self._passed_over.pop(request.slot, None)
            self.rows.requests[request.slot] = request
            admitted.append(request)
        admitted.sort(key=lambda r: r.slot)
        width = max(len(r.prompt) for r in admitted)
        prompts = torch.zeros(len(admitted), width, dtype=torch.long)
        for i, request in enumerate(admitted):
            prompts[i, : len(request.prompt)] = torch.tensor(request.prompt)
        slots = Slots.of([r.slot for r in admitted], self.rows.device)
        self.rows.tokens[slots.index, :width] = prompts.to(self.rows.device)
        lengths = torch.tensor([len(r.prompt) for r in admitted], device=self.rows.device)
        self.rows.lengths[slots.index] = lengths
        return slots, torch.tensor([r.prefilled for r in admitted], device=self.rows.device)

    def _shared(
        self, requests: list[Request], slots: list[int], valid: list[int]
    ) -> torch.Tensor | None:
        """[R, C] how many of each request's prompt tokens, all but its last (which is
        verified, not prefilled), each of these free slots holds cached from its last
        request: their common prefix. None when no slot holds any."""
        if not slots:
            return None
        n = min(max(valid[s] for s in slots), max(len(r.prompt) for r in requests) - 1)
        if n <= 0:
            return None
        device = self.rows.device
        prompts = torch.full((len(requests), n), -1, dtype=torch.long)  # -1 matches no token
        for i, request in enumerate(requests):
            head = request.prompt[: min(n, len(request.prompt) - 1)]
            prompts[i, : len(head)] = torch.tensor(head, dtype=torch.long)
        index = torch.tensor(slots, device=device)
        cached = torch.tensor([valid[s] for s in slots], device=device)
        same = prompts.to(device).unsqueeze(1) == self.rows.tokens[index, :n].unsqueeze(0)
        same &= torch.arange(n, device=device) < cached.unsqueeze(1)  # [R, C, n]
        return same.to(torch.uint8).cumprod(2).sum(2)  # [R, C]

    def prefill(self) -> Prefill | None:
        """The next chunk of the prompts still to prefill whose chunks are at least half the
        widest one's, None when there is none. Rows of one pass are padded to its widest
        chunk, so a short prompt beside a long one would cost the long one's width: it waits
        a step instead and goes with prompts of its own length. One passed over
        ``MAX_PREFILL_WAITS`` times goes with the next pass whatever its width, so none waits
        behind a stream of long prompts."""
        requests = [r for r in self.held(Status.PREFILL) if r.to_prefill > 0]
        if not requests:
            return None
        counts = {r.slot: min(r.to_prefill, self.prefill_chunk) for r in requests}
        widest = max(counts.values())
        chosen = []
        for request in requests:
            waited = self._passed_over.get(request.slot, 0)
            if 2 * counts[request.slot] >= widest or waited >= MAX_PREFILL_WAITS:
                chosen.append(request)
                self._passed_over.pop(request.slot, None)
            else:
                self._passed_over[request.slot] = waited + 1
        requests = chosen
        return Prefill(
            tuple(requests),
            Slots.of([r.slot for r in requests], self.rows.device),
            tuple(r.prefilled for r in requests),
            tuple(counts[r.slot] for r in requests),
        )

    def prefilled(self, plan: Prefill, out: ModelOutput) -> None:
        """The chunks of ``plan`` are cached (``out``: the target's pass over them); their
        requests keep the features the drafter reads when they join."""
        for b, (request, count) in enumerate(zip(plan.requests, plan.counts, strict=True)):
            request.prefilled += count
            if self.keep_hidden:
                request.prompt_hidden.append(out.hidden[b, :count])
            if self.keep_taps:
                request.prompt_taps.append({i: out.taps[i][b, :count] for i in self.keep_taps})

    def join(self) -> StepResult | None:
        """Prompts fully prefilled start decoding in the slots they hold; the prefill's
        features of them all (for ``Drafter.begin``), None when none joined."""
        joined = [r for r in self.held(Status.PREFILL) if r.to_prefill == 0]
        if not joined:
            return None
        for request in joined:
            request.status = Status.RUNNING
        self._running = None
        device = self.rows.device
        reused = [r.stats.cached_prompt_tokens if self.features else 0 for r in joined]
        kept = [len(r.prompt) - 1 - c for r, c in zip(joined, reused, strict=True)]
        kept = torch.tensor(kept, device=device)
        hidden = pad_rows([r.prompt_hidden for r in joined]) if self.keep_hidden else None
        taps = {
            layer: pad_rows([[t[layer] for t in r.prompt_taps] for r in joined])
            for layer in self.keep_taps
        }
        for request in joined:
            request.prompt_hidden, request.prompt_taps = [], []
        batch = self.rows.batch(Slots.of([r.slot for r in joined], device), self.generator)
        return StepResult(batch, kept, hidden, taps)

    def decode(self) -> tuple[Batch, list[Request]] | None:
        """The running requests (slot order) and their ``Batch``; None when none runs."""
        requests = self.held(Status.RUNNING)
        if not requests:
            return None
        if self._running is None:
            self._running = Slots.of([r.slot for r in requests], self.rows.device)
        return self.rows.batch(self._running, self.generator), requests

    # -- leaving ----------------------------------------------------------------------------

    def leave(self, leaving: list[Request]) -> None:
        """Free the slots of these requests (prefilling or running). Nothing is copied or
        cleared: a slot's next request overwrites what this one left in every table."""
        for request in leaving:
            request.status = Status.FINISHED
            self.rows.requests[request.slot] = None
            request.slot = -1
        if leaving:
            self._running = None

    def drop_waiting(self, request: Request) -> None:
        self.waiting.remove(request)
        request.status = Status.FINISHED
