import torch

from quickdraft.config import SamplingParams
from quickdraft.sampling import argmax, make_generator, probs_from_logits, sample


def probs(logits, **kwargs):
    return probs_from_logits(torch.tensor(logits), SamplingParams(**kwargs))


def test_temperature_zero_is_one_hot_with_lowest_id_on_ties():
    out = probs([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0]], temperature=0)
    assert torch.equal(out, torch.tensor([[0.0, 1, 0, 0], [1.0, 0, 0, 0]]))


def test_temperature_scales_logits():
    logits = [0.0, 1.0, 2.0]
    expected = torch.softmax(torch.tensor(logits) / 0.5, -1)
    torch.testing.assert_close(probs(logits, temperature=0.5), expected)


def test_top_k_keeps_k_largest_and_renormalises():
    out = probs([1.0, 4.0, 2.0, 3.0], top_k=2)
    expected = torch.softmax(torch.tensor([4.0, 3.0]), -1)
    torch.testing.assert_close(out[[1, 3]], expected)
    assert out[0] == 0 and out[2] == 0


def test_top_k_keeps_every_token_tied_with_the_kth():
    out = probs([1.0, 2.0, 2.0, 0.0], top_k=2)
    assert (out > 0).tolist() == [False, True, True, False]
    out = probs([1.0, 2.0, 2.0, 0.0], top_k=1)
    assert (out > 0).tolist() == [False, True, True, False]


def test_top_p_known_answer():
    # probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.75 keeps 0.5 and 0.3 (mass before 0.15 is 0.8).
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    out = probs_from_logits(logits, SamplingParams(top_p=0.75))
    torch.testing.assert_close(out, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    out = probs_from_logits(logits, SamplingParams(top_p=0.85))
    torch.testing.assert_close(out, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)


def test_top_p_always_keeps_the_most_likely_token():
    out = probs([10.0, 0.0, 0.0], top_p=0.01)
    assert torch.equal(out, torch.tensor([1.0, 0.0, 0.0]))


def test_top_k_then_top_p_order():
    # After top-k 3 the kept probabilities are 0.5/0.95 ... and top-p acts on those.
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    out = probs_from_logits(logits, SamplingParams(top_k=3, top_p=0.84))
    # renormalised over 3: 0.526, 0.316, 0.158; mass before the third is 0.842 >= 0.84: dropped
    torch.testing.assert_close(out, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_rows_sum_to_one_and_batch_shape_is_kept():
    logits = torch.randn(3, 5, 50, generator=torch.Generator().manual_seed(0))
    out = probs_from_logits(logits, SamplingParams(temperature=0.7, top_k=10, top_p=0.9))
    assert out.shape == logits.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.sum(-1), torch.ones(3, 5))


def test_minus_infinity_logits_get_zero_probability():
    out = probs([0.0, float("-inf"), 1.0])
    assert out[1] == 0 and torch.isfinite(out).all()


def test_sampling_is_seeded_and_one_hot_rows_are_deterministic():
    p = torch.softmax(torch.randn(1000, 20, generator=torch.Generator().manual_seed(1)), -1)
    a = sample(p, make_generator(7))
    b = sample(p, make_generator(7))
    c = sample(p, make_generator(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    one_hot = torch.zeros(4, 6).scatter_(1, torch.tensor([[5], [0], [2], [2]]), 1.0)
    assert sample(one_hot, make_generator(None)).tolist() == [5, 0, 2, 2]


def test_sample_follows_the_distribution():
    p = torch.tensor([0.1, 0.6, 0.3])
    draws = sample(p.expand(60_000, -1), make_generator(0))
    freq = torch.bincount(draws, minlength=3).double() / 60_000
    torch.testing.assert_close(freq, p.double(), atol=0.01, rtol=0)


def test_one_hot_rows_skip_the_generator_and_mixed_batches_still_sample():
    generator = make_generator(3)
    state = generator.get_state()
    one_hot = torch.zeros(2, 5).scatter_(1, torch.tensor([[4], [1]]), 1.0)
    assert sample(one_hot, generator).tolist() == [4, 1]
    assert torch.equal(generator.get_state(), state)  # greedy draws consume no randomness
    # One row that is not one-hot sends the whole batch through the sampler.
    mixed = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
    draws = sample(mixed.repeat(2000, 1), make_generator(0)).view(2000, 2)
    assert (draws[:, 0] == 1).all()
    assert set(draws[:, 1].tolist()) == {0, 2}


def test_argmax_is_torchs_first_maximum_on_every_path():
    """NumPy's reduction on CPU float32 and torch's elsewhere agree with ``torch.argmax``:
    the first of tied maxima, a NaN where a row holds one, any leading shape."""
    values = torch.randn(3, 4, 1000)
    values[0, 1, 10] = values[0, 1, 20] = 50.0  # a tie: the lower index
    values[1, 2, 7] = float("nan")
    values[2, 3, 999] = float("inf")
    expected = values.argmax(dim=-1)
    assert torch.equal(argmax(values), expected)
    assert argmax(values).dtype == torch.long
    assert torch.equal(argmax(values[:, 1]), expected[:, 1])  # a strided view
    assert torch.equal(argmax(values.to(torch.bfloat16)), values.to(torch.bfloat16).argmax(-1))
    assert torch.equal(argmax(values.requires_grad_()), expected)
    row = values[0, 1].detach()  # one row: a 0-d index, as torch's
    assert argmax(row).shape == () and argmax(row).item() == 10
    one_hot = probs([1.0, 3.0, 3.0], temperature=0)
    assert torch.equal(one_hot, torch.tensor([0.0, 1, 0]))
