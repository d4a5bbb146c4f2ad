"""Draft sizing by expected goodput: each step drafts what pays on this host, down to nothing.

Goodput is tokens per second. A verify of n draft nodes gives row r ``1 + sum_i p_ri`` tokens
in expectation, where p_ri is the chance the target accepts node i (its path, for a tree: the
accepted length is the count of accepted nodes), and costs ``draft + verify(B * (n + 1)) + other``
seconds for a batch of B rows. ``verify`` is the target's cost by width measured at load
(``engine.costs``), scaled by how the engine's own verify steps compare with it (drift,
contention); ``draft`` is the drafter's seconds, learned from its steps, and ``other`` what
a step spends besides (committing, the drafter's observing), learned against the tokens a row
gains, apart for steps the drafter ran and plain ones. What drafted steps really cost against
what this model of their parts gave them (``Learned.bias``) scales a drafted step's seconds.

p_ri comes from one of two models, each request's evidence (``engine.evidence``):

- a drafter's own scores (``Draft.scores``: EAGLE's path probabilities), scaled per request by
  how many tokens its drafts really landed against how many the scores promised;
- else a request's running acceptance alpha_r (accepted drafts against rejections, a
  geometric model as in the speculative decoding papers): p_ri = alpha_r ** depth_i.

Chain drafters that can be cut before drafting (``Needs.shortens``) are given the k with the
best goodput (``Batch.limit``); k = 0 drafts nothing. A drafter whose drafts carry scores from
what each rests on and cost little (``Needs.scored``: prompt lookup, by the match a draft came
from) is asked every step and each draft judged by its own scores: a lookup's acceptance swings
from draft to draft (about 0.2 to 0.9 for its first token on SmolLM2-135M) far more than a
request's running mean follows. Where a drafter's own drafts rest, one that can draft from the
text alone (``Needs.text_draft``: EAGLE's grafted lookup without its network) has that draft
judged so; a judged draft refused whole waits for the text to say what it would have landed
(``evidence.Shadow``), which counts as a verified draft's landing does. Other drafts are kept
in their best prefix by p (a node's p never exceeds its parent's, so the prefix is a tree; the
best: the largest gain over what its verify time gives at the going rate) where the verify
judges each node alone (point-mass drafts, chains) and whole otherwise; a tree drafter that
caps its depth (``Needs.caps_depth``: EAGLE) then drafts one level past the deepest node the
last cut kept, so it spends no network passes on levels the cut would drop (a probe,
``PROBE_K`` levels, as a chain's). A draft must promise ``MARGIN`` more than a plain step. When
no draft beats a plain decode step, the next steps decode plainly, and after ``PROBE_EVERY`` of
them one draft checks whether drafting pays again; each probe that finds it does not doubles
the wait, up to ``PROBE_MAX`` steps (more for a drafter whose probes cost several plain steps,
whose waits also start longer: ``PROBE_SHARE``, ``PROBE_BURST``), so text where drafts never
land costs few drafts. What holds for the host rather than a request (``Learned``,
``engine.learned``) carries over to the next engine over the same drafter object.

Exactness does not depend on the size chosen: any prefix of a draft is a draft. Sizing follows
measured times, so it is left out where the tokens must be reproducible: a step whose batch
holds a sampled request with its own seed, or any sampled one in an engine with a seed, keeps
the drafter's whole draft (greedy requests are the same tokens at any size).
"""

from __future__ import annotations

import dataclasses
from itertools import accumulate

import torch

from quickdraft.drafters.base import Batch, Draft, Drafter, Needs
from quickdraft.engine.costs import VerifyCosts
from quickdraft.engine.evidence import RequestEvidence
from quickdraft.engine.learned import PROBE_EVERY, Learned, bucket

