"""Suffix decoding: the count tries, the trees they grow, and exactness through the engine
(the distribution rows are in ``quickdraft.conformance``'s grid)."""

import dataclasses

import pytest
import torch
from conftest import FAMILIES, tiny_runners

from quickdraft import Engine, SamplingParams, generate, generate_batch
from quickdraft.drafters.base import Batch, StepResult
from quickdraft.drafters.registry import build_drafter, make_spec
from quickdraft.drafters.suffix.drafter import LATER, MATCHED, SuffixDrafter, chances
from quickdraft.drafters.suffix.options import SuffixOptions
from quickdraft.drafters.suffix.trie import Proposal, SuffixTrie, chain, grow, longest

GREEDY = SamplingParams(temperature=0, max_new_tokens=40)
REPEATING = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
PROMPTS = [REPEATING, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [11, 12, 11, 12, 11]]


@pytest.fixture(scope="module")
def targets():
    return tiny_runners(layers=2)


def test_the_trie_counts_substrings_and_a_removed_text_leaves_nothing():
    trie = SuffixTrie(depth=3)
    cursor = trie.extend(trie.cursor(), [1, 2, 1])
    cursor = trie.extend(cursor, [2, 3])  # the same as adding 1 2 1 2 3 at once
    whole = SuffixTrie(depth=3)
    whole.extend(whole.cursor(), [1, 2, 1, 2, 3])

    def counts(node, prefix=()):
        found = {prefix: node.count} if prefix else {}
        for token, child in node.children.items():
            found |= counts(child, (*prefix, token))
        return found

    assert counts(trie.root) == counts(whole.root)
    seen = counts(trie.root)
    assert seen[(1, 2)] == 2 and seen[(2,)] == 2 and seen[(1, 2, 1)] == 1
    assert max(map(len, seen)) == 3  # nothing longer than the depth
    # the longest suffix with a continuation: "1 2" (then "1" or "3"), not "2 1 2"
    node, length = trie.match([9, 2, 1, 2])
    assert length == 2 and set(node.children) == {1, 3}
    assert trie.match([7, 7]) == (None, 0)
    trie.remove([1, 2, 1, 2, 3])
    assert trie.root.children == {} and trie.tokens == 0


def test_trees_grow_best_first_above_the_floor():
    trie = SuffixTrie(depth=4)
    for text in ([1, 2, 3], [1, 2, 3], [1, 2, 4], [1, 5, 6]):
        trie.extend(trie.cursor(), text)
    node, _ = trie.match([1])
    tree = grow(node, budget=8, min_prob=0.0)
    # 2 (3 of 4), 3 (2 of 4), then at 1 of 4 each in the order found: 5, 4 (found when 2
    # was drafted), 6 (when 5 was)
    assert tree.tokens == (2, 3, 5, 4, 6) and tree.parents == (-1, 0, -1, 0, 2)
    assert tree.score == pytest.approx(0.75 + 0.5 + 0.25 + 0.25 + 0.25)
    assert tree.probs == pytest.approx((0.75, 0.5, 0.25, 0.25, 0.25))  # each node's path
    path = chain(node, budget=8, min_prob=0.0)
    assert path.tokens == (2, 3) and path.parents == (-1, 0)
    assert path.score == pytest.approx(0.75 + 0.5)
    assert grow(node, budget=2, min_prob=0.0).tokens == (2, 3)
    assert grow(node, budget=8, min_prob=0.3).tokens == (2, 3)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_suffix_trees_and_chains_are_token_identical_to_plain_decoding(targets, family):
    target = targets[family]
    spec = make_spec(method="suffix", suffix_spec_factor=2.0, suffix_min_prob=0.05)
    expected = [generate(target, p, sampling=GREEDY).token_ids for p in PROMPTS]
    drafter = build_drafter(spec, target)
    for prompt, want in zip(PROMPTS, expected, strict=True):  # one row: trees
        assert generate(target, prompt, sampling=GREEDY, draft=drafter).token_ids == want
    whole = make_spec(method="suffix", suffix_spec_factor=2.0, adaptive_k=False)
    assert sum(generate(target, REPEATING, sampling=GREEDY, spec=whole).stats.accepted_drafts)
    batch = generate_batch(target, PROMPTS, sampling=GREEDY, spec=spec)  # rows: chains
    assert batch.token_ids == expected


