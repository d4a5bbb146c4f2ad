"""Draft sizing by goodput: the rule's choices from known costs, cut drafts, the measured cost
table, and token identity with plain decoding for every method at its default (sized)."""

import random

import pytest
import torch
from conftest import tiny_runners

from quickdraft import Engine, SamplingParams, generate, generate_batch
from quickdraft.bench.labels import parse_label
from quickdraft.drafters.base import Batch, Draft, Needs
from quickdraft.drafters.registry import build_drafter, make_spec
from quickdraft.engine import costs as verify_costs
from quickdraft.engine.costs import VerifyCosts
from quickdraft.engine.goodput import (
    JUDGE_PROBE,
    PROBE_BURST,
    PROBE_K,
    PROBE_MAX,
    PROBE_SHARE,
    GoodputRule,
    expected_tokens,
)
from quickdraft.engine.learned import PROBE_EVERY, Learned, learned

GREEDY = SamplingParams(temperature=0, max_new_tokens=40)
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]
# A host where verifying costs little more than decoding (AVX-512 VNNI), and one where every
# verified token costs nearly a decode step.
CHEAP = VerifyCosts((1, 16), (0.010, 0.012))
DEAR = VerifyCosts((1, 16), (0.010, 0.150))
MIDDLING = VerifyCosts((1, 16), (0.010, 0.060))


@pytest.fixture(scope="module")
def target():
    return tiny_runners(layers=2)["llama-tied"]


def _chain_rule(costs: VerifyCosts, rows: int = 4) -> GoodputRule:
    return GoodputRule(Needs(8, 8, shortens=True), rows, costs)


def _drafted(rule: GoodputRule, slots: list[int], k: int, accepted: int, seconds: float):
    rule.proposed = k > 0
    draft = Draft.chain(torch.zeros(len(slots), k, dtype=torch.long))
    rule.update(slots, draft, [accepted] * len(slots), 0.0, seconds)


def test_the_rule_drafts_long_when_drafts_land_and_verifying_is_cheap():
    rule = _chain_rule(CHEAP)
    for _ in range(5):
        _drafted(rule, [0], 8, 8, CHEAP(9))
    assert rule.requests.alpha(0) > 0.9 and rule.choose([0]) == 8


def test_the_rule_drafts_nothing_where_verifying_costs_and_drafts_fail_then_probes():
    rule = _chain_rule(DEAR)
    for _ in range(10):
        _drafted(rule, [0, 1], 2, 0, DEAR(6))
    assert rule.choose([0, 1]) == 0
    for _ in range(PROBE_EVERY):
        _drafted(rule, [0, 1], 0, 0, DEAR(2))
    assert rule.choose([0, 1]) == PROBE_K  # a short draft checks whether it pays again
    assert rule.host.wait == 2 * PROBE_EVERY  # and the next wait is longer
    rule.begin([1])  # a new request in slot 1 starts from the prior
    assert rule.requests.alpha(1) == pytest.approx(0.5)


def test_a_drafted_steps_other_work_is_learned_apart_and_weighs_on_the_choice():
    """What a step spends besides drafting and verifying is learned apart for drafted steps
    (committing a path, the drafter observing its accepted tokens), against the tokens a row
    gained: until a drafted step ran, a plain step's stands in; a draft that would pay at a
    plain step's bookkeeping does not pay at its own dearer one."""

    def rule_with(other_drafted: float) -> GoodputRule:
        rule = _chain_rule(MIDDLING, rows=1)
        for _ in range(3):  # a plain step: 1 ms besides its verify
            rule.proposed = False
            rule.update([0], Draft.empty(1), [0], 0.0, MIDDLING(1), 0.001)
        assert rule.other(True, 2.0) == pytest.approx(rule.other(False, 2.0))  # none ran yet
        for accepted in (1, 2, 1, 2):  # drafts of 2, half landing
            rule.proposed = True
            draft = Draft.chain(torch.zeros(1, 2, dtype=torch.long))
            rule.update([0], draft, [accepted], 0.0, MIDDLING(3), other_drafted)
        return rule

    cheap, dear = rule_with(0.001), rule_with(0.015)
    assert cheap.other(False) == pytest.approx(0.001)
    assert dear.other(True, 2.5) > 0.01 and dear.other(False) == pytest.approx(0.001)
    assert cheap.choose([0]) > 0 and dear.choose([0]) == 0


