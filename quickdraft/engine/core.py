"""The serving engine: requests join and leave at any step; each step drafts, verifies,
accepts and commits for every running request at once.

The engine knows no drafter by name: a drafter declares what it needs (``Needs``) and reads
it from the ``Batch`` and ``StepResult`` it is handed. Every tensor of the loop lives on the
target's device. Host syncs a step, by name: the cache's longest row (attention width), the
acceptance walk's "all rows done" checks, one read of the accepted tokens for the
requests' outputs and stop checks, and, only for requests that ask for their steps
(``SamplingParams.draft_steps``), one read of their draft and verdict.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence
from typing import Any

import torch

from quickdraft.accept import ACCEPT_RULES, TREE_RULES, AcceptFn, TreeAcceptFn
from quickdraft.config import (
    DEFAULT_DISABLE_BY_BATCH_SIZE,
    MAX_BATCH,
    MAX_SEED,
    AcceptRule,
    SamplingParams,
    SpecConfig,
    accept_rule,
    check_batch_policy,
    check_range,
)
from quickdraft.drafters.base import Batch, Draft, Drafter, Needs
from quickdraft.engine import constrain
from quickdraft.engine.constrain import Constraints
from quickdraft.engine.costs import verify_costs
from quickdraft.engine.goodput import GoodputRule
from quickdraft.engine.learned import learned
from quickdraft.engine.prompts import check_request
from quickdraft.engine.requests import (
    Request,
    RequestOutput,
    Status,
    extend_outputs,
    record_details,
    record_times,
)
from quickdraft.engine.runner import ModelRunner
from quickdraft.engine.scheduler import Rows, Scheduler, Usage
from quickdraft.engine.verify import (
    accept_rows,
    emitted_logprobs,
    emitted_tokens,
    greedy_drafted,
    greedy_undrafted,
)
from quickdraft.models.base import FeatureModel, Model, Slots, Tokenizer
from quickdraft.sampling import make_generator, probs_for_rows
from quickdraft.stats import Stats

# The longest prompt + output an engine takes by default; the target's own limit if lower.
DEFAULT_MAX_MODEL_LEN = 4096
DEFAULT_MAX_BATCH = 8
DEFAULT_PREFILL_CHUNK = 512


class Engine:
    """Continuous batching with speculative decoding.

    target: the model whose distribution every request follows.
    drafter: proposes tokens; None decodes autoregressively through the same step.
        ``Engine.from_spec`` builds the engine with the drafter a ``SpecConfig`` names, which
        is how a spec and a drafter meet: this constructor takes no method.
    acceptance: the acceptance rule (``AcceptRule``); rejection sampling by default.
    disable_by_batch_size: the batch policy (``SpecConfig.disable_by_batch_size``): above
        that many running requests a step decodes without drafting; None always drafts.
    max_batch: slots of the tables: the most requests prefilling and decoding at once; more
        wait their turn.
    max_model_len: the longest prompt + max_new_tokens a request may ask for.
    prefill_chunk: the most prompt tokens of one request the target prefills in one step.
    seed: seeds the generator that requests without a seed of their own share.
    rules: (chain rule, tree rule) in place of ``acceptance``'s, for tests that prove
        a broken rule is caught.
    adaptive_k: size each step's draft by expected goodput (``engine.goodput``): the k
        (0 .. the drafter's) of a chain drafter that shortens, the best prefix of other
        drafts, or no draft at all while plain decoding is faster, from the running requests'
        acceptance, the drafter's cost and this host's verify costs, measured at the engine's
        start (``engine.costs``: about a second, once per host and model). On by default;
        steps whose tokens must be reproducible (a seeded sampled request) are not sized.
    prefix_caching: a request takes the free slot whose cache holds the most of its prompt's
        beginning, left by the slot's last request, and prefills only the rest (a session's
        next turn: its last prompt and reply, then the new message). With drafters that read
        the prompt's features only where they keep their own per slot (``Needs.resumes``:
        EAGLE; not Medusa, which needs the whole prefill).
    """

    def __init__(
        self,
        target: Model,
        drafter: Drafter | None = None,
        *,
        acceptance: AcceptRule | str = AcceptRule.REJECTION_SAMPLING,
        disable_by_batch_size: int | None = DEFAULT_DISABLE_BY_BATCH_SIZE,
        tokenizer: Tokenizer | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_model_len: int | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        seed: int | None = None,
        rules: tuple[AcceptFn, TreeAcceptFn] | None = None,
        adaptive_k: bool = True,
        prefix_caching: bool = True,
    ):
        acceptance = accept_rule(acceptance)
        check_batch_policy(disable_by_batch_size)
        limit = target.max_positions
        if max_model_len is None:
            max_model_len = min(limit, DEFAULT_MAX_MODEL_LEN)
        for name, value, high in (
            ("max_batch", max_batch, MAX_BATCH),
            ("prefill_chunk", prefill_chunk, MAX_BATCH),
            ("max_model_len", max_model_len, limit),
        ):
            check_range(name, value, 1, high, integer=True)
        if seed is not None:
            check_range("seed", seed, 0, MAX_SEED, integer=True)
        prefill_chunk = min(prefill_chunk, max_model_len)  # a chunk past that never fills
        self.needs = Needs(0, 0) if drafter is None else drafter.needs
        if drafter is not None and drafter.vocab_size != target.vocab_size:
            raise ValueError(
                f"drafter: its vocabulary ({drafter.vocab_size}) differs from the target's "
                f"({target.vocab_size})"
            )
        # Measured (or read back) on the model as given: a tapping view is a new object each
        # engine, and its few extra copies are what the rule's per-width correction absorbs.
        sized = adaptive_k and drafter is not None and self.needs.tokens > 0
        costs = verify_costs(target) if sized else None
        if self.needs.taps:
            if not isinstance(target, FeatureModel):
                raise ValueError(
                    f"target: the drafter reads target layers {list(self.needs.taps)}, which "
                    f"{type(target).__name__} cannot return"
                )
            target = target.with_taps(self.needs.taps)  # same weights, also returns them
        self.target, self.drafter, self.tokenizer = target, drafter, tokenizer
        self.chain_rule, self.tree_rule = rules or (
            ACCEPT_RULES[acceptance],
            TREE_RULES[acceptance],
        )
        # A lossless stock rule at temperature 0 is token matching (``greedy_drafted``).
        self.token_matching = rules is None and acceptance.lossless
        self.disable_by_batch_size = disable_by_batch_size
        self.max_model_len = max_model_len
        self.device = target.device
        # Room past the longest request: a verify pass's draft and side branch, or prefill
        # padding (rows prefilling together are padded to the widest chunk).
        verify = self.needs.tokens + self.needs.side_tokens
        capacity = max_model_len + max(verify, prefill_chunk if max_batch > 1 else 0) + 1
        self.cache = target.new_cache(max_batch, capacity)
        self.rows = Rows(max_batch, capacity, self.device)
        if drafter is not None:
            drafter.reserve(max_batch, capacity)
        self.goodput = None
        if costs is not None:
            host = learned(drafter, costs)  # what engines over this drafter learned
            self.goodput = GoodputRule(self.needs, max_batch, costs, host)
        self.seeded = seed is not None
        features = self.needs.hidden or bool(self.needs.taps)
        self.prefix_caching = prefix_caching and (not features or self.needs.resumes)
        self.generator = make_generator(seed, self.device)
        keep = (self.needs.hidden, self.needs.taps)
        self.scheduler = Scheduler(self.rows, prefill_chunk, keep, self.generator)
        self.runner = ModelRunner(target, self.cache, self.rows, self.needs)
        self.requests: dict[str, Request] = {}
        self.constraints = Constraints(tokenizer, target.vocab_size)
        self.stats = Stats(k=self.needs.depth)  # every step of this engine's life
        self._ids = itertools.count()
        self._aborted: list[Request] = []

    @classmethod
    def from_spec(
        cls,
        target: Model,
        spec: SpecConfig,
        draft: Model | None = None,
        *,
        draft_tokenizer: Tokenizer | None = None,
        draft_name: str | None = None,
        target_name: str | None = None,
        **engine: Any,
    ) -> Engine:
        """An engine that speculates as ``spec`` says: its drafter built from the spec
        (``drafters.registry.build_drafter``; ``draft`` is the draft model of methods that
        take one), its acceptance rule and batch policy. ``draft_tokenizer`` with
        ``tokenizer`` checks that draft and target share a vocabulary; ``engine``: the
        other arguments of ``Engine`` (tokenizer, max_batch, max_model_len, ...)."""
        from quickdraft.drafters.registry import build_drafter
        from quickdraft.models.tokenizer import same_vocabulary

        tokenizer = engine.get("tokenizer")
        same = None
        if tokenizer is not None and draft_tokenizer is not None:
            same = same_vocabulary(tokenizer, draft_tokenizer)
        drafter = build_drafter(
            spec,
            target,
            draft,
            same_tokenizer=same,
            draft_name=draft_name,
            target_name=target_name,
        )
        return cls(
            target,
            drafter,
            acceptance=spec.acceptance,
            disable_by_batch_size=spec.disable_by_batch_size,
            adaptive_k=spec.adaptive_k,
            **engine,
        )

    # -- requests ---------------------------------------------------------------------------

    def add_request(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> str:
        """Queue a prompt (token ids); it joins the running requests at a coming step."""
        sampling = SamplingParams() if sampling is None else sampling
        if not isinstance(sampling, SamplingParams):
            raise ValueError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        request_id = str(next(self._ids)) if request_id is None else request_id
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self.requests:
            raise ValueError(f"request_id: {request_id!r} is already running")
        prompt = self.check_request(prompt_ids, sampling)
        request = Request(request_id, prompt, sampling, self.tokenizer, self.needs.depth)
        if sampling.constraint is not None:  # a bad one fails here, before it queues
            request.matcher = self.constraints.matcher(sampling.constraint)
        if request.generator is not None and self.device.type != "cpu":
            request.generator = make_generator(sampling.seed, self.device)
        self.requests[request_id] = request
        self.scheduler.waiting.append(request)
        return request_id

    def abort(self, request_id: str) -> None:
        """Stop a request now; the next ``step`` reports it with finish reason "abort"."""
        request = self.requests.get(request_id)
        if request is None or request.status is Status.FINISHED:
            return
        if request.status is Status.WAITING:
            self.scheduler.drop_waiting(request)
        else:
            if request.status is Status.PREFILL and self.scheduler.features:
                # Its chunks replaced the slot's cache past the prefix it reused, but a
                # feature drafter is realigned only when a request joins, so it still holds
                # the slot's last text there: keep only the prefix both hold.
                view = self.cache.select(Slots.of([request.slot], self.device))
                view.rollback(request.stats.cached_prompt_tokens)
            if self.drafter is not None:
                self.drafter.release(request.slot, completed=False)
            self.scheduler.leave([request])
        request.finish_reason = "abort"
        self._aborted.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.requests) or bool(self._aborted)

    def take_stats(self) -> Stats:
        """The statistics of the steps since the last call (or since the engine began), and a
        fresh record from now: a long-lived engine's record stays small."""
        stats, self.stats = self.stats, Stats(k=self.needs.depth)
        return stats

    def usage(self) -> Usage:
        """Requests waiting for a slot, prefilling and decoding; the slots (rows) and cached
        tokens they hold (what a server exports as gauges)."""
        gauges = getattr(self.drafter, "gauges", None)  # suffix decoding's trie, say
        return self.scheduler.usage(self.cache.lengths, gauges() if gauges else {})

    # -- the step ---------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One step for every running request: what each gained, and which finished."""
        reports = [self._report(r) for r in self._aborted]
        self._aborted = []
        start = time.perf_counter()
        # 1. Schedule: waiting requests take free slots (the one caching most of their prompt)
        #    and prefill a chunk of the rest; finished prompts start decoding in the slots
        #    they hold (their last token stays pending, so the first verify reads [last
        #    prompt token, d_1 .. d_k] like every later one). Nothing moves between slots.
        running = self._schedule(start)
        if running is None:
            return reports
        batch, requests = running
        tick = time.perf_counter()

        # 2. Propose: the drafter's candidates (none above the batch policy's threshold).
        draft = self._propose(batch, requests)
        tock = time.perf_counter()

        # 3. Verify: one target forward over [pending, draft nodes, side branch].
        out = self.runner.verify(batch, draft)
        nodes = draft.tokens.shape[1] + 1

        # 4. Accept: the accepted path and the corrected or bonus token of every row.
        failed = constrain.failed(requests)
        logits = constrain.mask_logits(out.logits[:, :nodes], requests, draft, failed)
        greedy = all(params.greedy for params in batch.sampling)
        if greedy and nodes == 1:
            num_accepted, next_token, path = greedy_undrafted(logits)
        elif greedy and self.token_matching:
            num_accepted, next_token, path = greedy_drafted(logits, draft)
        else:
            target_probs = probs_for_rows(logits, batch.sampling)
            num_accepted, next_token, path = accept_rows(
                self.chain_rule, self.tree_rule, draft, target_probs, batch
            )
        verified = time.perf_counter()

        # 5. Commit: the cache keeps the pending token and the accepted nodes; the slots'
        #    tokens and the requests' outputs gain the accepted drafts and the next token.
        kept = self.runner.commit(batch.slots, draft, path, num_accepted)
        chunk = emitted_tokens(draft, path, num_accepted, next_token)
        constrain.advance(requests, chunk, num_accepted)
        tops = [r.sampling.logprobs for r in requests]
        logprobs = emitted_logprobs(out.logits, kept, chunk, tops)
        self.rows.append(batch, chunk, num_accepted + 1)
        emitted = extend_outputs(requests, chunk, num_accepted, draft.depth, logprobs, self.stats)
        record_details(requests, draft, path, num_accepted, next_token, emitted)
        constrain.end_failed(requests, failed, emitted)

        # 6. Observe: the drafter reads what it declared, at the kept positions.
        if self.drafter is not None:
            self.drafter.observe(self.runner.result(batch, draft, out, kept, num_accepted))
        done = time.perf_counter()

        if self.goodput is not None:
            spent = (tock - tick, verified - tock, done - verified)  # not the prefill
            self.goodput.update(list(batch.slots.host), draft, num_accepted.tolist(), *spent)

        # 7. Record: every request's statistics; finished requests free their slots.
        spent = (tick - start, (done - verified) + (tock - tick), verified - tock)
        record_times([self.stats] + [r.stats for r in requests], *spent)
        leaving = [r for r in requests if r.finish_reason is not None]
        if self.drafter is not None:
            for request in leaving:
                self.drafter.release(request.slot, completed=True)
        self.scheduler.leave(leaving)
        self.stats.time_total += time.perf_counter() - start
        return reports + [self._report(r) for r in requests]

    # -- the step's parts -------------------------------------------------------------------

    def _schedule(self, start: float) -> tuple[Batch, list[Request]] | None:
        """Step 1: admit, prefill a chunk of every prompt still prefilling, start the prompts
        done (the drafter begins them). The running requests and their batch; None when no
        request runs (the step was all prefill)."""
        scheduler = self.scheduler
        caching = self.prefix_caching and bool(scheduler.waiting)
        admitted = scheduler.admit(self._cached() if caching else None)
        if admitted is not None:
            self.runner.reset(*admitted)
        plan = scheduler.prefill()
        if plan is not None:
            scheduler.prefilled(plan, self.runner.prefill(plan))
        joined = scheduler.join()
        if joined is not None and self.drafter is not None:
            self.drafter.begin(joined)
            if self.goodput is not None:
                self.goodput.begin(joined.batch.slots.host)
        prefill = time.perf_counter() - start
        for request in scheduler.held(Status.PREFILL):
            request.stats.time_prefill += prefill
        running = scheduler.decode()
        if running is None:
            self.stats.time_prefill += prefill
            self.stats.time_total += prefill
        return running

    def _cached(self) -> torch.Tensor:
        """[slots] the leading tokens of each slot's last text a request may reuse: the
        target's cache, and for a feature drafter no more than it holds plus the one token
        whose feature the target recomputes (``Scheduler.features``)."""
        if not self.scheduler.features:
            return self.cache.lengths
        held = self.drafter.resumable().to(self.cache.lengths.device)  # type: ignore[union-attr]
        return torch.minimum(self.cache.lengths, held + 1)

    def _propose(self, batch: Batch, requests: list[Request]) -> Draft:
        threshold = self.disable_by_batch_size
        if self.drafter is None or (threshold is not None and batch.size > threshold):
            return Draft.empty(batch.size, self.device)
        room = min(self.needs.tokens, self.needs.depth)  # a chain: a position a token
        forced = constrain.forced_draft(requests, room, self.device)
        if forced is not None:  # the drafter follows the step as one it left undrafted
            return forced
        if any(r.matcher is not None for r in requests):
            batch = dataclasses.replace(batch, matchers=tuple(r.matcher for r in requests))
        if self.goodput is None:
            draft = self.drafter.propose(batch)
        else:
            sized = self.goodput.sizable(batch, self.seeded)
            draft = self.goodput.propose(self.drafter, batch, sized)
        return constrain.prune(draft, requests)

    def _report(self, request: Request) -> RequestOutput:
        if request.status is Status.FINISHED:
            self.requests.pop(request.request_id, None)
        return request.report()

    def check_request(
        self, prompt_ids: Sequence[int] | torch.Tensor, sampling: SamplingParams
    ) -> list[int]:
        """The prompt's token ids if this engine can take the request, else ValueError naming
        the field. Reads no state that steps change: a front end may call it from any thread."""
        return check_request(
            prompt_ids, sampling, self.target.vocab_size, self.max_model_len, self.tokenizer
        )
