"""The serving engine: requests of any length join at any step and leave, each with its own
sampling; every method stays token-identical to plain decoding, and a seeded request's tokens
do not depend on the batch around it."""

import pytest
import torch
from conftest import tiny_hf_model
from test_eagle import random_net
from test_medusa import random_heads

from quickdraft import Engine, SamplingParams, generate, generate_batch
from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
from quickdraft.drafters.eagle.drafter import EagleDrafter
from quickdraft.drafters.eagle.tree import DynamicTree
from quickdraft.drafters.lookahead import LookaheadConfig, LookaheadDrafter
from quickdraft.drafters.medusa.drafter import MedusaDrafter
from quickdraft.drafters.ngram import NGramDrafter
from quickdraft.engine.requests import Status
from quickdraft.models.llama import LlamaRunner

PROMPTS = [
    [5, 17, 3, 99, 42, 5, 17],
    [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2],
    [7],
    [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80],
    [9, 9],
]
ALWAYS = {"disable_by_batch_size": None, "adaptive_k": False}  # every step drafts whole


@pytest.fixture(scope="module")
def target() -> LlamaRunner:
    hf = tiny_hf_model("llama-untied", layers=4)
    return LlamaRunner.from_state_dict(hf.config.to_dict(), hf.state_dict())


def drafters(target: LlamaRunner) -> dict:
    return {
        "draft_model": DraftModelDrafter(target.truncated(2), 3),
        "ngram": NGramDrafter(target.vocab_size, 4),
        "medusa": MedusaDrafter(target, random_heads(64, target.vocab_size, 3)),
        "eagle": EagleDrafter(target, random_net(target, "eagle3"), DynamicTree(3, 2, 5), lookup=2),
        "lookahead": LookaheadDrafter(target.vocab_size, LookaheadConfig(2, 3, 2)),
    }


def serve(engine: Engine, arrivals: dict[int, list[tuple]]) -> dict:
    """Step the engine, adding (prompt, sampling, id) at the steps ``arrivals`` names; the
    final output of every request by id."""
    finished, step = {}, 0
    while step <= max(arrivals) or engine.has_unfinished():
        for prompt, sampling, rid in arrivals.get(step, []):
            engine.add_request(prompt, sampling, request_id=rid)
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
        step += 1
    return finished


@pytest.mark.parametrize("method", ["draft_model", "ngram", "medusa", "eagle", "lookahead"])
def test_every_method_is_token_identical_with_ragged_prompts_joining_mid_run(target, method):
    greedy = [SamplingParams(temperature=0, max_new_tokens=n) for n in (24, 9, 17, 30, 5)]
    expected = [
        generate(target, p, sampling=s).token_ids for p, s in zip(PROMPTS, greedy, strict=True)
    ]
    engine = Engine(target, drafters(target)[method], **ALWAYS, max_batch=3, prefill_chunk=6)
    # Five requests over three rows: some wait for a row, some join while others decode.
    arrivals = {0: [(PROMPTS[0], greedy[0], "a"), (PROMPTS[1], greedy[1], "b")]}
    arrivals[2] = [(PROMPTS[2], greedy[2], "c")]
    arrivals[3] = [(PROMPTS[3], greedy[3], "d"), (PROMPTS[4], greedy[4], "e")]
    out = serve(engine, arrivals)
    for rid, tokens in zip("abcde", expected, strict=True):
        assert out[rid].token_ids == tokens, (method, rid)
        assert out[rid].finish_reason == "length"
    assert not engine.has_unfinished() and engine.scheduler.running == 0


@pytest.mark.parametrize("method", ["draft_model", "eagle", "ngram"])
def test_a_seeded_request_gives_the_same_tokens_alone_and_in_a_batch(target, method):
    seeded = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=20, seed=1234)
    alone = serve(
        Engine(target, drafters(target)[method], **ALWAYS), {0: [(PROMPTS[0], seeded, "x")]}
    )
    others = [SamplingParams(temperature=1.0, max_new_tokens=12), SamplingParams(temperature=0)]
    engine = Engine(target, drafters(target)[method], **ALWAYS, max_batch=3, seed=5)
    arrivals = {
        0: [(PROMPTS[1], others[0], "o1"), (PROMPTS[3], others[1], "o2")],
        2: [(PROMPTS[0], seeded, "x")],  # joins mid-run beside unseeded and greedy rows
    }
    batched = serve(engine, arrivals)
    assert batched["x"].token_ids == alone["x"].token_ids


