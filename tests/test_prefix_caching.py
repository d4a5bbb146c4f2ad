"""Prefix caching: a freed slot keeps its last request's cache, and a prompt that begins with
that request's text (a session's next turn) takes the slot and prefills only the rest; the
tokens stay those of a fresh engine, greedy and seeded."""

import pytest
import torch
from conftest import tiny_hf_model
from test_eagle import random_net

from quickdraft import Engine, SamplingParams, generate
from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
from quickdraft.drafters.eagle.drafter import EagleDrafter
from quickdraft.drafters.eagle.tree import DynamicTree
from quickdraft.drafters.lookahead import LookaheadConfig, LookaheadDrafter
from quickdraft.drafters.ngram import NGramDrafter
from quickdraft.drafters.suffix.drafter import SuffixDrafter
from quickdraft.models.llama import LlamaRunner

ALWAYS = {"disable_by_batch_size": None, "adaptive_k": False}  # every step drafts whole
FIRST = [5, 17, 3, 99, 42, 5, 17, 3]
GREEDY = SamplingParams(temperature=0, max_new_tokens=14)


@pytest.fixture(scope="module")
def target() -> LlamaRunner:
    hf = tiny_hf_model("llama-untied", layers=3)
    return LlamaRunner.from_state_dict(hf.config.to_dict(), hf.state_dict())


def drafter(target: LlamaRunner, method: str):
    return {
        "ar": lambda: None,
        "draft_model": lambda: DraftModelDrafter(target.truncated(2), 3),
        "ngram": lambda: NGramDrafter(target.vocab_size, 4),
        "suffix": lambda: SuffixDrafter(target.vocab_size, 4),
        "lookahead": lambda: LookaheadDrafter(target.vocab_size, LookaheadConfig(2, 3, 2)),
    }[method]()


def run(engine: Engine, prompt: list[int], sampling: SamplingParams = GREEDY):
    rid = engine.add_request(prompt, sampling)
    last = None
    while engine.has_unfinished():
        last = next((o for o in engine.step() if o.request_id == rid), last)
    assert last is not None and last.finished
    return last


@pytest.mark.parametrize("method", ["ar", "draft_model", "ngram", "suffix", "lookahead"])
def test_a_sessions_next_turn_prefills_only_what_it_adds(target, method):
    engine = Engine(target, drafter(target, method), **ALWAYS, max_batch=2)
    first = run(engine, FIRST)
    assert first.stats.cached_prompt_tokens == 0
    turn = FIRST + first.token_ids + [7, 8, 9]
    second = run(engine, turn)
    # Everything the slot cached of them: the first prompt and reply, but for the reply's last
    # token when it was pending (a step that ran past max_new_tokens cached it too).
    done = len(FIRST) + len(first.token_ids)
    assert done - 1 <= second.stats.cached_prompt_tokens <= done
    assert second.token_ids == generate(target, turn, sampling=GREEDY).token_ids
    seeded = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=14, seed=7)
    third = turn + second.token_ids + [11]
    sampled = run(engine, third, seeded)
    assert sampled.stats.cached_prompt_tokens >= len(turn) + len(second.token_ids) - 1
    fresh = run(Engine(target, drafter(target, method), **ALWAYS), third, seeded)
    assert sampled.token_ids == fresh.token_ids


def test_a_request_takes_the_free_slot_holding_most_of_its_prompt(target):
    engine = Engine(target, max_batch=3)
    a, b = [1, 2, 3, 4, 5, 6], [40, 41, 42, 43, 44, 45, 46]
    ids = [engine.add_request(p, GREEDY) for p in (a, b)]
    outs = {}
    while engine.has_unfinished():
        outs.update((o.request_id, o) for o in engine.step() if o.finished)
    # b ran in slot 1; its next turn goes there although slot 0 is free and lower.
    follow = b + outs[ids[1]].token_ids + [9]
    other = [70, 71, 72]  # shares nothing: the free slot caching nothing, not a's
    last = [80, 81]  # no such slot left: the lowest of those caching something
    for rid, prompt in (("follow", follow), ("other", other), ("last", last)):
        engine.add_request(prompt, GREEDY, request_id=rid)
    engine.step()
    assert engine.requests["follow"].slot == 1
    assert engine.requests["other"].slot == 2
    assert engine.requests["last"].slot == 0
    assert engine.requests["follow"].stats.cached_prompt_tokens >= len(follow) - 2


def test_a_prompt_sharing_part_of_a_slots_text_reuses_that_part(target):
    engine = Engine(target, max_batch=1)
    first = run(engine, FIRST)
    branch = [*FIRST[:5], 60, 61, 62]  # diverges at position 5
    out = run(engine, branch)
    assert out.stats.cached_prompt_tokens == 5
    assert out.token_ids == generate(target, branch, sampling=GREEDY).token_ids
    again = run(engine, FIRST)  # the slot now holds ``branch``: FIRST shares 5 tokens of it
    assert again.stats.cached_prompt_tokens == 5 and again.token_ids == first.token_ids


def test_an_aborted_prefill_leaves_only_what_it_cached(target):
    engine = Engine(target, max_batch=1, prefill_chunk=4)
    long = list(range(30, 51))
    engine.add_request(long, GREEDY, request_id="x")
    engine.step()  # one chunk of 4 prompt tokens cached
    engine.abort("x")
    engine.step()
    out = run(engine, long)
    assert out.stats.cached_prompt_tokens == 4
    assert out.token_ids == generate(target, long, sampling=GREEDY).token_ids


