"""Weights in groups of 32: the quantizer every layer starts from (its compiled search against
the PyTorch one, a GGUF's grid coming back exactly), the groups' own linear layer (its layout,
the same bits for a row alone or in any batch on every path this host runs), and the kernels'
build: the paths a host names, the reference path with one warning where nothing compiles."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from quickdraft import kernels
from quickdraft.kernels import groups

PATHS = kernels.runnable_paths()


def random_codes(out: int, inner: int, seed: int = 0, bits: int = 4) -> groups.GroupCodes:
    generator = torch.Generator().manual_seed(seed)
    count = inner // groups.GROUP
    return groups.GroupCodes(
        torch.randint(0, 2**bits, (out, inner), generator=generator, dtype=torch.uint8),
        (torch.rand(out, count, generator=generator) * 0.01 / 2 ** (bits - 4) + 1e-5).half(),
        (torch.randn(out, count, generator=generator) * 0.05).half(),
        bits,
    )


@pytest.mark.parametrize(("bits", "bound"), [(4, 0.09), (8, 0.005)])
def test_quantize_is_close_and_in_range(bits, bound):
    torch.manual_seed(0)
    weight = torch.randn(48, 256) * 0.02
    weight[3] = 0.0  # a zero row
    weight[5, :32] = 0.7  # a constant group
    codes = groups.quantize(weight, bits)
    assert codes.q.dtype == torch.uint8 and int(codes.q.max()) <= 2**bits - 1
    assert codes.scale.shape == codes.minimum.shape == (48, 8) and codes.bits == bits
    restored = codes.dequantize()
    assert torch.equal(restored[3], weight[3])
    assert torch.allclose(restored[5, :32], weight[5, :32], rtol=1e-3)
    error = (restored - weight).norm() / weight.norm()
    assert error < bound, float(error)  # 4 bits with a refitted range: about 0.08 on Gaussians


def test_weights_already_on_a_4_bit_grid_come_back_exactly():
    """A GGUF's Q4_1 (and Q4_K) blocks are groups of 32 on such a grid: quantizing what
    transformers dequantized from them gives their codes back, so nothing is lost twice."""
    codes = random_codes(64, 128, seed=5)
    q = codes.q.view(64, 4, 32)
    q[..., 0] = 0  # every group's least weight at code 0, as GGUF's blocks have it
    q[::2] = q[::2].clamp_max(13)  # half the groups leave their top codes unused
    again = groups.quantize(codes.dequantize())
    assert torch.equal(again.dequantize(), codes.dequantize())


@pytest.mark.parametrize("bits", groups.BITS)
def test_the_compiled_quantizer_runs_the_reference_search(bits):
    """Its sums round in another order than PyTorch's: the codes may differ in a rare group,
    never by more than the rounding of a tie."""
    if not kernels.native():
        pytest.skip("no compiled kernels on this host")
    torch.manual_seed(3)
    weight = torch.randn(64, 512) * 0.02
    native, reference = groups.quantize(weight, bits), groups.quantize_reference(weight, bits)
    same = (native.scale == reference.scale) & (native.minimum == reference.minimum)
    assert same.float().mean() > 0.99
    error = (native.dequantize() - reference.dequantize()).norm() / weight.norm()
    assert error < 1e-3, float(error)


def test_quantize_refuses_a_width_not_in_groups():
    with pytest.raises(ValueError, match="q4: in_features 40"):
        groups.quantize(torch.randn(4, 40))


@pytest.mark.parametrize("bits", groups.BITS)
def test_pack_round_trips_with_padding(bits):
    codes = random_codes(37, 96, bits=bits)
    packed = groups.pack(codes)
    assert packed.numel() == 3 * 3 * groups.record_bytes(bits)  # 37 outputs pad to 3 blocks of 16
    back = groups.unpack(packed, 37, 96, bits)
    assert back.bits == codes.bits
    for name in ("q", "scale", "minimum"):
        assert torch.equal(getattr(back, name), getattr(codes, name)), name


@pytest.mark.parametrize("bits", groups.BITS)
@pytest.mark.parametrize("path", PATHS)
def test_every_path_gives_the_reference_bits(path, bits):
    torch.manual_seed(1)
    codes = random_codes(40, 160, seed=1, bits=bits)
    bias = torch.randn(40)
    layer = groups.GroupWeights.build(codes, bias, path=path)
    x = torch.randn(9, 160) * 3
    x[2, 32:64] = 0.0  # a zero group: scale 0
    x[4, 7] = 400.0  # an outlier spoils only its own group
    expected = groups.reference(x, codes, bias)
    assert torch.equal(groups.linear(x, layer), expected)
    float_result = x @ codes.dequantize().T + bias
    relative = (expected - float_result).norm() / float_result.norm()
    assert relative < 0.02, float(relative)


@pytest.mark.parametrize("bits", groups.BITS)
@pytest.mark.parametrize("path", PATHS)
def test_a_row_is_the_same_alone_or_in_any_batch(path, bits):
    generator = torch.Generator().manual_seed(2)
    codes = random_codes(50, 128, seed=2, bits=bits)
    layer = groups.GroupWeights.build(codes, torch.randn(50, generator=generator), path=path)
    x = torch.randn(64, 128, generator=generator)
    whole = groups.linear(x, layer)
    for rows in (1, 2, 3, 5, 8, 13, 16, 31, 32, 47, 64):
        chosen = torch.randperm(64, generator=generator)[:rows]
        assert torch.equal(groups.linear(x[chosen].contiguous(), layer), whole[chosen]), rows


def test_thread_count_changes_nothing():
    codes = random_codes(96, 192, seed=3)
    layer = groups.GroupWeights.build(codes)
    x = torch.randn(6, 192)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = groups.linear(x, layer)
        torch.set_num_threads(max(2, threads))
        assert torch.equal(groups.linear(x, layer), one)
    finally:
        torch.set_num_threads(threads)


def test_empty_batch():
    layer = groups.GroupWeights.build(random_codes(16, 32))
    assert groups.linear(torch.empty(0, 32), layer).shape == (0, 16)


def test_paths_named():
    assert kernels.check_path("auto") == kernels.best_path() == PATHS[0]
    with pytest.raises(ValueError, match="q4 path: 'sse2' is not one of"):
        kernels.check_path("sse2")


def test_a_host_without_a_compiler_gets_the_reference_with_one_warning(tmp_path):
    script = (
        "import warnings; warnings.simplefilter('always')\n"
        "from quickdraft import kernels\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    path = kernels.best_path()\n"
        "print(path, len(caught), str(caught[0].message)[:60])\n"
    )
    env = {**os.environ, "CXX": str(tmp_path / "no-compiler"), "QUICKDRAFT_CACHE": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pytorch 1 compiled kernels could not be "), done.stdout