def test_seeded_speculation_with_deterministic_drafts_gives_plain_sampling(target):
    """Point-mass drafts are judged by drawing the target's own token (one draw per emitted
    token), so a seeded request's tokens are plain sampling's with the same seed."""
    seeded = SamplingParams(temperature=0.8, max_new_tokens=24, seed=99)
    plain = serve(Engine(target), {0: [(PROMPTS[1], seeded, "x")]})["x"].token_ids
    for method in ("ngram", "eagle", "medusa"):
        engine = Engine(target, drafters(target)[method], **ALWAYS)
        assert serve(engine, {0: [(PROMPTS[1], seeded, "x")]})["x"].token_ids == plain, method


def test_abort_frees_the_row_and_leaves_the_others_alone(target):
    greedy = SamplingParams(temperature=0, max_new_tokens=20)
    engine = Engine(target, drafters(target)["eagle"], **ALWAYS, max_batch=2)
    for rid, prompt in zip("abc", PROMPTS[:3], strict=True):
        engine.add_request(prompt, greedy, request_id=rid)
    outputs: dict = {}
    for out in engine.step():
        outputs.setdefault(out.request_id, []).append(out)
    engine.abort("a")  # running
    engine.abort("c")  # still waiting for a row
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    assert outputs["a"][-1].finish_reason == "abort" and outputs["a"][-1].finished
    assert outputs["c"][-1].finish_reason == "abort" and outputs["c"][-1].token_ids == []
    assert outputs["b"][-1].token_ids == generate(target, PROMPTS[1], sampling=greedy).token_ids
    streamed = [t for out in outputs["b"] for t in out.new_token_ids]
    assert streamed == outputs["b"][-1].token_ids


def test_batch_policy_decodes_without_drafts_above_its_threshold(target):
    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    policy = {"disable_by_batch_size": 1}
    for method in ("draft_model", "eagle", "lookahead"):
        engine = Engine(target, drafters(target)[method], **policy, max_batch=2)
        out = serve(engine, {0: [(PROMPTS[0], greedy, "a")], 3: [(PROMPTS[1], greedy, "b")]})
        for rid, prompt in (("a", PROMPTS[0]), ("b", PROMPTS[1])):
            assert out[rid].token_ids == generate(target, prompt, sampling=greedy).token_ids
        drafted = out["a"].stats.drafted
        assert drafted[0] > 0 and 0 in drafted, (method, drafted)  # alone, then beside "b"


def test_per_request_stops_and_sampling_in_one_batch(target):
    base = SamplingParams(temperature=0, max_new_tokens=30)
    expected = generate(target, PROMPTS[0], sampling=base).token_ids
    stop_at = expected[5]
    engine = Engine(target, drafters(target)["ngram"], **ALWAYS, max_batch=3)
    out = serve(
        engine,
        {
            0: [
                (
                    PROMPTS[0],
                    SamplingParams(temperature=0, max_new_tokens=30, stop_token_ids=(stop_at,)),
                    "stop",
                ),
                (PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=4), "short"),
                (PROMPTS[0], SamplingParams(temperature=1.0, top_k=3, max_new_tokens=10), "hot"),
            ]
        },
    )
    assert out["stop"].token_ids == expected[: expected.index(stop_at) + 1]
    assert out["stop"].finish_reason == "stop"
    assert out["short"].token_ids == expected[:4] and out["short"].finish_reason == "length"
    assert len(out["hot"].token_ids) == 10


def test_engine_errors_name_the_field(target):
    engine = Engine(target, max_model_len=32)
    short = SamplingParams(max_new_tokens=8)
    engine.add_request([1, 2], short, request_id="r")
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request([1, 2], short, request_id="r")
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request(list(range(30)), SamplingParams(max_new_tokens=8))
    with pytest.raises(ValueError, match="prompt"):
        engine.add_request([], short)
    with pytest.raises(ValueError, match="prompt"):
        engine.add_request([1, target.vocab_size], short)
    with pytest.raises(ValueError, match="max_batch"):
        Engine(target, max_batch=0)
    with pytest.raises(ValueError, match="max_model_len"):
        Engine(target, max_model_len=10**9)
    with pytest.raises(ValueError, match="stop"):
        engine.add_request([1], SamplingParams(max_new_tokens=8, stop=("x",)))


def test_chunked_prefill_of_a_long_prompt_matches_one_pass(target):
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    prompt = [
        int(t) for t in torch.randint(0, 101, (50,), generator=torch.Generator().manual_seed(0))
    ]
    expected = generate(target, prompt, sampling=greedy).token_ids
    engine = Engine(target, drafters(target)["eagle"], **ALWAYS, prefill_chunk=7)
    assert serve(engine, {0: [(prompt, greedy, "p")]})["p"].token_ids == expected