def test_off_by_choice_and_for_drafters_that_read_the_prompts_features(target):
    from quickdraft.drafters.medusa.drafter import MedusaDrafter
    from quickdraft.drafters.medusa.net import MedusaConfig, MedusaHeads

    engine = Engine(target, max_batch=1, prefix_caching=False)
    first = run(engine, FIRST)
    assert run(engine, FIRST + first.token_ids).stats.cached_prompt_tokens == 0
    config = MedusaConfig(hidden_size=target.config.hidden_size, vocab_size=target.vocab_size)
    medusa = MedusaDrafter(target, MedusaHeads(config))
    assert not Engine(target, medusa, **ALWAYS, max_batch=1).prefix_caching  # reads features
    # and keeps none of a slot's last text


@pytest.mark.parametrize("variant", ["eagle3", "eagle1"])
def test_eagle_resumes_a_slots_prefix_with_the_drafts_of_a_fresh_engine(target, variant):
    """EAGLE keeps its own cache per slot: a session's next turn reuses the target's cached
    prefix but one token (whose feature its entry there needs) and the drafter's entries
    before it, so it prefills only the rest and drafts as an engine that read it all."""
    net = random_net(target, variant)

    def engine(caching: bool) -> Engine:
        eagle = EagleDrafter(target, net, DynamicTree(3, 2, 5))
        return Engine(target, eagle, **ALWAYS, max_batch=2, prefix_caching=caching)

    cached = engine(True)
    assert cached.prefix_caching
    first = run(cached, FIRST)
    turn = FIRST + first.token_ids + [7, 8, 9]
    second = run(cached, turn)
    plain = Engine(target, max_batch=2)
    run(plain, FIRST)
    # At most one token less than plain decoding reuses: the feature there is recomputed. The
    # last step's features, still waiting for a propose when the request ended, count as held.
    assert second.stats.cached_prompt_tokens >= run(plain, turn).stats.cached_prompt_tokens - 1
    fresh = run(engine(False), turn)
    assert fresh.stats.cached_prompt_tokens == 0
    assert second.token_ids == fresh.token_ids == generate(target, turn, sampling=GREEDY).token_ids
    assert second.stats.accepted_drafts == fresh.stats.accepted_drafts
    # A prompt diverging inside the slot's text keeps the entries before the divergence only.
    branch = [*turn[:6], 60, 61, 62]
    out = run(cached, branch)
    assert out.stats.cached_prompt_tokens == 5
    again = run(engine(False), branch)
    assert out.token_ids == again.token_ids
    assert out.stats.accepted_drafts == again.stats.accepted_drafts


def test_eagle_behind_suffix_decoding_resumes_with_the_features_it_never_drafted_from(target):
    """suffix+eagle: steps suffix decoding drafts leave EAGLE's features waiting; they count
    as held, and the next turn makes its entries from them, so it reuses as much of the
    prefix as EAGLE alone does."""
    from quickdraft.drafters.suffix.hybrid import suffix_first

    net = random_net(target, "eagle3")
    hybrid = suffix_first(EagleDrafter(target, net, DynamicTree(3, 2, 5)))
    engine = Engine(target, hybrid, **ALWAYS, max_batch=1)
    repeated = FIRST * 3  # suffix decoding drafts where the text repeats
    first = run(engine, repeated)
    waiting = sum(h.shape[0] for h, _ in hybrid.model._fresh[0])
    assert int(hybrid.resumable()[0]) == int(hybrid.model.cache.lengths[0]) + waiting
    turn = repeated + first.token_ids + [7, 8]
    second = run(engine, turn)
    plain = Engine(target, max_batch=1)
    run(plain, repeated)
    assert second.stats.cached_prompt_tokens >= run(plain, turn).stats.cached_prompt_tokens - 1
    assert second.token_ids == generate(target, turn, sampling=GREEDY).token_ids


def test_eagle_after_a_prefill_aborted_midway_keeps_only_the_prefix_both_hold(target):
    """A request aborted while prefilling (a client gone) left the target's cache holding its
    own chunks, but EAGLE's entries still the slot's last text: a retry of the same prompt
    reused entries of another text. It keeps only the prefix both held, and drafts as a fresh
    engine."""
    net = random_net(target, "eagle3")

    def engine(caching: bool) -> Engine:
        eagle = EagleDrafter(target, net, DynamicTree(3, 2, 5))
        return Engine(target, eagle, **ALWAYS, max_batch=1, prefill_chunk=4,
                      prefix_caching=caching)  # fmt: skip

    a = [5, 17, 3, 99, 42, 5, 17, 3, 8, 9, 10, 11, 12, 13, 14, 15]
    cached = engine(True)
    run(cached, a)
    b = a[:5] + list(range(60, 76))
    cached.add_request(b, GREEDY, request_id="b")
    for _ in range(3):  # chunks of b past its divergence from a at 5
        cached.step()
    cached.abort("b")
    cached.step()
    retried = run(cached, b)
    fresh = run(engine(False), b)
    assert retried.stats.cached_prompt_tokens <= 4
    assert retried.token_ids == fresh.token_ids
    assert retried.stats.accepted_drafts == fresh.stats.accepted_drafts
    held = cached.drafter.cache.lengths[0]
    made = engine(False)
    run(made, b)
    assert torch.allclose(
        cached.drafter.cache.keys[0, 0, :held], made.drafter.cache.keys[0, 0, :held], atol=1e-4
    )
