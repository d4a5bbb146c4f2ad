"""Lookahead decoding: token identity with plain decoding, the window's attention pattern, the
pool across requests, and the settings' validation."""

import pytest
import torch
from conftest import FAMILIES, tiny_runners

from quickdraft import SamplingParams, SpecConfig, generate, generate_batch
from quickdraft.drafters.base import Batch, StepResult
from quickdraft.drafters.lookahead import LookaheadConfig, LookaheadDrafter, side_mask
from quickdraft.drafters.registry import make_spec
from quickdraft.models.base import Slots

GREEDY = SamplingParams(temperature=0, max_new_tokens=40)
PROMPTS = [[5, 17, 3, 99, 42, 5, 17], [1, 2, 3, 1, 2, 3, 1, 2], [7]]


@pytest.fixture(scope="module")
def targets():
    return tiny_runners(layers=2)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("settings", [(4, 4, 3), (2, 3, 1), (5, 2, 4), (1, 5, 2)])
def test_lookahead_is_token_identical_to_plain_decoding(targets, family, settings):
    target = targets[family]
    window, ngram, candidates = settings
    spec = make_spec(
        method="lookahead",
        lookahead_window=window,
        lookahead_ngram=ngram,
        lookahead_candidates=candidates,
    )
    for prompt in PROMPTS:
        expected = generate(target, prompt, sampling=GREEDY).token_ids
        out = generate(target, prompt, sampling=GREEDY, spec=spec)
        assert out.token_ids == expected, (family, settings, prompt)
        assert out.stats.target_forwards <= len(expected)


def test_batched_rows_are_identical_too(targets):
    target = targets["qwen2-bias"]
    spec = make_spec(method="lookahead", lookahead_window=3, lookahead_candidates=2)
    prompts = torch.tensor([[5, 17, 3, 99, 42], [1, 2, 3, 1, 2], [8, 8, 8, 8, 8]])
    out = generate_batch(target, prompts, sampling=GREEDY, spec=spec)
    for row, prompt in enumerate(prompts.tolist()):
        assert out.token_ids[row] == generate(target, prompt, sampling=GREEDY).token_ids


def test_window_attention_reads_each_column_as_one_continuation():
    # 3 levels x 2 columns; index j * 2 + i. (j, i) sees level 0 up to column i, then
    # column i of levels 1..j.
    mask = side_mask(3, 2).int().tolist()
    assert mask == [
        [1, 0, 0, 0, 0, 0],  # (0, 0)
        [1, 1, 0, 0, 0, 0],  # (0, 1)
        [1, 0, 1, 0, 0, 0],  # (1, 0)
        [1, 1, 0, 1, 0, 0],  # (1, 1)
        [1, 0, 1, 0, 1, 0],  # (2, 0)
        [1, 1, 0, 1, 0, 1],  # (2, 1)
    ]


def test_pool_carries_over_to_the_next_request(targets):
    """One drafter across requests: the second run of a prompt starts with the first run's
    n-grams and accepts at least as much. Whole drafts: sizing follows measured times, and
    a draft it trims in one run and not the other would measure the host, not the pool."""
    target = targets["llama-tied"]
    drafter = LookaheadDrafter(target.vocab_size, LookaheadConfig(window=3, ngram=4))
    whole = make_spec("lookahead", adaptive_k=False)
    prompt = [5, 17, 3, 99, 42, 5, 17]
    first = generate(target, prompt, sampling=GREEDY, spec=whole, draft=drafter)
    entries = sum(len(e) for e in drafter.pool.values())
    second = generate(target, prompt, sampling=GREEDY, spec=whole, draft=drafter)
    assert first.token_ids == second.token_ids
    assert entries > 0
    assert second.stats.mean_accepted_length >= first.stats.mean_accepted_length


def test_settings_are_validated_at_the_boundary():
    with pytest.raises(ValueError, match="lookahead_window"):
        make_spec(method="lookahead", lookahead_window=0)
    with pytest.raises(ValueError, match="lookahead_ngram"):
        make_spec(method="lookahead", lookahead_ngram=1)
    with pytest.raises(ValueError, match="lookahead"):
        make_spec(method="ngram", lookahead_candidates=2)
    with pytest.raises(ValueError, match="lookahead"):
        from quickdraft.bench.harness import parse_methods

        parse_methods("ar,lookahead@4.4")


def test_smollm2_lookahead_is_identical_and_cli_runs(smollm2, capsys):
    import json

    from quickdraft.cli import main

    target, tokenizer = smollm2
    prompt = tokenizer.apply_chat(
        [{"role": "user", "content": "Write a Python function that returns the squares of 1..n."}]
    )
    sampling = SamplingParams(temperature=0, max_new_tokens=32)
    expected = generate(target, prompt, sampling=sampling).token_ids
    out = generate(target, prompt, sampling=sampling, spec=SpecConfig(method="lookahead"))
    assert out.token_ids == expected
    argv = ["generate", "def add(a, b):", "--method", "lookahead", "--max-new-tokens", "8",
            "--lookahead-window", "2", "--json"]  # fmt: skip
    assert main(argv) == 0
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) == 8


def test_each_slot_keeps_its_own_window():
    """The Jacobi windows live by slot: a batch over slots with holes, out of order, drafts
    with each slot's own window as its side branch, and observing the target's argmax there
    steps those slots' windows only."""
    drafter = LookaheadDrafter(50, LookaheadConfig(window=2, ngram=3, candidates=2))
    drafter.reserve(4, 32)
    full = Batch.from_rows([[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [13, 14]])
    drafter.begin(StepResult(full, full.lengths - 1))  # slots 0..3
    windows = drafter.levels.clone()  # [slots, levels 2, window 2]
    order = [2, 0]
    batch = Batch(
        full.tokens[order], full.lengths[order], Slots.of(order), full.sampling[:2],
        full.generators[:2], full.generator,
    )  # fmt: skip
    draft = drafter.propose(batch)
    assert draft.side is not None and torch.equal(draft.side.tokens, windows[order].flatten(1))
    side_logits = torch.zeros(2, 4, 50)
    side_logits[0, 2:, 40] = 1.0  # the last level's argmax: 40 for slot 2, 41 for slot 0
    side_logits[1, 2:, 41] = 1.0
    zero = torch.zeros(2, dtype=torch.long)
    drafter.observe(StepResult(batch, zero + 1, None, {}, zero, side_logits))
    assert drafter.levels[2].tolist() == [windows[2, 1].tolist(), [40, 40]]
    assert drafter.levels[0].tolist() == [windows[0, 1].tolist(), [41, 41]]
    assert torch.equal(drafter.levels[[1, 3]], windows[[1, 3]])
    assert drafter.age.tolist() == [1, 0, 1, 0]
