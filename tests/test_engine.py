"""The decoding loop end to end on toy models: greedy identity, stopping, seeding, stats."""

import pytest
import torch

from quickdraft import AcceptRule, Method, SamplingParams, SpecConfig, generate, generate_batch
from quickdraft.drafters.registry import make_spec
from quickdraft.engine.requests import Request
from quickdraft.engine.scheduler import Rows
from quickdraft.models import NGramLM, ToyTokenizer
from quickdraft.models.base import Slots

VOCAB = 26
PROMPTS = [[0, 1, 2, 3], [7, 7, 7, 7], [25, 3, 9, 14], [5, 4, 3, 2]]


@pytest.fixture(scope="module")
def target():
    return NGramLM.random(VOCAB, order=3, seed=0, sharpness=3.0)


@pytest.fixture(scope="module")
def draft(target):
    return target.perturbed(0.35)


def greedy_params(**kwargs):
    return SamplingParams(temperature=0, **kwargs)


def ar(target, prompt, **kwargs):
    return generate(
        target, prompt, sampling=greedy_params(**kwargs), spec=SpecConfig(method=Method.AR)
    )


@pytest.mark.parametrize("rule", list(AcceptRule))
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_speculation_is_token_identical_to_plain_decoding(target, draft, k, rule):
    spec = SpecConfig(num_speculative_tokens=k, acceptance=rule, adaptive_k=False)  # k each step
    for prompt in PROMPTS:
        expected = ar(target, prompt, max_new_tokens=40).token_ids
        out = generate(
            target, prompt, sampling=greedy_params(max_new_tokens=40), spec=spec, draft=draft
        )
        assert out.token_ids == expected
        assert len(out.stats.accepted_drafts) == out.stats.target_forwards
        assert 1.0 < out.stats.mean_accepted_length <= k + 1


@pytest.mark.parametrize("k", [1, 3, 8])
def test_batched_rows_match_single_runs_despite_ragged_acceptance(target, draft, k):
    spec = SpecConfig(num_speculative_tokens=k, disable_by_batch_size=None)  # a batch of 4
    batch = generate_batch(
        target, PROMPTS, sampling=greedy_params(max_new_tokens=33), spec=spec, draft=draft
    )
    for prompt, ids in zip(PROMPTS, batch.token_ids, strict=True):
        assert ids == ar(target, prompt, max_new_tokens=33).token_ids
    assert len(set(batch.stats.accepted_drafts)) > 1  # rows really accepted different amounts


def test_plain_decoding_statistics(target):
    out = ar(target, PROMPTS[0], max_new_tokens=25)
    stats = out.stats
    assert stats.k == 0 and stats.new_tokens == 25 and stats.target_forwards == 25
    assert stats.mean_accepted_length == 1.0 and stats.acceptance_by_position == []
    assert out.from_draft == [False] * 25


def test_perfect_draft_accepts_everything(target):
    k = 4
    out = generate(
        target,
        PROMPTS[2],
        sampling=SamplingParams(max_new_tokens=50, seed=3),
        spec=SpecConfig(num_speculative_tokens=k),
        draft=target.perturbed(0.0),
    )
    stats = out.stats
    assert stats.acceptance_by_position == [1.0] * k
    assert stats.mean_accepted_length == k + 1
    assert stats.target_forwards == 10  # 50 tokens, 5 per verify step
    assert out.from_draft == ([True] * k + [False]) * 10


def test_statistics_are_consistent(target, draft):
    out = generate(
        target,
        PROMPTS[1],
        sampling=SamplingParams(max_new_tokens=60, seed=1),
        spec=SpecConfig(num_speculative_tokens=3),
        draft=draft,
    )
    stats = out.stats
    assert len(stats.acceptance_by_position) == 3
    assert all(0.0 <= rate <= 1.0 for rate in stats.acceptance_by_position)
    assert sum(stats.accepted_lengths) >= stats.new_tokens == 60
    assert sum(out.from_draft) <= sum(stats.accepted_drafts)
    times = stats.to_dict()["time_s"]
    assert min(times.values()) >= 0
    assert times["prefill"] + times["draft"] + times["verify"] <= times["total"] + 1e-9
    assert "mean accepted length" in stats.summary()


def test_stop_token_inside_an_accepted_chunk_ends_the_output_there(target):
    k = 4
    reference = ar(target, PROMPTS[0], max_new_tokens=40).token_ids
    # With a perfect draft every step adds k + 1 tokens; pick a stop token that first appears
    # strictly inside such a chunk, so it arrives among accepted draft tokens.
    index = next(
        i for i, token in enumerate(reference) if i % (k + 1) < k and token not in reference[:i]
    )
    stop = reference[index]
    out = generate(
        target,
        PROMPTS[0],
        sampling=greedy_params(max_new_tokens=40, stop_token_ids=(stop,)),
        spec=SpecConfig(num_speculative_tokens=k),
        draft=target.perturbed(0.0),
    )
    assert out.token_ids == reference[: index + 1]
    assert out.finish_reason == "stop"
    assert out.stats.new_tokens == index + 1


@pytest.mark.parametrize("max_new_tokens", [1, 4, 5])
def test_max_new_tokens_is_exact_at_1_k_and_k_plus_1(target, max_new_tokens):
    reference = ar(target, PROMPTS[3], max_new_tokens=20).token_ids
    out = generate(
        target,
        PROMPTS[3],
        sampling=greedy_params(max_new_tokens=max_new_tokens),
        spec=SpecConfig(num_speculative_tokens=4),
        draft=target.perturbed(0.0),
    )
    assert out.token_ids == reference[:max_new_tokens]
    assert out.finish_reason == "length"