def test_a_long_repetition_still_drafts_k_deep():
    """A match as deep as the trie would leave nothing below it to draft: the match stops
    k tokens short of the depth, so periodic text drafts k tokens."""
    drafter = SuffixDrafter(100, 4, SuffixOptions(suffix_max_depth=8, suffix_spec_factor=4.0))
    drafter.reserve(1, 64)
    text = [5, 6, 7, 8] * 6
    trie = SuffixTrie(8)
    trie.extend(trie.cursor(), text)
    drafter.own[0] = trie
    assert drafter.proposal(0, text).tokens == (5, 6, 7, 8)
    assert drafter.proposal(0, text, tree=False).tokens == (5, 6, 7, 8)


def test_a_reused_drafter_keeps_its_cap(targets):
    """A drafter given to several engines (``generate(..., draft=drafter)``): what the last
    engine's requests wrote stays retirable, so the cap holds."""
    target = targets["llama-untied"]
    drafter = SuffixDrafter(target.vocab_size, 4, SuffixOptions(suffix_cache_tokens=30))
    for prompt in PROMPTS:
        generate(target, prompt, sampling=GREEDY, draft=drafter)
    assert drafter.cached_tokens <= 30 + 40


def test_a_later_request_drafts_from_an_earlier_ones_output(targets):
    """The global trie: a second request with the same prompt accepts far more drafts than
    the first, whose own text had little to match; sampled at T = 1 the outputs still come
    from the target (the same seed gives the same tokens as plain decoding's engine)."""
    target = targets["llama-untied"]
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    drafter = SuffixDrafter(target.vocab_size, 8, SuffixOptions(suffix_spec_factor=4.0))
    engine = Engine(target, drafter, max_batch=1, disable_by_batch_size=None)
    accepted = []
    for _ in range(2):
        engine.add_request(prompt, GREEDY)
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    assert out.token_ids == generate(target, prompt, sampling=GREEDY).token_ids
                    accepted.append(sum(out.stats.accepted_drafts))
    assert accepted[1] >= accepted[0] + 20
    # both outputs, 40 tokens each (and what a last verify kept past the 40th: the engine
    # writes a step's accepted tokens before it cuts the output at max_new_tokens)
    assert 80 <= drafter.cached_tokens <= 80 + 2 * 8


def test_the_global_trie_keeps_to_its_cap_oldest_first(targets):
    """Completed outputs are retired when their requests leave and evicted oldest first past
    the cap: once every request left, the trie holds the newest outputs within it."""
    target = targets["llama-untied"]
    drafter = SuffixDrafter(target.vocab_size, 4, SuffixOptions(suffix_cache_tokens=50))
    engine = Engine(target, drafter, max_batch=1, disable_by_batch_size=None)
    for prompt in PROMPTS:
        engine.add_request(prompt, GREEDY)
        while engine.has_unfinished():
            engine.step()
        assert drafter.cached_tokens <= 50
    newest = list(drafter.retired)[-1]
    engine.add_request([1, 2], SamplingParams(temperature=0, max_new_tokens=2))
    while engine.has_unfinished():
        engine.step()
    assert drafter.cached_tokens <= 50
    assert list(drafter.retired)[-2:][0] == newest  # the oldest went first


def test_settings_are_checked_by_name():
    for field, value in (
        ("suffix_max_depth", 1), ("suffix_max_depth", 65), ("suffix_spec_factor", 0.0),
        ("suffix_min_prob", 1.5), ("suffix_min_prob", float("nan")),
        ("suffix_cache_tokens", -1),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=field):
            make_spec(method="suffix", **{field: value})
    with pytest.raises(ValueError, match="suffix"):
        make_spec(method="ngram", suffix_min_prob=0.2)


def test_an_aborted_requests_output_leaves_the_shared_trie_at_once(targets):
    """A completed request's output stays for later requests; an aborted one's partial
    output is taken out when it leaves (``Drafter.release``)."""
    target = targets["llama-untied"]
    drafter = SuffixDrafter(target.vocab_size, 4)
    engine = Engine(target, drafter, max_batch=2, disable_by_batch_size=None)
    engine.add_request(PROMPTS[0], GREEDY, request_id="done")
    engine.add_request(PROMPTS[1], GREEDY, request_id="cut")
    for _ in range(6):
        engine.step()
    partial = drafter.cached_tokens
    engine.abort("cut")
    while engine.has_unfinished():
        engine.step()
    assert 0 < drafter.cached_tokens < partial + 40  # "cut"'s tokens went
    assert (
        drafter.cached_tokens <= 40 + 8
        and sum(len(out) for _, out in drafter.retired) == drafter.cached_tokens
    )


