"""int8 weights (``models.int8``): accurate on every x86 host, and checked at load."""

import warnings

import pytest
import torch

from quickdraft.models import int8
from quickdraft.models.ops import Linear


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).norm() / expected.norm())


def test_per_row_scales_survive_rows_of_very_different_size():
    """One scale per tensor left the small rows a few levels; per-row scales do not."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=generator) * 0.05
    x = torch.randn(4, 64, generator=generator) * torch.tensor([[1e-3], [1.0], [30.0], [1e3]])
    got = Linear(weight, int8=True)(x)
    for row in range(4):
        assert relative_error(got[row], x[row] @ weight.T) < 0.03, row


def test_outlier_channels_stay_in_float():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(128, 256, generator=generator) * 0.05
    x = torch.randn(6, 256, generator=generator)
    x[:, [3, 77, 200]] *= 400.0  # the systematic outlier channels of an LLM's MLP input
    calibrated = Linear(weight, prepack=False)
    calibrated.observe()
    calibrated(torch.randn(8, 256, generator=generator) * (x.abs().amax(0) / 3))
    exact = x @ weight.T
    plain = relative_error(Linear(weight, int8=True)(x), exact)
    calibrated.quantize()
    decomposed = relative_error(calibrated(x), exact)
    assert decomposed < 0.02
    assert decomposed < plain / 3


def test_no_int16_pair_sum_can_saturate():
    """The AVX2 kernel sums pairs of u8 x s8 products in int16: with 7-bit weights and 8-bit
    activations the largest pair sum stays below 2^15, so hosts with and without VNNI agree.
    The codes actually packed must stay within 7 bits, clip search included."""
    assert 2 * 255 * int8.WEIGHT_MAX < 2**15
    generator = torch.Generator().manual_seed(3)
    heavy = torch.randn(64, 256, generator=generator) ** 3  # long tails: clipping wins
    packed = int8.pack(heavy, None, None).packed
    weight, _ = torch.ops.quantized.linear_unpack(packed)
    assert int(weight.int_repr().abs().max()) <= int8.WEIGHT_MAX
    assert bool((weight.q_per_channel_scales() < heavy.abs().amax(1).double() / 63).any())
    weight = torch.full((8, 64), 0.5)  # every weight at the maximum code
    x = torch.full((2, 64), 2.0)  # every activation at the maximum code
    out = Linear(weight, int8=True)(x)
    torch.testing.assert_close(out, x @ weight.T, rtol=0.01, atol=0)


def test_bias_is_added_in_float():
    weight = torch.randn(16, 32, generator=torch.Generator().manual_seed(2))
    bias = torch.arange(16.0)
    x = torch.zeros(3, 32)
    torch.testing.assert_close(Linear(weight, bias, int8=True)(x), bias.expand(3, -1))


def test_quantizing_needs_the_dense_weight():
    with pytest.raises(ValueError, match="prepack"):
        Linear(torch.randn(4, 4)).quantize()


def test_check_compares_top1_and_error():
    original = torch.tensor([[0.0, 1.0, 0.5], [2.0, 0.0, 0.0]])
    check = int8.compare(torch.tensor([[0.0, 1.0, 0.6], [0.0, 2.0, 0.0]]), original)
    assert check.top1_agreement == 0.5
    assert check.positions == 2
    assert not check.passed
    assert "50.0%" in check.describe()


def test_int8_smollm2_agrees_with_float_on_the_probe():
    from quickdraft.models.loading import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to float would be a failure here
        model, _ = load_model("smollm2-135m", int8=True)
    assert model.int8
    check = model.quant_check
    assert check.positions > 300
    assert check.top1_agreement >= 0.95, check.describe()
    assert check.relative_error < 0.08, check.describe()


def test_a_failing_check_falls_back_for_drafts_and_raises_when_strict(monkeypatch):
    from quickdraft.models import loading

    monkeypatch.setattr(int8.QuantCheck, "MIN_TOP1", 1.01)  # no model can pass
    with pytest.warns(loading.Int8FallbackWarning, match="using float weights"):
        model, _ = loading.load_model("smollm2-135m", int8=True)
    assert not model.int8
    with pytest.raises(ValueError, match="int8: smollm2-135m quantized fails its check"):
        loading.load_model("smollm2-135m", int8=True, int8_fallback=False)


def test_a_build_without_int8_kernels_keeps_float(monkeypatch):
    def missing(*args, **kwargs):
        raise RuntimeError("no quantized engine")

    monkeypatch.setattr(torch.ops.quantized, "linear_prepack", missing, raising=False)
    weight = torch.randn(8, 16, generator=torch.Generator().manual_seed(4))
    linear = Linear(weight, prepack=False)
    linear.quantize()
    x = torch.randn(2, 16)
    torch.testing.assert_close(linear(x), x @ weight.T)


def test_segments_side_by_side_give_each_product_bit_for_bit():
    """A shortlisted head's row segments share one scaling of x (``ops.side_by_side``): the
    same numbers as one int8 product per segment, and layers with a bias or outlier columns
    take the per-layer path."""
    from quickdraft.models.ops import side_by_side

    torch.manual_seed(0)
    weight = torch.randn(300, 64) * 0.05
    segments = [Linear(rows.contiguous(), int8=True) for rows in weight.split([7, 120, 173])]
    biased = Linear(torch.randn(9, 64), torch.randn(9), int8=True)
    for rows in (1, 4, 13):
        x = torch.randn(rows, 64)
        each = torch.cat([segment(x) for segment in segments], dim=-1)
        assert torch.equal(side_by_side(x, segments), each)
        mixed = [*segments, biased]
        assert torch.equal(side_by_side(x, mixed), torch.cat([each, biased(x)], dim=-1))