def test_a_cheap_verify_keeps_more_of_a_tree_than_a_dear_one():
    """The same scored tree (EAGLE's path probabilities) is cut to its nodes worth verifying:
    on a host whose verify costs grow fast, fewer; parents always stay with their children."""
    tokens = torch.arange(8).unsqueeze(0)
    parents = [-1, 0, 1, 2, -1, 4, 0, 6]
    scores = torch.tensor([[0.9, 0.8, 0.6, 0.3, 0.2, 0.15, 0.1, 0.05]], dtype=torch.float64)
    draft = Draft.from_parents(tokens, parents, scores=scores)
    kept = {}
    for name, costs in (("cheap", CHEAP), ("dear", MIDDLING)):
        rule = GoodputRule(Needs(8, 4), 1, costs)
        cut = rule.trim(draft, [0])
        kept[name] = cut.tokens[0].tolist()
        assert cut.scores is not None and cut.scores.shape == cut.tokens.shape
        assert cut.tree is not None
        for node, parent in enumerate(cut.tree.parents.tolist()):
            assert parent < node  # a tree: parents first
    assert len(kept["cheap"]) > len(kept["dear"]) >= 1
    assert set(kept["dear"]) < set(kept["cheap"])


def test_drafted_steps_dearer_than_predicted_raise_the_bias_and_stop_drafting():
    """A drafted step that keeps costing more than the rule's model of its parts gave (a
    tree drafter's depth, attention over a longer context than the table's) raises
    ``bias``, which weighs on the expected rate of drafting: the same drafts that pay at
    their predicted cost stop paying at 1.5x it. A step costing what was predicted leaves
    the bias at 1."""
    tokens = torch.arange(4).unsqueeze(0)
    scores = torch.tensor([[0.9, 0.6, 0.35, 0.2]], dtype=torch.float64)
    draft = Draft.from_parents(tokens, [-1, 0, 1, 2], scores=scores)
    rules = {}
    for name, factor in (("true", 1.0), ("dear", 1.5)):
        rule = GoodputRule(Needs(4, 4), 1, CHEAP)
        rule.host.draft.add(0.0, 0.004)  # a draft costs 0.4 of a decode step
        for _ in range(12):
            rule.proposed = True
            cut = rule.trim(draft, [0])
            kept = cut.tokens.shape[1]
            spent = rule.predicted * factor
            rule.update([0], cut, [min(kept, 2)], 0.004, spent - 0.004)
        rules[name] = rule
    assert rules["true"].host.bias == pytest.approx(1.0, abs=0.05)
    assert rules["dear"].host.bias > 1.35
    assert rules["true"].host.drafting and not rules["dear"].host.drafting


def test_drafting_stops_when_drafts_do_not_pay_and_the_probes_back_off():
    tokens = torch.arange(4).unsqueeze(0)
    weak = Draft.from_parents(tokens, [-1, 0, 1, 2], scores=torch.full((1, 4), 0.01))
    rule = GoodputRule(Needs(4, 4), 1, DEAR)
    rule.host.draft.add(0.0, 0.008)  # drafting costs most of a decode step
    for _ in range(4):
        rule.trim(weak, [0])
    assert not rule.host.drafting
    waits = []
    for _ in range(4):
        rule.trim(weak, [0])  # each probe that finds drafts still weak
        waits.append(rule.host.wait)
    assert waits == sorted(waits) and waits[-1] <= PROBE_MAX and waits[-1] > PROBE_EVERY


