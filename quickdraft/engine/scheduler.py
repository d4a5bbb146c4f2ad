"""Which request sits in which row, and how requests join and leave.

Every per-row table (the target's cache, the token buffer, a drafter's state) keeps the running
requests in rows 0..running-1, so that a decode step reads one contiguous block. Requests whose
prompt is still being prefilled sit at the end of the tables, the rows between are free:

    [ running ........ | free ........ | prefilling ]
      0        running-1                 rows-prefilling .. rows-1

A prompt that finishes prefilling moves to row ``running``; the row of a request that leaves is
filled by a running row past the new running count. Moves copy only a row's committed entries.
"""

from __future__ import annotations

from collections import deque

import torch

from quickdraft.drafters.base import Batch, Drafter, StepResult, pad_rows
from quickdraft.engine.requests import Request, Status
from quickdraft.models.base import Cache, Model


class Rows:
    """The engine's own per-row tables: each row's tokens (prompt, then output), length and
    request (which knows its row)."""

    def __init__(self, rows: int, capacity: int, device: torch.device):
        self.tokens = torch.zeros(rows, capacity, dtype=torch.long, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self.requests: list[Request | None] = [None] * rows

    def permute(self, first: int, order: list[int]) -> None:
        """Rows first..first+n-1 take rows ``order`` (a permutation of them)."""
        index = torch.tensor(order, dtype=torch.long, device=self.tokens.device)
        self.tokens[first : first + len(order)] = self.tokens[index]
        self.lengths[first : first + len(order)] = self.lengths[index]
        self.requests[first : first + len(order)] = [self.requests[i] for i in order]
        for row in range(first, first + len(order)):
            request = self.requests[row]
            if request is not None:
                request.row = row


class Scheduler:
    """Admits waiting requests into free rows, prefills their prompts in chunks of at most
    ``prefill_chunk`` tokens a step, and keeps the tables compact as requests join and leave.

    generator: the engine's, for rows without their own (it goes into every ``Batch``)."""

    def __init__(
        self,
        target: Model,
        cache: Cache,
        rows: Rows,
        drafter: Drafter | None,
        prefill_chunk: int,
        keep_hidden: tuple[bool, tuple[int, ...]],
        generator: torch.Generator,
    ):
        self.target, self.cache, self.rows, self.drafter = target, cache, rows, drafter
        self.prefill_chunk = prefill_chunk
        self.keep_hidden, self.keep_taps = keep_hidden
        self.generator = generator
        self.waiting: deque[Request] = deque()
        self.running = 0
        self.prefilling = 0

    @property
    def num_rows(self) -> int:
        return len(self.rows.requests)

    @property
    def first_prefilling(self) -> int:
        return self.num_rows - self.prefilling

    def batch_of(self, first: int, count: int) -> Batch:
        """The ``Batch`` over rows first..first+count-1 (views of the tables)."""
        requests = [r for r in self.rows.requests[first : first + count] if r is not None]
        return Batch(
            self.rows.tokens[first : first + count],
            self.rows.lengths[first : first + count],
            tuple(r.sampling for r in requests),
            tuple(r.generator for r in requests),
            self.generator,
        )

    def _permute(self, first: int, order: list[int]) -> None:
        self.cache.permute(
            first, torch.tensor(order, dtype=torch.long, device=self.cache.lengths.device)
        )
        self.rows.permute(first, order)

    # -- joining ----------------------------------------------------------------------------

    def admit(self) -> None:
        """Waiting requests take free rows, at the front of the prefilling block."""
        admitted: list[Request] = []
        while self.waiting and self.running + self.prefilling < self.num_rows:
            request = self.waiting.popleft()
            self.prefilling += 1
            request.row = self.first_prefilling
            request.status = Status.PREFILL
            self.rows.requests[request.row] = request
            admitted.append(request)
        if not admitted:
            return
        first, last = admitted[-1].row, admitted[0].row + 1
        width = max(len(r.prompt) for r in admitted)
        prompts = torch.zeros(last - first, width, dtype=torch.long)
        for request in admitted:
            prompts[request.row - first, : len(request.prompt)] = torch.tensor(request.prompt)
        device = self.rows.tokens.device
        self.rows.tokens[first:last, :width] = prompts.to(device)
        lengths = torch.tensor([len(r.prompt) for r in reversed(admitted)], device=device)
        self.rows.lengths[first:last] = lengths
        self.cache.lengths[first:last] = 0

    def prefill(self) -> None:
        """One chunk of every prefilling prompt, in one forward of the target (rows padded to
        the longest chunk; padding is written past each row's length and never committed)."""
        first = self.first_prefilling
        requests = [r for r in self.rows.requests[first:] if r is not None]
        counts = [min(r.to_prefill, self.prefill_chunk) for r in requests]
        width = max(counts, default=0)
        if width == 0:
            return
        device = self.rows.tokens.device
        starts = torch.tensor([r.prefilled for r in requests], device=device)
        positions = starts.unsqueeze(1) + torch.arange(width, device=device)
        last_slot = self.rows.tokens.shape[1] - 1
        tokens = self.rows.tokens[first:].gather(1, positions.clamp_max(last_slot))
        view = self.cache.narrow(first, len(counts))
        out = self.target.forward(tokens, positions, view)
        view.commit(torch.tensor(counts, device=device))
        for b, (request, count) in enumerate(zip(requests, counts, strict=True)):
            request.prefilled += count
            if count and self.keep_hidden:
                request.prompt_hidden.append(out.hidden[b, :count])
            if count and self.keep_taps:
                request.prompt_taps.append({i: out.taps[i][b, :count] for i in self.keep_taps})

    def join(self) -> None:
        """Prompts fully prefilled move next to the running rows and start decoding; the
        drafter begins them all at once."""
        region = range(self.running, self.num_rows)
        requests = self.rows.requests
        done = [r for r in region if requests[r] is not None and requests[r].to_prefill == 0]
        if not done:
            return
        free = [r for r in region if requests[r] is None]
        waiting = [r for r in region if requests[r] is not None and requests[r].to_prefill > 0]
        self._permute(self.running, done + free + waiting)
        first = self.running
        self.running += len(done)
        self.prefilling -= len(done)
        joined = [r for r in requests[first : self.running] if r is not None]
        for request in joined:
            request.status = Status.RUNNING
        if self.drafter is not None:
            self.drafter.begin(first, self._start(first, joined))
        for request in joined:
            request.prompt_hidden, request.prompt_taps = [], []

    def _start(self, first: int, joined: list[Request]) -> StepResult:
        """The prefill's features of the joined rows, padded to the longest prompt."""
        device = self.rows.tokens.device
        kept = torch.tensor([len(r.prompt) - 1 for r in joined], device=device)
        hidden = pad_rows([r.prompt_hidden for r in joined]) if self.keep_hidden else None
        taps = {
            layer: pad_rows([[t[layer] for t in r.prompt_taps] for r in joined])
            for layer in self.keep_taps
        }
        return StepResult(self.batch_of(first, len(joined)), kept, hidden, taps)

    # -- leaving ----------------------------------------------------------------------------

    def leave(self, leaving: list[Request]) -> None:
        """Free the rows of these requests. Running rows past the new running count fill the
        holes below it (the drafter reorders alike); prefilling rows close up at the end."""
        requests = self.rows.requests
        for request in leaving:
            request.status = Status.FINISHED
            requests[request.row] = None
        running = [r for r in range(self.running) if requests[r] is not None]
        if len(running) < self.running:
            count = len(running)
            order = list(range(self.running))
            holes = [r for r in range(count) if requests[r] is None]
            movers = [r for r in running if r >= count]
            for hole, mover in zip(holes, movers, strict=True):
                order[hole], order[mover] = mover, hole
            self._permute(0, order)
            if self.drafter is not None:
                self.drafter.reorder(
                    torch.tensor(order[:count], dtype=torch.long, device=self.cache.lengths.device)
                )
            self.running = count
        region = range(self.running, self.num_rows)
        prefilling = [r for r in region if requests[r] is not None]
        if len(prefilling) < self.prefilling:
            free = [r for r in region if requests[r] is None]
            self._permute(self.running, free + prefilling)
            self.prefilling = len(prefilling)
        free = torch.tensor(
            [r for r in range(self.running, self.num_rows) if requests[r] is None],
            dtype=torch.long,
        )
        self.cache.lengths[free.to(self.cache.lengths.device)] = 0
        self.rows.lengths[free.to(self.rows.lengths.device)] = 0

    def drop_waiting(self, request: Request) -> None:
        self.waiting.remove(request)
        request.status = Status.FINISHED