def test_drafters_follow_along_through_undrafted_steps_and_short_joiners(target):
    """Above the batch policy's threshold steps verify no draft; the drafters' state must
    still follow every row (EAGLE's cache holds one entry per committed token, the draft
    model catches up on the gap), also when a one-token prompt joins beside a long gap."""
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    policy = {"disable_by_batch_size": 1}
    for method in ("draft_model", "eagle", "medusa"):
        drafter = drafters(target)[method]
        engine = Engine(target, drafter, **policy, max_batch=3)
        arrivals = {0: [(PROMPTS[0], greedy, "a"), (PROMPTS[1], greedy, "b")]}
        arrivals[6] = [([7], greedy, "c")]
        out, step = {}, 0
        while step <= 6 or engine.has_unfinished():
            for prompt, sampling, rid in arrivals.get(step, []):
                engine.add_request(prompt, sampling, request_id=rid)
            out.update((o.request_id, o) for o in engine.step() if o.finished)
            if method == "eagle" and engine.scheduler.running:
                # One entry per committed token, counting the features still waiting.
                slots = [r.slot for r in engine.scheduler.held(Status.RUNNING)]
                text = engine.rows.lengths[slots]
                waiting = [sum(h.shape[0] for h, _ in drafter._fresh[s]) for s in slots]
                entries = drafter.cache.lengths[slots] + torch.tensor(waiting)
                assert torch.equal(entries, text - 1), step
            step += 1
        for rid, prompt in (("a", PROMPTS[0]), ("b", PROMPTS[1]), ("c", [7])):
            assert out[rid].token_ids == generate(target, prompt, sampling=greedy).token_ids
        drafted = [d for rid in "abc" for d in out[rid].stats.drafted]
        assert 0 in drafted and max(drafted) > 0, method


def test_prefill_padding_never_overflows_the_cache(target):
    """Rows prefilling together are padded to the widest chunk: a row nearly done with a
    long prompt beside one starting its first chunk must still fit."""
    greedy = SamplingParams(temperature=0, max_new_tokens=3)
    long_prompt, other = list(range(1, 38)), list(range(40, 60))
    engine = Engine(target, max_batch=2, max_model_len=40, prefill_chunk=16)
    out = serve(engine, {0: [(long_prompt, greedy, "a")], 2: [(other, greedy, "b")]})
    assert out["a"].token_ids == generate(target, long_prompt, sampling=greedy).token_ids
    assert out["b"].token_ids == generate(target, other, sampling=greedy).token_ids


def test_a_short_prompt_is_not_padded_to_a_long_ones_width(target):
    """Prompts admitted together prefill in passes of chunks at least half the widest: the
    two-token prompt waits one step rather than be padded to 30 tokens, then prefills alone;
    every pass is at most twice its real tokens and the outputs are plain decoding's. (A
    prompt's last token is not prefilled: it is the first pending token of a verify.)"""
    greedy = SamplingParams(temperature=0, max_new_tokens=4)
    prompts = {"long": list(range(1, 31)), "mid": list(range(31, 47)), "short": [5, 6]}
    engine = Engine(target, max_batch=3)
    passes = []
    prefill = engine.runner.prefill

    def recording(plan):
        passes.append(sorted(plan.counts, reverse=True))
        return prefill(plan)

    engine.runner.prefill = recording
    out = serve(engine, {0: [(p, greedy, name) for name, p in prompts.items()]})
    assert passes == [[29, 15], [1]]
    for name, prompt in prompts.items():
        assert out[name].token_ids == generate(target, prompt, sampling=greedy).token_ids


def test_engine_arguments_are_checked_by_name(target):
    for kwargs, field in (
        ({"max_model_len": 2.5}, "max_model_len"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"seed": "x"}, "seed"),
        ({"prefill_chunk": True}, "prefill_chunk"),
    ):
        with pytest.raises(ValueError, match=field):
            Engine(target, **kwargs)
    with pytest.raises(ValueError, match="acceptance"):
        Engine(target, None, acceptance="lossy-ish")
    with pytest.raises(ValueError, match="disable_by_batch_size"):
        Engine(target, None, disable_by_batch_size=0)
    with pytest.raises(TypeError):  # the method is the spec's: Engine.from_spec
        Engine(target, None, "ngram")
    engine = Engine(target)
    with pytest.raises(ValueError, match="sampling"):
        engine.add_request([1, 2], {"temperature": 0})
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request([1, 2], SamplingParams(max_new_tokens=4), request_id=7)