def test_probes_that_cost_several_plain_steps_come_rarer():
    """A probe that finds drafting does not pay costs its draft and wider verify beyond what
    plain decoding takes for the tokens it gave. Where that is several plain steps (a draft
    network catching up with a prompt), probes wait longer than PROBE_MAX between them, so
    they spend about PROBE_SHARE of the time; cheap ones keep PROBE_MAX."""
    tokens = torch.arange(4).unsqueeze(0)
    weak = Draft.from_parents(tokens, [-1, 0, 1, 2], scores=torch.full((1, 4), 0.01))
    waits = {}
    for name, draft_seconds in (("cheap", 0.001), ("dear", 0.040)):
        rule = GoodputRule(Needs(4, 4), 1, DEAR)
        rule.host.draft.add(0.0, 0.008)
        longest = 0
        for _ in range(40):
            rule.host.idle = rule.host.wait  # the wait is over: the next draft probes
            rule.proposed, rule.probing = True, not rule.host.drafting
            cut = rule.trim(weak, [0])
            width = cut.tokens.shape[1] + 1
            rule.update([0], cut, [0], draft_seconds, DEAR(width), 0.0)
            longest = max(longest, rule.host.wait)
        waits[name] = longest
    plain = DEAR(1)
    assert waits["cheap"] == PROBE_MAX
    assert waits["dear"] > PROBE_MAX
    assert waits["dear"] == pytest.approx(0.040 / (PROBE_SHARE * plain), rel=0.2)
    # and after a costly probe fails, the next one waits 1 / PROBE_BURST times its cost
    rule = GoodputRule(Needs(4, 4), 1, DEAR)
    rule.host.draft.add(0.0, 0.008)
    rule.host.probe, rule.host.drafting, rule.host.advantage = 0.040, False, 0.5
    rule.host.idle = rule.host.wait = PROBE_EVERY
    rule.proposed = rule.probing = True
    rule.trim(weak, [0])
    assert rule.host.wait == pytest.approx(0.040 / (PROBE_BURST * plain), rel=0.2)


def test_a_new_request_gets_a_probe_soon_whatever_the_wait_others_earned():
    """Drafting rests after long failure (a wait of hundreds of steps that chat requests
    earned); a request that joins is probed after ``first_wait`` steps (10x a probe's cost),
    since its own text (code, say) may suit drafting, not at the end of the long wait."""
    rule = GoodputRule(Needs(4, 4), 2, DEAR)
    rule.host.drafting, rule.host.idle, rule.host.wait = False, 50, 800
    rule.host.probe = 0.020  # two plain steps of DEAR
    rule.begin([1])
    assert rule.host.wait == 50 + rule.first_wait(1)
    assert rule.first_wait(1) == pytest.approx(0.020 / (PROBE_BURST * DEAR(1)), abs=1)
    rule.host.wait = 60
    rule.begin([0])  # a wait already shorter is kept
    assert rule.host.wait == 60
    # A join's earlier probe leaves the wait failed probes earned: the probes after start
    # from it, not from the join's.
    rule.host.idle, rule.host.wait, rule.host.backoff = 0, 150, 150
    rule.begin([1])
    assert rule.host.wait == rule.first_wait(1)
    cap = 2 / PROBE_SHARE  # a probe of 2 plain steps: failed probes spend 1% of the time
    assert rule.next_wait(1) == pytest.approx(min(2 * 150, cap), abs=1)


def test_a_joining_request_waits_where_costly_probes_keep_failing():
    """Where probes cost several plain steps and fail one after another (EAGLE on a small
    target whose drafts seldom land), a joining request waits out the back-off like the
    others; a probe that pays brings the early probe back."""
    tokens = torch.arange(2).unsqueeze(0)
    weak = Draft.from_parents(tokens, [-1, 0], scores=torch.full((1, 2), 0.01))
    rule = GoodputRule(Needs(4, 4), 2, DEAR)
    rule.host.draft.add(0.0, 0.008)
    rule.host.drafting, rule.host.advantage = False, 0.5
    for _ in range(6):  # probes that each cost about three plain steps and land nothing
        rule.host.idle = rule.host.wait
        rule.proposed = rule.probing = True
        cut = rule.trim(weak, [0])
        rule.update([0], cut, [0], 0.030, DEAR(cut.tokens.shape[1] + 1), 0.0)
    assert rule.probe_steps(1) > 2 and not rule.join_pays(1)
    rule.host.idle, rule.host.wait = 10, 400
    rule.begin([1])
    assert rule.host.wait == 400  # no early probe for the newcomer
    for _ in range(2):  # probes that pay: their tokens came faster than plain decoding's
        rule.proposed = rule.probing = True
        rule.update([0], cut, [3], 0.001, DEAR(2), 0.0)
    assert rule.join_pays(1)
    rule.begin([1])
    assert rule.host.wait < 400


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(1.0, 3) == 4.0


