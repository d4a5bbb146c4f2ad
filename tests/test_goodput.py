"""Adaptive k: the goodput rule's choices, cut drafts, and token identity with plain decoding."""

import dataclasses

import pytest
import torch
from conftest import tiny_runners

from quickdraft import Engine, SamplingParams, generate, generate_batch
from quickdraft.bench.labels import parse_label
from quickdraft.drafters.base import Draft
from quickdraft.drafters.registry import build_drafter, make_spec
from quickdraft.engine.goodput import PROBE_EVERY, PROBE_K, GoodputRule, expected_tokens

GREEDY = SamplingParams(temperature=0, max_new_tokens=40)
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]


@pytest.fixture(scope="module")
def target():
    return tiny_runners(layers=2)["llama-tied"]


def _seen(rule: GoodputRule, slots: list[int], verify_per_token: float, base: float = 0.01):
    """A drafted step (k = 4, every draft accepted) and a plain one, at these costs."""
    rule.update(slots, 4, [4] * len(slots), 0.0, base + verify_per_token * 5 * len(slots))
    rule.update(slots, 0, [0] * len(slots), 0.0, base + verify_per_token * len(slots))


def test_the_rule_drafts_long_when_drafts_land_and_verifying_is_cheap():
    rule = GoodputRule(max_k=8, rows=4)
    assert rule.choose([0]) == 8  # nothing measured: draft once, then decode once
    rule.update([0], 8, [8], 0.0, 0.010)
    assert rule.choose([0]) == 0
    rule.update([0], 0, [0], 0.0, 0.010)
    for _ in range(5):
        rule.update([0], 8, [8], 0.0, 0.011)
    assert rule.alpha(0) > 0.9 and rule.choose([0]) == 8


def test_the_rule_stops_drafting_for_requests_whose_drafts_fail_and_probes_later():
    rule = GoodputRule(max_k=8, rows=4)
    _seen(rule, [0, 1], verify_per_token=0.01)  # verifying costs as much per token as decoding
    for _ in range(10):
        rule.update([0, 1], 2, [0, 0], 0.0, 0.07)
    assert rule.choose([0, 1]) == 0
    for _ in range(PROBE_EVERY):
        rule.update([0, 1], 0, [0, 0], 0.0, 0.03)
    assert rule.choose([0, 1]) == PROBE_K  # a short draft checks whether it pays again
    rule.begin([1])  # a new request in slot 1 starts from the prior
    assert rule.alpha(1) == pytest.approx(0.5)


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


@pytest.mark.parametrize("label", ["suffix@6~", "ngram@5~"])
def test_adaptive_k_is_token_identical_to_plain_decoding(target, label):
    expected = [generate(target, p, sampling=GREEDY).token_ids for p in PROMPTS]
    _, spec = parse_label(label)
    assert spec.adaptive_k
    drafter = build_drafter(spec, target)
    for prompt, want in zip(PROMPTS, expected, strict=True):
        out = generate(target, prompt, sampling=GREEDY, spec=spec, draft=drafter)
        assert out.token_ids == want
        assert set(out.stats.drafted) - {0} and max(out.stats.drafted) <= spec.k
    assert generate_batch(target, PROMPTS, sampling=GREEDY, spec=spec).token_ids == expected


def test_adaptive_k_with_a_draft_model_is_token_identical(target):
    draft = tiny_runners(layers=1)["llama-tied"]
    spec = make_spec("draft_model", 4, adaptive_k=True)
    want = generate(target, PROMPTS[0], sampling=GREEDY).token_ids
    assert generate(target, PROMPTS[0], sampling=GREEDY, spec=spec, draft=draft).token_ids == want


def test_drafters_that_cannot_cut_their_drafts_are_refused(target):
    class Whole:  # a drafter without ``Needs.shortens``
        vocab_size = target.vocab_size
        needs = dataclasses.replace(build_drafter(make_spec("ngram"), target).needs, shortens=False)
        head_rows = 0

        def reserve(self, rows: int, capacity: int) -> None: ...

    with pytest.raises(ValueError, match="adaptive_k: Whole cannot cut"):
        Engine(target, Whole(), adaptive_k=True)
    with pytest.raises(ValueError, match="adaptive_k must be true or false"):
        make_spec("ngram", adaptive_k="yes")