def test_generate_batch_takes_prompts_of_any_lengths(target):
    greedy = SamplingParams(temperature=0, max_new_tokens=10)
    drafter = drafters(target)["eagle"]
    out = generate_batch(target, PROMPTS, sampling=greedy, draft=drafter)
    for row, prompt in enumerate(PROMPTS):
        assert out.token_ids[row] == generate(target, prompt, sampling=greedy).token_ids
    assert out.stats.batch_size == len(PROMPTS) and out.stats.new_tokens == 10 * len(PROMPTS)


@pytest.mark.parametrize("method", ["ar", "draft_model", "ngram", "medusa", "eagle", "lookahead"])
def test_logprobs_are_the_targets_own_at_every_emitted_token(target, method):
    """Read off the verify pass, they equal one plain forward over prompt + output, for
    accepted drafts and corrected tokens alike, and stop-string cuts keep them aligned."""
    drafter = None if method == "ar" else drafters(target)[method]
    engine = Engine(target, drafter, **ALWAYS, max_batch=3)
    asks = [3, 0, None]
    for i, top in enumerate(asks):
        sampling = SamplingParams(
            temperature=0 if i else 1, seed=7, max_new_tokens=20, logprobs=top
        )
        engine.add_request(PROMPTS[i], sampling, request_id=str(i))
    gathered: dict[str, list] = {"0": [], "1": [], "2": []}
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.new_logprobs is None:
                assert asks[int(out.request_id)] is None
            else:
                assert len(out.new_logprobs) == len(out.new_token_ids)
                gathered[out.request_id] += out.new_logprobs
            if out.finished:
                finals[out.request_id] = out
    for i, top in enumerate(asks[:2]):
        ids = finals[str(i)].token_ids
        full = torch.tensor([PROMPTS[i] + ids])
        cache = target.new_cache(1, full.shape[1])
        logits = target.forward(full, torch.arange(full.shape[1])[None], cache).logits[0]
        expected = torch.log_softmax(logits[len(PROMPTS[i]) - 1 : -1].float(), -1)
        got = gathered[str(i)]
        assert [g.token_id for g in got] == ids
        chosen = expected.gather(1, torch.tensor(ids)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor([g.logprob for g in got]), chosen, atol=1e-4)
        for row, g in zip(expected, got, strict=True):
            assert len(g.top) == top
            values, indices = row.topk(top) if top else (row[:0], row[:0])
            assert [t for t, _ in g.top] == indices.tolist()
            assert torch.allclose(torch.tensor([v for _, v in g.top]), values, atol=1e-4)


def running_slots(engine: Engine) -> tuple[int, ...]:
    return tuple(r.slot for r in engine.scheduler.held(Status.RUNNING))


# Seven requests over four slots, arriving at these steps: (prompt, max_new_tokens, id). Short
# ones finish first and leave holes that later ones fill while long ones still decode or
# prefill (chunks of 6); "c" is aborted mid-run.
SCRAMBLED = {
    0: [(3, 14, "a"), (1, 3, "b"), (0, 16, "c"), (4, 5, "d")],
    2: [(2, 9, "e")],
    4: [(1, 12, "f"), (3, 6, "g")],
}