def test_a_cut_tree_keeps_its_shallow_nodes_with_their_parents_and_probabilities():
    tokens = torch.tensor([[10, 11, 12, 13, 14]])
    probs = torch.arange(5 * 3, dtype=torch.float).view(1, 5, 3)
    draft = Draft.from_parents(tokens, [-1, 0, -1, 1, 2], probs)  # depths 1 2 1 3 2
    cut = draft.cut(2)
    assert cut.tokens.tolist() == [[10, 11, 12, 14]] and cut.depth == 2
    assert cut.tree is not None and cut.tree.parents.tolist() == [-1, 0, -1, 2]
    assert torch.equal(cut.probs, probs[:, [0, 1, 2, 4]])
    chain = Draft.chain(tokens, probs)
    assert chain.cut(3).tokens.tolist() == [[10, 11, 12]] and chain.cut(9) is chain


def test_verify_costs_interpolate_and_refuse_nonsense():
    costs = VerifyCosts((1, 2, 4), (0.01, 0.012, 0.02))
    assert costs(1) == 0.01 and costs(3) == pytest.approx(0.016)
    assert costs(6) == pytest.approx(0.028)  # past the widest: the last slope
    assert VerifyCosts.from_json(costs.to_json()) == costs
    with pytest.raises(ValueError, match="widths must rise"):
        VerifyCosts((2, 1), (0.01, 0.02))
    with pytest.raises(ValueError, match="positive"):
        VerifyCosts((1,), (0.0,))


def test_verify_costs_are_measured_once_and_stored(target, tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path))
    monkeypatch.setattr(verify_costs, "_MEMORY", {})
    measured = verify_costs.verify_costs(target, budget=0.05)
    assert measured.widths[0] == 1 and len(measured.widths) == len(verify_costs.WIDTHS)
    stored = list((tmp_path / "costs").glob("*.json"))
    assert len(stored) == 1
    monkeypatch.setattr(verify_costs, "_MEMORY", {})
    monkeypatch.setattr(verify_costs, "measure", lambda *a: pytest.fail("measured again"))
    assert verify_costs.verify_costs(target) == measured  # read back, not measured


@pytest.mark.parametrize("label", ["suffix@6", "ngram@5", "lookahead"])
def test_sized_drafts_are_token_identical_to_plain_decoding(target, label):
    """Every method at its default (sized by goodput) gives plain decoding's tokens, alone and
    in a batch."""
    expected = [generate(target, p, sampling=GREEDY).token_ids for p in PROMPTS]
    _, spec = parse_label(label)
    assert spec.adaptive_k
    drafter = build_drafter(spec, target)
    for prompt, want in zip(PROMPTS, expected, strict=True):
        out = generate(target, prompt, sampling=GREEDY, spec=spec, draft=drafter)
        assert out.token_ids == want
    assert generate_batch(target, PROMPTS, sampling=GREEDY, spec=spec).token_ids == expected


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_sized_trees_on_the_real_model_are_token_identical(smollm2, method):
    """SmolLM2-135M with the drafters shipped for it: EAGLE's scored trees and Medusa's, cut
    each step, give plain decoding's tokens."""
    target, tokenizer = smollm2
    prompts = [
        tokenizer.apply_chat([{"role": "user", "content": text}])
        for text in ("Write a Python function that reverses a string.", "Name three colours.")
    ]
    spec = make_spec(method)
    assert spec.adaptive_k
    drafter = build_drafter(spec, target, target_name="smollm2-135m")
    asked = []  # (max_depth, the draft's depth): EAGLE caps its depth (Needs.caps_depth)
    propose = drafter.propose

    def watched(batch):
        draft = propose(batch)
        asked.append((batch.max_depth, draft.depth))
        return draft

    drafter.propose = watched
    for prompt in prompts:
        want = generate(target, prompt, sampling=GREEDY).token_ids
        assert generate(target, prompt, sampling=GREEDY, spec=spec, draft=drafter).token_ids == want
    capped = [(cap, depth) for cap, depth in asked if cap is not None]
    assert all(depth <= cap for cap, depth in capped)  # the lookup branch's nodes too
    assert bool(capped) == drafter.needs.caps_depth