PROBE_MAX = 128
# Probes that find drafting does not pay should spend about this share of the time: a drafter
# whose probe costs c plain steps (beyond the tokens it gives) waits up to c / PROBE_SHARE
# steps between them, at least PROBE_MAX, at most PROBE_CEILING. EAGLE's probes on
# SmolLM2-135M (AVX2) cost 3-5 of its 4.5 ms steps: the draft, and its network catching up
# with the request's prompt and the tokens since its last draft.
PROBE_SHARE = 0.01
PROBE_CEILING = 4096
# And after one that failed, a probe waits at least 1 / PROBE_BURST times its own cost in
# plain steps: a costly probe's doubling starts that far, not at PROBE_EVERY.
PROBE_BURST = 0.1
PROBE_DECAY = 0.5  # per probe: how fast the probes' cost follows
LANDED_DECAY = 0.7  # per probe: how fast the share of probes that paid follows
# What a probe that finds drafting pays is worth, in plain steps: the 1.5B's EAGLE on code,
# 1.4-1.7x its plain decoding over a request's 60-70 steps, gains 25-45. With probes of 2-3
# plain steps, joins stop getting early probes after about five failed probes in a row.
JOIN_WORTH = 24.0
JOIN_FREE = 1.0
RESEARCH_EVERY = 32  # resting steps between a chain rule's searches (``choose``)
# Judged drafts refused (or left empty) in a row before one is verified anyway, its likeliest
# first token alone: what a drafted step costs (``Learned.drift``, ``other``) is learned from
# drafted steps only, and an estimate a busy moment raised would otherwise never come down.
JUDGE_PROBE = 64
ADVANTAGE_DECAY = 0.6
PROBE_K = 2
# What a draft must promise over a plain step (expected tokens a second) to be drafted: the
# estimates behind it (acceptance, the drafter's and the verify's seconds on a shared host) are
# off by about this much, and a draft that promises less gains little when right and loses
# when wrong (benchmarks/results/vs_llama_cpp_avx2/README.md).
MARGIN = 1.03
DRIFT_DECAY = 0.8  # per step of a width: how fast the table's correction follows
BIAS_DECAY = 0.8  # per drafted step: how fast the drafted steps' correction follows
BIAS_RANGE = (0.5, 2.0)