def serve_steps(engine: Engine, arrivals: dict[int, list[tuple]], watch=None) -> tuple:
    """``serve``, also gathering every request's ``draft_steps`` details; aborts request "c"
    at step 5 and calls ``watch(engine, step)`` after every step."""
    finished, steps, step = {}, {}, 0
    while step <= max(arrivals) or engine.has_unfinished():
        for prompt, sampling, rid in arrivals.get(step, []):
            engine.add_request(prompt, sampling, request_id=rid)
        if step == 5:
            engine.abort("c")
        for out in engine.step():
            steps.setdefault(out.request_id, []).extend(out.new_steps or [])
            if out.finished:
                finished[out.request_id] = out
        if watch is not None:
            watch(engine, step)
        step += 1
    return finished, steps


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
@pytest.mark.parametrize(
    "method", ["draft_model", "eagle", "eagle_chain", "medusa", "lookahead", "ngram"]
)
def test_requests_joining_and_leaving_in_any_order_keep_their_tokens(target, method, sampled):
    """Requests join into the lowest free slots and leave wherever they sit, so the running
    slots have holes; every request still gets the tokens it gets alone (greedy: plain
    decoding's; seeded sampling: its own run alone), and an aborted one a prefix of them.
    Drafters whose rows draft by themselves (a draft model, Medusa heads, an EAGLE chain)
    propose exactly what they propose alone: their per-slot state follows the request; and
    EAGLE's cache holds one entry per committed token of the request in its slot."""

    def sampling(n: int, rid: str) -> SamplingParams:
        seed, temperature = (ord(rid), 0.9) if sampled else (None, 0.0)
        return SamplingParams(
            temperature, top_p=0.95, max_new_tokens=n, seed=seed, draft_steps=True
        )

    def make() -> object:
        if method == "eagle_chain":  # a tree of one branch: each row's own top-1 chain
            return EagleDrafter(target, random_net(target, "eagle3"), DynamicTree(3, 1, 3))
        return drafters(target)[method]

    layouts = []

    def watch(engine: Engine, step: int) -> None:
        slots = list(running_slots(engine))
        layouts.append(tuple(slots))
        if isinstance(drafter, EagleDrafter) and slots:
            waiting = [sum(h.shape[0] for h, _ in drafter._fresh[s]) for s in slots]
            entries = drafter.cache.lengths[slots] + torch.tensor(waiting)
            assert torch.equal(entries, engine.rows.lengths[slots] - 1), step

    arrivals = {
        step: [(PROMPTS[p], sampling(n, rid), rid) for p, n, rid in batch]
        for step, batch in SCRAMBLED.items()
    }
    drafter = make()
    engine = Engine(target, drafter, **ALWAYS, max_batch=4, prefill_chunk=6)
    finished, steps = serve_steps(engine, arrivals, watch)
    holes = [s for s in layouts if s and s != tuple(range(s[0], s[0] + len(s)))]
    assert holes and any(0 not in s for s in layouts if s), layouts  # holes, and slot 0 free
    for prompt, params, rid in (r for batch in arrivals.values() for r in batch):
        alone, alone_steps = serve_steps(
            Engine(target, make(), **ALWAYS), {0: [(prompt, params, rid)]}
        )
        got = finished[rid].token_ids
        if rid == "c":  # aborted at step 5 in both runs: each has a prefix of its tokens
            assert finished[rid].finish_reason == "abort"
            common = min(len(got), len(alone[rid].token_ids))
            assert common > 0 and got[:common] == alone[rid].token_ids[:common]
            continue
        assert got == alone[rid].token_ids, (method, rid)
        if not sampled:
            assert got == generate(target, prompt, sampling=params).token_ids
        if method in ("draft_model", "eagle_chain", "medusa"):
            drafts = [s.draft for s in steps[rid]]
            assert drafts == [s.draft for s in alone_steps[rid]], (method, rid)


def test_leaving_requests_move_nothing_of_the_others(target):
    """A request keeps its slot for life: as others finish or are aborted, its cached entries
    and its tokens stay where they are, bit for bit; an abort between steps writes nothing at
    all; and the cache has no way to move rows."""
    greedy = [SamplingParams(temperature=0, max_new_tokens=n) for n in (6, 20, 3, 12, 9)]
    drafter = drafters(target)["draft_model"]
    engine = Engine(target, drafter, **ALWAYS, max_batch=4)
    for i, (prompt, params) in enumerate(zip(PROMPTS, greedy, strict=True)):
        engine.add_request(prompt, params, request_id=str(i))
    requests = dict(engine.requests)
    assert not hasattr(engine.cache, "permute") and not hasattr(drafter, "reorder")
    tables = (engine.cache.keys, engine.cache.values, engine.cache.lengths, engine.rows.tokens)
    slot_of: dict[str, int] = {}
    finished, step = {}, 0
    while engine.has_unfinished():
        if step == 4:  # abort the request in slot 1, between steps
            victim = next(r for r in requests.values() if r.slot == 1)
            saved = [t.clone() for t in tables]
            engine.abort(victim.request_id)
            assert all(torch.equal(t, s) for t, s in zip(tables, saved, strict=True))
        before = {}
        for rid, r in requests.items():
            if r.status is Status.RUNNING:
                n = int(engine.cache.lengths[r.slot])
                cached = engine.cache.keys[:, r.slot, :n].clone()
                before[rid] = (r.slot, n, cached, engine.rows.tokens[r.slot, : n + 1].clone())
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
        for rid, (slot, n, cached, tokens) in before.items():
            assert slot_of.setdefault(rid, slot) == slot
            if requests[rid].status is Status.RUNNING:  # still here: nothing of it moved
                assert requests[rid].slot == slot
                assert torch.equal(engine.cache.keys[:, slot, :n], cached), (step, rid)
                assert torch.equal(engine.rows.tokens[slot, : n + 1], tokens), (step, rid)
        step += 1
    assert len(set(slot_of.values())) < len(slot_of)  # a freed slot was taken again
    for i, (prompt, params) in enumerate(zip(PROMPTS, greedy, strict=True)):
        expected = generate(target, prompt, sampling=params).token_ids
        got = finished[str(i)].token_ids
        assert got == (expected[: len(got)] if str(i) == victim.request_id else expected)