def test_sized_chains_with_a_draft_model_are_token_identical(target):
    draft = tiny_runners(layers=1)["llama-tied"]
    spec = make_spec("draft_model", 4)
    want = generate(target, PROMPTS[0], sampling=GREEDY).token_ids
    assert generate(target, PROMPTS[0], sampling=GREEDY, spec=spec, draft=draft).token_ids == want


def test_seeded_sampled_requests_keep_whole_drafts(target):
    """Sizing follows measured times, so a seeded sampled request is not sized: its tokens are
    the same run after run, and the same as with sizing off."""
    seeded = SamplingParams(temperature=0.8, seed=3, max_new_tokens=30)
    sized, whole = make_spec("ngram", 4), make_spec("ngram", 4, adaptive_k=False)
    runs = [generate(target, PROMPTS[0], sampling=seeded, spec=sized).token_ids for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0] == generate(target, PROMPTS[0], sampling=seeded, spec=whole).token_ids


def test_labels_say_whole_or_sized():
    label, spec = parse_label("eagle!")
    assert label.endswith("whole") and not spec.adaptive_k
    assert parse_label("suffix~")[1].adaptive_k and parse_label("suffix")[1].adaptive_k
    with pytest.raises(ValueError, match="adaptive_k must be true or false"):
        make_spec("ngram", adaptive_k="yes")


def test_an_engine_without_sizing_drafts_whole(target):
    spec = make_spec("ngram", 5, adaptive_k=False)
    engine = Engine.from_spec(target, spec)
    assert engine.goodput is None
    assert Engine.from_spec(target, make_spec("ngram", 5)).goodput is not None


class _Weak:
    """A drafter whose drafts the rule trims to nothing: four nodes it scores at 1%."""

    needs = Needs(4, 4)

    def __init__(self):
        self.calls = 0

    def propose(self, batch):
        self.calls += 1
        tokens = torch.arange(4).unsqueeze(0)
        return Draft.from_parents(tokens, [-1, 0, 1, 2], scores=torch.full((1, 4), 0.01))


def _steps(rule: GoodputRule, drafter: _Weak, steps: int) -> None:
    batch = Batch.from_rows([[1, 2, 3]])
    for _ in range(steps):
        draft = rule.propose(drafter, batch)
        rule.update([0], draft, [0], 0.008 if rule.proposed else 0.0, 0.010, 0.001)


def test_a_drafter_whose_drafts_never_pay_runs_rarely():
    """Weak drafts trimmed to nothing: after the first, the drafter runs only at probes, whose
    waits double, so over 300 steps it runs a handful of times (not every step)."""
    weak = _Weak()
    _steps(GoodputRule(weak.needs, 1, DEAR), weak, 300)
    assert 3 <= weak.calls <= 10, weak.calls


def test_a_tree_drafter_that_caps_its_depth_drafts_one_level_past_what_was_kept():
    """Depth 1 kept (p 0.9), depths 2-4 cut (p 0.01): the next draft asks for depth 2; then
    with every level kept, a level deeper each step."""

    class Deep:
        needs = Needs(8, 4, caps_depth=True)

        def __init__(self, scores):
            self.scores, self.asked = scores, []

        def propose(self, batch):
            self.asked.append(batch.max_depth)
            depth = min(batch.max_depth or 4, 4)  # its own depth: 4
            tokens = torch.arange(depth).unsqueeze(0)
            parents = [-1, *range(depth - 1)]
            return Draft.from_parents(tokens, parents, scores=self.scores[:, :depth])

    batch = Batch.from_rows([[1, 2, 3]])
    steep = Deep(torch.tensor([[0.9, 0.01, 0.01, 0.01]]))
    rule = GoodputRule(steep.needs, 1, CHEAP)
    for _ in range(3):
        draft = rule.propose(steep, batch)
        rule.update([0], draft, [draft.depth], 0.001, 0.010, 0.001)
    assert steep.asked == [None, 2, 2]
    sure = Deep(torch.tensor([[0.99, 0.98, 0.97, 0.96]]))
    rule = GoodputRule(sure.needs, 1, CHEAP)
    rule.kept_depth = 1
    for _ in range(4):
        draft = rule.propose(sure, batch)
        rule.update([0], draft, [draft.depth], 0.001, 0.010, 0.001)
    assert sure.asked == [2, 3, 4, 5]  # the drafter stops at its own depth (4)
    rule.host.drafting, rule.host.idle = False, rule.host.wait  # drafting stopped paying
    rule.propose(steep, batch)
    assert steep.asked[-1] == PROBE_K  # a probe drafts PROBE_K levels, as a chain's does