def _closed(keep: torch.Tensor, draft: Draft) -> torch.Tensor:
    """``keep`` [N] less any node whose parent is not kept (parents come first in a draft),
    so that what is verified is a tree, and for a chain a prefix, whatever the scores say."""
    parents = draft.parents.tolist()
    closed = keep.clone()
    for node, parent in enumerate(parents):
        if parent >= 0 and not closed[parent]:
            closed[node] = False
    return closed


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a verify of k chained drafts gives at acceptance alpha (the bonus included)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class GoodputRule:
    """Sizes each step's draft for the requests in its slots (module docstring); ``update``
    after the step with what it drafted, accepted and cost. What each request's drafts landed
    lives in ``requests`` (``RequestEvidence``), what holds for the host and drafter in
    ``host`` (``Learned``)."""

    def __init__(self, needs: Needs, rows: int, costs: VerifyCosts, host: Learned | None = None):
        self.max_k = needs.depth
        self.shortens = needs.shortens
        self.scored = needs.scored
        self.text_draft = needs.text_draft
        self.caps_depth = needs.caps_depth
        self.costs = costs
        self.host = Learned(costs) if host is None else host
        self.requests = RequestEvidence(rows)
        self.proposed = False  # whether the drafter ran this step
        # The deepest node the last trimmed draft kept (None: it kept the draft whole): a
        # drafter that caps its depth drafts one level past it, a level a step deeper while
        # its drafts keep their deepest nodes.
        self.kept_depth: int | None = None
        self.since = 0.0  # tokens a row gained (mean over rows) since the drafter last drafted
        self.predicted = 0.0  # ``trim``'s seconds for the step it cut, before ``bias``
        self.probing = False  # whether this step's draft is a probe
        self.refused = 0  # judged drafts refused or empty in a row (``judge``)
        self.joined = False  # requests joined since the drafter last ran
        # (slots, acceptances) of the last step ``choose`` found no k paying for
        self.resting: tuple[list[int], list[float]] | None = None

    def begin(self, slots: list[int]) -> None:
        """New requests took these slots: they start from the prior."""
        self.requests.begin(slots)
        self.joined = True  # the next draft also reads their prompts: not a draft's cost
        # Whether their text suits drafting is unknown: while drafting rests, they get a probe
        # as soon as one after a failed probe would come, not at the end of a long wait that
        # other requests' text earned (a chat's, before a code request's): a probe a request
        # at most, where requests join faster than the back-off. The wait failed probes earned
        # (``backoff``) stays for the probes after. Unless probes on this host hardly ever pay
        # for what they cost (``join_pays``).
        if self.join_pays(len(slots)):
            soonest = self.host.idle + self.first_wait(len(slots))
            self.host.wait = min(self.host.wait, max(soonest, PROBE_EVERY))

    def join_pays(self, rows: int) -> bool:
        """Whether a joining request's early probe is worth its cost: always where a probe
        costs at most ``JOIN_FREE`` plain steps (a chain's lookup: the early probe is how a
        request whose text suits drafting starts drafting after others' failures), else
        the chance a probe pays for itself (``Learned.landed``) times what finding drafting
        pays is worth, against what a probe costs. On SmolLM2-135M (AVX2 code) EAGLE's probe
        costs 2-3 plain steps, its network catching up with the prompt, and almost never
        pays; a request is 30-130 steps there, so a probe each took 2-3% of the time."""
        cost = self.probe_steps(rows)
        return cost <= JOIN_FREE or self.host.landed * JOIN_WORTH >= cost

    def other(self, drafted: bool, gained: float = 1.0) -> float:
        """Expected seconds of a step's work besides drafting and verifying, its rows
        gaining ``gained`` tokens each; a drafted step's as a plain step's until one ran."""
        line = self.host.other[drafted]
        return line(gained) if line.w else self.host.other[False](gained)

    def verify(self, tokens: int, drafted: bool = True) -> float:
        """Expected seconds of a verify pass over ``tokens`` tokens (all rows together), after
        the drafter ran or not: the measured table, times how this engine's passes of about
        that width compared with it."""
        return self.costs(tokens) * self.host.drift[drafted][bucket(tokens)]

    @staticmethod
    def sizable(batch: Batch, seeded_engine: bool) -> bool:
        """Whether sizing may change this step (module docstring: reproducible tokens)."""
        for params, generator in zip(batch.sampling, batch.generators, strict=True):
            if not params.greedy and (generator is not None or seeded_engine):
                return False
        return True

    def propose(self, drafter: Drafter, batch: Batch, sized: bool = True) -> Draft:
        """This step's draft: the best k for a drafter that shortens, else the drafter's draft
        cut to its best prefix, or nothing while plain decoding wins; the drafter's whole
        draft unless ``sized``."""
        slots = list(batch.slots.host)
        self.proposed = True
        if not sized:
            return drafter.propose(batch)
        if self.scored:  # every draft judged by its own scores: no resting, no probes
            self.requests.resolve(batch, slots)
            batch = dataclasses.replace(batch, floor=self.floor(slots, drafted=True))
            draft = self._judged(drafter.propose(batch), batch, slots, drafted=True)
            self.proposed = draft.depth > 0  # a step with nothing kept is a plain one
            return draft
        if self.shortens:
            k = self.choose(slots)
            if k == 0:
                self.proposed = False
                return Draft.empty(batch.size, batch.tokens.device)
            return drafter.propose(dataclasses.replace(batch, limit=k)).cut(k)
        if not self.host.drafting and self.host.idle < self.host.wait:
            self.proposed = False  # the drafter's own draft rests; its text draft may not
            if self.text_draft:
                self.requests.resolve(batch, slots)
                batch = dataclasses.replace(
                    batch, text_only=True, floor=self.floor(slots, drafted=False)
                )
                return self._judged(drafter.propose(batch), batch, slots, drafted=False)
            return Draft.empty(batch.size, batch.tokens.device)
        self.probing = not self.host.drafting
        # A probe (drafting found not to pay) drafts PROBE_K levels, as a chain's probe does:
        # if they land, drafting resumes and goes a level deeper a step.
        if self.caps_depth and (self.probing or self.kept_depth is not None):
            depth = PROBE_K if self.probing else self.kept_depth + 1
            batch = dataclasses.replace(batch, max_depth=depth)
        return self.trim(drafter.propose(batch), slots)

    def choose(self, slots: list[int]) -> int:
        """The k (0 .. max_k) of the most expected goodput for a chain; a probe while plain
        decoding has won for PROBE_EVERY steps."""
        rows = len(slots)
        alphas = [self.requests.alpha(slot) for slot in slots]
        # Resting, with the same rows at the same acceptance as the step that found no k
        # paying (nothing drafted or joined since): the same answer but for the costs' drift,
        # so the search (40 us a step, 1% of a SmolLM2 step on AVX2) runs every
        # RESEARCH_EVERY steps only, for plain steps that slowed (a longer context, a busier
        # host) to bring drafting back before the next probe.
        resting = (slots, alphas)
        idle = self.host.idle
        if resting == self.resting and idle < self.host.wait and idle % RESEARCH_EVERY:
            return 0
        self.resting = None
        best, best_rate, plain = 0, 0.0, 0.0
        for k in range(self.max_k + 1):
            drafting = self.host.draft(k) if k else 0.0  # k = 0 runs no drafter
            gained = sum(expected_tokens(a, k) for a in alphas)
            seconds = self.other(k > 0, gained / rows) + self.verify(rows * (k + 1), k > 0)
            rate = gained / ((seconds + drafting) * (self.host.bias if k else 1.0))
            if k == 0:
                plain = rate
            if rate > best_rate:
                best, best_rate = k, rate
        if best_rate < plain * MARGIN:
            best = 0
            self.resting = resting
        self.host.drafting = best > 0
        if self.host.drafting:
            self.host.wait = self.host.backoff = PROBE_EVERY
        if best == 0 and self.host.idle >= self.host.wait:
            self.host.wait = self.next_wait(rows)
            self.probing = True
            return min(PROBE_K, self.max_k)
        return best

    def probe_steps(self, rows: int) -> float:
        """A probe's cost beyond the tokens it gave, in plain steps of ``rows`` rows."""
        plain = self.other(False) + self.verify(rows, False)
        return self.host.probe / plain if plain > 0 else 0.0

    def first_wait(self, rows: int) -> int:
        """The fewest plain steps before a probe: 1 / PROBE_BURST times a probe's cost."""
        return int(self.probe_steps(rows) / PROBE_BURST)

    def next_wait(self, rows: int) -> int:
        """The plain steps before the next probe, after one that found drafting does not
        pay: twice the last one failed probes earned (a joining request's earlier probe
        leaves it), at least ``first_wait`` and at most 1 / PROBE_SHARE times
        a probe's cost in plain steps, within PROBE_MAX .. PROBE_CEILING at the top."""
        cost = self.probe_steps(rows)
        longest = min(PROBE_CEILING, max(PROBE_MAX, cost / PROBE_SHARE))
        backoff = int(min(longest, max(2 * self.host.backoff, self.first_wait(rows))))
        self.host.backoff = backoff
        return backoff

    def trim(self, draft: Draft, slots: list[int]) -> Draft:
        """The prefix of ``draft`` (nodes by falling p) worth verifying; the whole draft where
        nodes cannot be dropped alone (a side branch, a sampled tree). Decides whether
        drafting pays on the next steps."""
        nodes = draft.tokens.shape[1]
        by_node = self.requests.acceptance(draft, slots)
        rows = len(slots)
        side = 0 if draft.side is None else draft.side.tokens.shape[1]
        # Per step: the bookkeeping and the draft; per token: the drafter catching up.
        expand, catch_up = self.host.draft(0.0), self.host.draft(1.0) - self.host.draft(0.0)
        plain = rows / (self.other(False) + self.verify(rows, False) + rows * catch_up)
        self.kept_depth = None
        if nodes == 0:
            kept, gained = 0, 0.0
        elif draft.side is not None or (draft.tree is not None and draft.probs is not None):
            kept, gained = nodes + side, sum(by_node)
        else:
            # A node pays when its tokens come faster than drafting gives them anyway (plain
            # decoding's rate, or drafting's where that is higher).
            rate = plain * max(MARGIN, self.host.advantage)
            paying, gained = self._paying(draft, by_node, rows, rate, catch_up)
            draft, kept = self._kept(draft, paying), len(paying)
            self.kept_depth = draft.depth or None  # none kept: the next draft whole
        # The step's expected rate against plain decoding's, averaged over recent drafts.
        seconds = self.other(True, 1 + gained / rows) + expand + self.verify(rows * (kept + 1))
        self.predicted = seconds + catch_up * self.since  # this step's, the catch-up in it
        expected = (rows + gained) / ((seconds + (rows + gained) * catch_up) * self.host.bias)
        decay = ADVANTAGE_DECAY
        self.host.advantage = self.host.advantage * decay + expected / plain * (1 - decay)
        was, self.host.drafting = self.host.drafting, self.host.advantage > MARGIN
        if self.host.drafting:
            self.host.wait = self.host.backoff = PROBE_EVERY
        elif not was:  # a probe that found drafting still does not pay
            self.host.wait = self.next_wait(rows)
        return draft

    def _paying(
        self,
        draft: Draft,
        by_node: list[float],
        rows: int,
        rate: float,
        catch_up: float,
        drafted: bool = True,
    ) -> tuple[list[int], float]:
        """The nodes of ``draft`` that pay and their expected tokens: the prefix, nodes taken
        by falling p, of the largest surplus, its tokens (``by_node``) less what its verify
        time (after the drafter ran, or not; the drafter's catching up with them included)
        gives at ``rate``; none where no prefix's is above 0. Not a node at a time: a pass's
        cost need not grow evenly with its width (SmolLM2-135M's AVX2 kernel: 2 tokens 1.4x
        the cost of 1, then under 0.2x a token more), and a first token that does not pay
        alone may pay with the ones after it."""
        nodes = draft.tokens.shape[1]
        if draft.tree is None:  # a chain's p falls with depth: its order is its own
            order: list[int] | range = range(nodes)
        else:
            depth = draft.tree.depth.tolist()
            order = sorted(range(nodes), key=lambda i: (-by_node[i], depth[i], i))
        base = self.verify(rows, drafted)
        net = max(1.0 - rate * catch_up, 0.0)  # a token's worth, less its catching up
        # The least drift of each width bucket and those wider: the table never falls with
        # width (``VerifyCosts.monotone``) but a bucket's drift may be below a narrower one's.
        drift = self.host.drift[drafted]
        least_drift = list(accumulate(reversed(drift), min))[::-1]
        best, kept, gained, best_gained = 0.0, 0, 0.0, 0.0
        for n, i in enumerate(order, start=1):
            tokens = by_node[i]
            width = rows * (n + 1)
            cost, at = self.costs(width), bucket(width)
            # Every prefix from here on costs at least ``least`` and gains at most this
            # node's p for each node left (p falls along ``order``): stop where that is no
            # better than the best.
            least = rate * (cost * least_drift[at] - base)
            if (gained + tokens * (nodes - n + 1)) * net - least <= best:
                break
            verify = rate * (cost * drift[at] - base)  # as self.verify(width, drafted)
            gained += tokens
            if gained * net - verify > best:
                best, kept, best_gained = gained * net - verify, n, gained
        return list(order[:kept]), best_gained

    @staticmethod
    def _kept(draft: Draft, nodes: list[int]) -> Draft:
        """``draft`` with only ``nodes`` (and their ancestors' closure, ``_closed``)."""
        if draft.tree is None and draft.side is None:  # a chain keeps a prefix
            rows, device = draft.tokens.shape[0], draft.tokens.device
            return draft.cut(len(nodes)) if nodes else Draft.empty(rows, device)
        keep = torch.zeros(draft.tokens.shape[1], dtype=torch.bool)
        keep[nodes] = True
        return draft.keep(_closed(keep, draft))

    def floor(self, slots: list[int], drafted: bool) -> float:
        """The least score a lone row's first token needs for its draft to be worth
        verifying, for a scored drafter to skip building drafts that would be refused
        (``Batch.floor``); 0 for a batch of rows (their chances add up) and before a probe.
        A bound, not an estimate: a draft of n tokens gains at most n times its first
        token's chance (a later token's is no higher), so one whose first token is below
        ``rate * (verify(n + 1) - verify(1)) / n`` for every n cannot pay. (Asking that the
        first token pay alone skipped drafts whose later tokens paid for it: prompt lookup
        on SmolLM2 chat went from 1.74 to 1.48 tokens a forward.)"""
        if len(slots) != 1 or self.refused >= JUDGE_PROBE:
            return 0.0
        slot = slots[0]
        rate = MARGIN / (self.other(False) + self.verify(1, False))
        base = self.verify(1, drafted)
        least = min((self.verify(n + 1, drafted) - base) / n for n in range(1, self.max_k + 1))
        # Not raised where the request's drafts land less than their scores promise: the
        # drafts built are judged at that scale all the same, and those refused still teach
        # it (``RequestEvidence.shadow``); a floor raised with it would build none, and a
        # request whose first drafts missed would never draft again.
        requests = self.requests
        return rate * least * min(requests.promised[slot] / requests.landed[slot], 1.0)

    def judge(self, draft: Draft, slots: list[int], drafted: bool) -> Draft:
        """A scored draft judged alone (prompt lookup's; EAGLE's lookup while its network
        rests): its nodes whose tokens come faster than plain decoding's, kept only if the
        step beats a plain one, its bookkeeping included (committing a path; a ``drafted``
        step's is learned apart, the drafter observing what it drafted). The draft's cost is
        spent whatever is kept, and the verdict decides nothing for the steps after."""
        rows = len(slots)
        if draft.depth == 0:
            self.refused += 1
            return draft
        by_node = self.requests.acceptance(draft, slots)
        plain = rows / (self.other(False) + self.verify(rows, False))
        nodes, gained = self._paying(draft, by_node, rows, plain * MARGIN, 0.0, drafted)
        if nodes:
            kept = len(nodes)
            verify = self.verify(rows * (kept + 1), drafted)
            spent = self.other(drafted, 1 + gained / rows) + verify
            if (rows + gained) / spent >= plain * MARGIN:
                self.refused = 0
                return self._kept(draft, nodes)
        self.refused += 1
        if self.refused <= JUDGE_PROBE or draft.depth == 0:
            return Draft.empty(rows, draft.tokens.device)
        self.refused = 0  # a probe: the likeliest of the first tokens alone
        first = [i for i, parent in enumerate(draft.parents.tolist()) if parent < 0]
        return self._kept(draft, [max(first, key=lambda i: by_node[i])])

    def _judged(self, draft: Draft, batch: Batch, slots: list[int], drafted: bool) -> Draft:
        """``judge``'s verdict on ``draft``; a draft refused whole is kept as each row's shadow."""
        kept = self.judge(draft, slots, drafted)
        if kept.depth == 0 and draft.depth > 0:
            self.requests.shadow(draft, batch, slots)
        return kept

    def update(
        self,
        slots: list[int],
        draft: Draft,
        accepted: list[int],
        draft_seconds: float,
        verify_seconds: float,
        other_seconds: float = 0.0,
    ) -> None:
        """A step verified ``draft`` (as cut) for the rows in ``slots``, which accepted
        ``accepted`` of its nodes; ``other_seconds``: the step's time besides drafting and
        verifying (committing, the drafter's observing, bookkeeping)."""
        nodes = draft.tokens.shape[1] + (0 if draft.side is None else draft.side.tokens.shape[1])
        width = len(slots) * (nodes + 1)
        gained = sum(accepted) / len(accepted) + 1.0
        predicted = 0.0  # what the rule's model gave for this step, before ``bias``
        if self.proposed and not self.joined and draft.depth > 0:
            predicted = self.predicted  # a tree's, from ``trim``; a chain's, for its own k:
            if self.shortens and not self.scored:
                predicted = self.other(True, gained) + self.verify(width) + self.host.draft(nodes)
        self.host.other[self.proposed].add(gained, other_seconds)
        self.host.idle = 0 if self.proposed else self.host.idle + 1
        if verify_seconds > 0:
            ratio = verify_seconds / self.costs(width)
            drift, i = self.host.drift[self.proposed], bucket(width)
            drift[i] = drift[i] * DRIFT_DECAY + ratio * (1 - DRIFT_DECAY)
        if self.probing:  # what it cost beyond plain decoding's time for its tokens
            spent = draft_seconds + verify_seconds + other_seconds
            plain = self.other(False) + self.verify(len(slots), False)
            cost = max(0.0, spent - gained * plain)
            known = self.host.probe
            self.host.probe = cost if not known else known * PROBE_DECAY + cost * (1 - PROBE_DECAY)
            # It paid: its tokens came at least as fast as plain decoding's, or it found
            # drafting pays (a tree's trim decides that before its verify; a probe that also
            # caught up with a newcomer's prompt may cost more and still find it).
            paid = float(cost == 0.0 or self.host.drafting)
            self.host.landed = self.host.landed * LANDED_DECAY + paid * (1 - LANDED_DECAY)
            self.probing = False
        if self.proposed:
            if not self.joined:
                # Against k for one that shortens (a scored one drafts whole: its cost is one
                # for any k kept), else against the tokens it catches up with.
                x = 0.0 if self.scored else draft.depth if self.shortens else self.since
                self.host.draft.add(x, draft_seconds)
            if predicted > 0:
                spent = draft_seconds + verify_seconds + other_seconds
                bias = self.host.bias * BIAS_DECAY + spent / predicted * (1 - BIAS_DECAY)
                self.host.bias = min(max(bias, BIAS_RANGE[0]), BIAS_RANGE[1])
            self.predicted = 0.0
            self.since, self.joined = 0.0, False
        self.since += gained
        self.proposed = False
        if draft.depth > 0:
            self.requests.observe(slots, draft, accepted)

    def __repr__(self) -> str:
        drift = ", ".join(f"{d:.2f}" for d in self.host.drift[True])
        return f"GoodputRule(max_k={self.max_k}, drift=[{drift}], drafting={self.host.drafting})"