def test_stop_strings_cut_the_text_before_the_match(target, draft):
    tokenizer = ToyTokenizer(VOCAB)
    reference = ar(target, PROMPTS[0], max_new_tokens=40).token_ids
    text = tokenizer.decode(reference)
    stop = text[10:12]
    cut = text.find(stop)
    out = generate(
        target,
        PROMPTS[0],
        sampling=greedy_params(max_new_tokens=40, stop=(stop, "never-there")),
        spec=SpecConfig(num_speculative_tokens=4),
        draft=draft,
        tokenizer=tokenizer,
    )
    assert out.text == text[:cut]
    assert out.token_ids == reference[: cut + 2]  # up to the token that completes the match
    assert out.finish_reason == "stop"


def test_text_prompts_need_and_use_a_tokenizer(target):
    tokenizer = ToyTokenizer(VOCAB)
    out = generate(target, "abcd", sampling=greedy_params(max_new_tokens=5), tokenizer=tokenizer)
    assert out.token_ids == ar(target, PROMPTS[0], max_new_tokens=5).token_ids
    assert out.text == tokenizer.decode(out.token_ids)
    with pytest.raises(ValueError, match="prompt"):
        generate(target, "abcd")
    with pytest.raises(ValueError, match="stop"):
        generate(target, [1, 2], sampling=SamplingParams(stop=("x",)))


def test_one_token_prompt(target, draft):
    expected = ar(target, [4], max_new_tokens=12).token_ids
    out = generate(target, [4], sampling=greedy_params(max_new_tokens=12), draft=draft)
    assert out.token_ids == expected


def test_bad_prompts_raise_value_errors(target, draft):
    with pytest.raises(ValueError, match="prompt"):
        generate(target, [])
    with pytest.raises(ValueError, match="prompt"):
        generate(target, [VOCAB])
    small = NGramLM(target.table, order=3, max_positions=32)
    with pytest.raises(ValueError, match="context"):
        generate(small, list(range(20)), sampling=SamplingParams(max_new_tokens=13))
    assert (
        len(
            generate(
                small, list(range(20)), sampling=SamplingParams(max_new_tokens=12), draft=draft
            ).token_ids
        )
        == 12
    )
    with pytest.raises(ValueError, match="draft"):
        generate(target, [1, 2], spec=SpecConfig())
    with pytest.raises(ValueError, match="vocabulary"):
        generate(target, [1, 2], draft=NGramLM.random(VOCAB + 1, order=3, seed=0))


@pytest.mark.parametrize("rule", list(AcceptRule))
def test_sampled_runs_with_one_seed_repeat_exactly(target, draft, rule):
    spec = SpecConfig(num_speculative_tokens=3, acceptance=rule)
    runs = [
        generate(
            target,
            PROMPTS[1],
            spec=spec,
            draft=draft,
            sampling=SamplingParams(
                temperature=0.9, top_k=8, top_p=0.95, max_new_tokens=40, seed=seed
            ),
        )
        for seed in (5, 5, 6)
    ]
    assert runs[0].token_ids == runs[1].token_ids
    assert runs[0].stats.accepted_drafts == runs[1].stats.accepted_drafts
    assert runs[0].token_ids != runs[2].token_ids


def test_draft_temperature_changes_acceptance_not_exactness(target, draft):
    # Greedy target with a sampled draft: still token-identical to plain greedy decoding.
    expected = ar(target, PROMPTS[2], max_new_tokens=30).token_ids
    out = generate(
        target,
        PROMPTS[2],
        sampling=greedy_params(max_new_tokens=30, seed=0),
        spec=make_spec(num_speculative_tokens=4, draft_temperature=1.5),
        draft=draft,
    )
    assert out.token_ids == expected


def test_a_gathered_batch_writes_its_tokens_and_lengths_back_to_its_slots():
    """Running requests in slots with holes get copies of their rows in the ``Batch``; the
    step's append writes the chunk there and the same tokens and lengths into those slots of
    the engine's tables, and leaves every other slot alone. Contiguous slots get views."""
    rows = Rows(4, 10, torch.device("cpu"))
    rows.tokens[:] = torch.arange(40).view(4, 10)
    rows.lengths[:] = torch.tensor([3, 4, 5, 6])
    rows.requests[:] = [Request(str(i), [1], SamplingParams(), None, 0) for i in range(4)]
    before = rows.tokens.clone()
    batch = rows.batch(Slots.of([3, 1]), torch.Generator())
    assert batch.tokens.data_ptr() != rows.tokens[3].data_ptr()  # a copy
    rows.append(batch, torch.tensor([[91, 92, 93], [81, 82, 83]]), torch.tensor([2, 3]))
    assert batch.lengths.tolist() == [8, 7] and rows.lengths.tolist() == [3, 7, 5, 8]
    assert batch.tokens[0, 6:9].tolist() == [91, 92, 93] == rows.tokens[3, 6:9].tolist()
    assert batch.tokens[1, 4:7].tolist() == [81, 82, 83] == rows.tokens[1, 4:7].tolist()
    assert torch.equal(rows.tokens[[3, 1]], batch.tokens)
    assert torch.equal(rows.tokens[[0, 2]], before[[0, 2]])
    view = rows.batch(Slots.of([1, 2]), torch.Generator())
    assert view.tokens.data_ptr() == rows.tokens[1].data_ptr()
    assert view.lengths.data_ptr() == rows.lengths[1:].data_ptr()