def test_what_a_rule_learned_carries_over_to_the_next_engine():
    """Three requests of 100 steps, each in a new engine (``generate``'s way): with what the
    first learned carried over (``Learned``), the drafter runs as rarely as in one engine of
    300 steps; each starting afresh, each pays to find out again."""
    shared, host = _Weak(), Learned(DEAR)
    for _ in range(3):
        _steps(GoodputRule(shared.needs, 1, DEAR, host), shared, 100)
    fresh = _Weak()
    for _ in range(3):
        _steps(GoodputRule(fresh.needs, 1, DEAR), fresh, 100)
    assert shared.calls <= 10 and shared.calls < fresh.calls, (shared.calls, fresh.calls)


def test_engines_over_one_drafter_share_what_they_learned(target):
    spec = make_spec("ngram", 5)
    drafter = build_drafter(spec, target)
    first = Engine(target, drafter)
    generate(target, PROMPTS[0], sampling=GREEDY, spec=spec, draft=drafter)
    again = Engine(target, drafter)
    assert first.goodput.host is again.goodput.host
    # The request's steps taught it: plain steps one line, drafted steps the other (which
    # kind a step was depends on the times measured, so the test asks for either).
    taught = again.goodput.host.other
    assert taught[False].w + taught[True].w > 0
    other = Engine(target, build_drafter(spec, target))
    assert other.goodput.host is not first.goodput.host
    assert learned(drafter, DEAR) is not first.goodput.host  # another target's table


def test_a_measured_table_never_falls_with_width_and_a_bad_file_is_measured_again(
    target, tmp_path, monkeypatch
):
    noisy = VerifyCosts((1, 8, 12, 16), (0.01, 0.03, 0.05, 0.04)).monotone()
    assert noisy.seconds == (0.01, 0.03, 0.05, 0.05) and noisy(40) >= noisy(16)
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path))
    monkeypatch.setattr(verify_costs, "_MEMORY", {})
    first = verify_costs.verify_costs(target, budget=0.02)
    (stored,) = (tmp_path / "costs").glob("*.json")
    for text in ("[]", "null", "{", '{"version": 1, "widths": [2, 1], "seconds": [1, 1]}'):
        stored.write_text(text)
        monkeypatch.setattr(verify_costs, "_MEMORY", {})
        again = verify_costs.verify_costs(target, budget=0.02)
        assert again.widths == first.widths  # measured again, not a crash


def test_a_model_is_fingerprinted_once_per_process(target, tmp_path, monkeypatch):
    """Every engine asks for its target's costs; the fingerprint (a forward of the model) is
    taken once per model object, not once per engine."""
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path))
    monkeypatch.setattr(verify_costs, "_MEMORY", {})
    monkeypatch.setattr(verify_costs, "_KEYS", verify_costs.weakref.WeakKeyDictionary())
    calls = []
    key = verify_costs._key
    monkeypatch.setattr(verify_costs, "_key", lambda model: calls.append(model) or key(model))
    for _ in range(3):
        Engine.from_spec(target, make_spec("ngram", 3))
    assert len(calls) == 1


class _Scored:
    """A drafter of scored chains (as prompt lookup's): each propose returns the next draft
    of ``drafts``, whole."""

    def __init__(self, drafts: list[Draft]):
        self.needs = Needs(4, 4, shortens=True, scored=True)
        self.drafts = iter(drafts)
        self.asked = 0
        self.floors: list[float] = []

    def propose(self, batch: Batch) -> Draft:
        self.asked += 1
        self.floors.append(batch.floor)
        assert batch.limit is None  # asked for its whole draft
        return next(self.drafts)