@pytest.mark.parametrize("model", ["eagle", "draft_model"])
def test_suffix_first_is_token_identical_and_uses_both_drafters(targets, model):
    from test_eagle import random_net

    from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
    from quickdraft.drafters.eagle.drafter import EagleDrafter
    from quickdraft.drafters.eagle.tree import DynamicTree
    from quickdraft.drafters.suffix.hybrid import SuffixFirst, suffix_first

    target = targets["llama-untied"]
    if model == "eagle":
        inner = EagleDrafter(target, random_net(target, "eagle3"), DynamicTree(3, 2, 5))
    else:
        inner = DraftModelDrafter(tiny_runners(layers=1)["llama-untied"], 3)
    drafter = suffix_first(inner)
    assert isinstance(drafter, SuffixFirst) and drafter.needs.depth == 8
    for prompt in [*PROMPTS, REPEATING * 3]:
        want = generate(target, prompt, sampling=GREEDY).token_ids
        assert generate(target, prompt, sampling=GREEDY, draft=drafter).token_ids == want
    assert drafter.steps["suffix"] > 0 and drafter.steps["model"] > 0
    gauges = drafter.gauges()
    assert gauges["suffix_hits"] <= gauges["suffix_lookups"] and gauges["suffix_cache_tokens"]
    batch = generate_batch(target, PROMPTS, sampling=GREEDY, draft=drafter)
    assert batch.token_ids == [generate(target, p, sampling=GREEDY).token_ids for p in PROMPTS]


def test_suffix_first_is_an_option_of_eagle_and_draft_model():
    assert make_spec("eagle", suffix_first=True).options.suffix_first
    assert make_spec("draft_model", suffix_first=True).options.suffix_first
    with pytest.raises(ValueError, match="suffix_first"):
        make_spec("draft_model", suffix_first="yes")
    with pytest.raises(ValueError):
        make_spec("ngram", suffix_first=True)


def test_suffix_drafts_are_scored_by_their_match_and_counts():
    """A node's score is its path's chance: the first token's by the match's length, each
    later one's LATER, times the square of its share of its parent's count."""
    agreed = Proposal((4, 5), (-1, 0), 2.0, (1.0, 1.0), matched=2)
    assert chances(agreed) == pytest.approx([MATCHED[1], MATCHED[1] * LATER])
    split = Proposal((4, 5, 6), (-1, 0, -1), 1.5, (0.5, 0.5, 0.5), matched=9)
    assert chances(split) == pytest.approx(
        [MATCHED[-1] * 0.25, MATCHED[-1] * 0.25 * LATER, MATCHED[-1] * 0.25]
    )
    drafter = SuffixDrafter(vocab_size=20, num_tokens=4)
    drafter.reserve(1, 64)
    rows = [[1, 2, 3, 7, 1, 2, 3]]
    drafter.begin(StepResult(Batch.from_rows(rows), torch.zeros(1)))
    draft = drafter.propose(Batch.from_rows(rows))
    assert draft.tokens.tolist() == [[7, 1, 2]]  # a match of 3 drafts 3
    assert draft.scores[0, 0].item() == pytest.approx(MATCHED[2])


def test_the_cursor_finds_the_match_a_walk_of_the_trie_finds():
    """Once the own trie read a text, its cursor's nodes are the text's suffixes: the
    longest with a continuation is the one ``match`` walks to, at any room."""
    generator = torch.Generator().manual_seed(5)
    for _ in range(20):
        text = torch.randint(0, 4, (int(torch.randint(1, 40, (1,), generator=generator)),),
                             generator=generator).tolist()  # fmt: skip
        trie = SuffixTrie(8)
        cursor = trie.extend(trie.cursor(), text)
        for room in (1, 3, 7):
            assert longest(cursor, 8 - room) == trie.match(text, room), (text, room)


def test_a_match_whose_best_first_token_is_below_the_floor_drafts_nothing():
    drafter = SuffixDrafter(vocab_size=20, num_tokens=4)
    drafter.reserve(1, 64)
    rows = [[1, 2, 3, 7, 1, 2, 3]]  # a match of 3, one continuation: MATCHED[2]
    drafter.begin(StepResult(Batch.from_rows(rows), torch.zeros(1)))
    for floor, width in ((MATCHED[2] - 0.01, 3), (MATCHED[2] + 0.01, 0)):
        batch = dataclasses.replace(Batch.from_rows(rows), floor=floor)
        assert drafter.propose(batch).tokens.shape == (1, width)