def test_a_scored_drafter_is_asked_every_step_and_each_draft_judged_by_its_scores():
    """Drafts that promise little are verified as plain steps and no run of them makes the
    rule rest: the next draft that promises much is kept, to the depth its scores pay for."""
    tokens = torch.arange(4).unsqueeze(0)
    weak = Draft(tokens, scores=torch.tensor([[0.15, 0.1, 0.05, 0.02]]))
    strong = Draft(tokens, scores=torch.tensor([[0.95, 0.9, 0.85, 0.1]]))
    drafter = _Scored([weak] * 20 + [strong])
    rule = GoodputRule(drafter.needs, 1, MIDDLING)
    batch = Batch.from_rows([[1, 2, 3]])
    for _ in range(20):
        draft = rule.propose(drafter, batch)
        assert draft.depth == 0 and not rule.proposed
        rule.update([0], draft, [0], 0.0001, MIDDLING(1), 0.0005)
    draft = rule.propose(drafter, batch)
    assert drafter.asked == 21 and rule.proposed
    assert draft.tokens.tolist() == [[0, 1, 2]]  # the fourth token's 0.1 does not pay


class _Resting:
    """A drafter whose own drafts (a 4-node chain) never land and which drafts from the text
    alone when asked (``Needs.text_draft``): a scored 2-token chain that does."""

    def __init__(self):
        self.needs = Needs(4, 4, text_draft=True)
        self.asked: list[bool] = []

    def propose(self, batch: Batch) -> Draft:
        self.asked.append(batch.text_only)
        tokens = torch.arange(2 if batch.text_only else 4).unsqueeze(0)
        if batch.text_only:
            return Draft(tokens, scores=torch.tensor([[0.95, 0.9]]))
        return Draft(tokens, scores=torch.tensor([[0.01, 0.01, 0.01, 0.01]]))


def test_while_its_own_drafts_rest_a_drafter_drafts_from_the_text():
    """Once its own drafts stop paying, the rule asks a ``text_draft`` drafter for its text
    draft each step and keeps what pays; those steps leave the drafter resting (its probes
    come on their schedule)."""
    drafter = _Resting()
    rule = GoodputRule(drafter.needs, 1, MIDDLING)
    batch = Batch.from_rows([[1, 2, 3]])
    rule.host.drafting, rule.host.wait = False, 100  # its own drafts were found not to pay
    for _ in range(3):
        draft = rule.propose(drafter, batch)
        assert draft.tokens.tolist() == [[0, 1]] and not rule.proposed
        rule.update([0], draft, [2], 0.0001, MIDDLING(3), 0.0005)
    assert drafter.asked == [True, True, True] and rule.host.idle == 3


def test_judged_drafts_refused_long_enough_send_one_token_to_be_verified():
    """What a drafted step costs is learned from drafted steps only: after ``JUDGE_PROBE``
    refusals in a row the next draft is asked for with no floor and its likeliest first
    token goes alone, then refusals count afresh."""
    tokens = torch.arange(4).unsqueeze(0)
    weak = Draft.from_parents(tokens, [-1, -1, 0, 1], scores=torch.tensor([[0.1, 0.2, 0.05, 0.1]]))
    drafter = _Scored([weak] * (2 * JUDGE_PROBE + 2))
    rule = GoodputRule(drafter.needs, 1, MIDDLING)
    batch = Batch.from_rows([[1, 2, 3]])
    kept = [rule.propose(drafter, batch).tokens.tolist() for _ in range(2 * JUDGE_PROBE + 2)]
    probes = [i for i, found in enumerate(kept) if found != [[]]]
    assert probes == [JUDGE_PROBE, 2 * JUDGE_PROBE + 1] and kept[probes[0]] == [[1]]
    assert drafter.floors[0] > 0.2 and drafter.floors[JUDGE_PROBE] == 0.0  # a probe's: any


# A host whose second verified token costs most of a decode step and the ones after it little
# (SmolLM2-135M's AVX2 kernel: 2 tokens about 1.4x the cost of 1, 16 about 5x).
STEEP_START = VerifyCosts((1, 2, 16), (0.010, 0.016, 0.020))


def test_a_first_token_that_does_not_pay_alone_is_kept_with_the_tokens_after_it():
    """Where a pass's cost does not grow evenly with its width, a draft is kept in the prefix
    of the largest surplus, not node by node: a first token at 0.45 does not pay for the
    second token's 6 ms alone, the four together do."""
    tokens = torch.arange(4).unsqueeze(0)
    even = Draft(tokens, scores=torch.tensor([[0.45, 0.45, 0.45, 0.45]]))
    drafter = _Scored([even])
    rule = GoodputRule(drafter.needs, 1, STEEP_START)
    draft = rule.propose(drafter, Batch.from_rows([[1, 2, 3]]))
    assert draft.tokens.tolist() == [[0, 1, 2, 3]] and rule.proposed
    # The floor is a bound no paying draft falls under: below 0.45, above what one free
    # token more would ask.
    assert 0.1 < drafter.floors[0] < 0.45


def test_a_refused_draft_learns_from_the_text_what_it_would_have_landed():
    """A request whose drafts missed (scale 0.25) has a strong draft refused; the text then
    goes on as the draft said, and the request's scale rises as if it had been verified. A
    draft the text leaves at its second token counts one token, once the text says so."""
    tokens = torch.tensor([[10, 11, 12, 13]])
    strong = Draft(tokens, scores=torch.tensor([[0.9, 0.85, 0.8, 0.75]]))
    drafter = _Scored([strong, strong, strong])
    rule = GoodputRule(drafter.needs, 1, MIDDLING)
    rule.requests.landed[0], rule.requests.promised[0] = 0.5, 2.0
    assert rule.propose(drafter, Batch.from_rows([[1, 2, 3]])).depth == 0  # refused
    assert rule.requests.shadows[0] is not None
    rule.propose(drafter, Batch.from_rows([[1, 2, 3, 10]]))  # too short to tell: it waits
    assert rule.requests.landed[0] == 0.5
    rule.propose(drafter, Batch.from_rows([[1, 2, 3, 10, 11, 12, 13]]))
    assert rule.requests.landed[0] == pytest.approx(0.5 * 0.9 + 4)
    assert rule.requests.promised[0] == pytest.approx(2.0 * 0.9 + 3.3)

    rule = GoodputRule(drafter.needs, 1, MIDDLING)
    drafter = _Scored([strong, strong])
    rule.requests.landed[0], rule.requests.promised[0] = 0.5, 2.0
    rule.propose(drafter, Batch.from_rows([[1, 2, 3]]))
    rule.propose(drafter, Batch.from_rows([[1, 2, 3, 10, 99]]))
    assert rule.requests.landed[0] == pytest.approx(0.5 * 0.9 + 1)
    rule.begin([0])  # a new request in the slot: nothing of the last one's
    assert rule.requests.shadows[0] is None and rule.requests.landed[0] == 1.0


def test_a_draft_keeps_the_prefix_of_the_largest_surplus_whatever_the_drift():
    """The prefix ``_paying`` keeps is the best of all prefixes, also where a wider bucket's
    drift has fallen below a narrower one's (the early stop's bound must hold there too)."""
    rng = random.Random(5)
    for _ in range(3000):
        rule = GoodputRule(Needs(8, 8, shortens=True, scored=True), 1, STEEP_START)
        buckets = len(rule.host.drift[True])
        rule.host.drift[True] = [rng.uniform(0.6, 1.6) for _ in range(buckets)]
        p = sorted((rng.random() for _ in range(8)), reverse=True)
        by_node = [p[0]]
        for value in p[1:]:
            by_node.append(by_node[-1] * value)  # a chain's p falls with depth
        draft = Draft.chain(torch.arange(8).unsqueeze(0))
        rate = rng.uniform(50, 200)
        kept, _ = rule._paying(draft, by_node, 1, rate, 0.0)
        base = rule.verify(1)
        surplus = [0.0] + [
            sum(by_node[:k]) - rate * (rule.verify(k + 1) - base) for k in range(1, 9)
        ]
        assert surplus[len(kept)] == pytest.approx(max(surplus))
