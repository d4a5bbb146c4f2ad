"""The superblock kernel (4- and 8-bit weights, integer sub-scales): its quantizer, its layout,
and the same bits for a row alone or in any batch, on every path this host runs (the
compiled AVX-512 VNNI and AVX2 paths, and the PyTorch reference every host runs)."""

from __future__ import annotations

import pytest
import torch

from quickdraft import kernels
from quickdraft.kernels import groups
from quickdraft.kernels import superblock as sb

PATHS = kernels.runnable_paths()
BITS = sb.BITS
# Every code form: 4, 6 and 8 bits with sub-scales per 32, and the Q6_K form ("q6k").
FORMS = [*BITS, "q6k"]


def random_codes(
    out: int, inner: int, seed: int = 0, bits: int | str = 4, half: bool = False
) -> sb.SuperCodes:
    """Random codes; ``half``: their factors float16, as a GGUF's (packed in half records)."""
    codes = _random_codes(out, inner, seed, bits)
    return sb.to_half(codes) if half else codes


def _random_codes(out: int, inner: int, seed: int, bits: int | str) -> sb.SuperCodes:
    generator = torch.Generator().manual_seed(seed)
    groups, supers = inner // sb.GROUP, sb.supers_of(inner // sb.GROUP)
    if bits == "q6k":
        sc = torch.randint(-128, 128, (out, inner // 16), generator=generator, dtype=torch.int8)
        d = torch.rand(out, supers, generator=generator) * 1e-4
        q = torch.randint(0, 64, (out, inner), generator=generator, dtype=torch.uint8)
        return sb.SuperCodes(q, sc, sc, d, d * -32, 6, 16)
    return sb.SuperCodes(
        torch.randint(0, 2**bits, (out, inner), generator=generator, dtype=torch.uint8),
        torch.randint(0, 256, (out, groups), generator=generator, dtype=torch.uint8),
        torch.randint(-127, 128, (out, groups), generator=generator, dtype=torch.int8),
        torch.rand(out, supers, generator=generator) * 1e-4 / 2 ** (bits - 4),
        torch.rand(out, supers, generator=generator) * 1e-3,
        bits,
    )


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("inner", [96, 576, 896, 1536])  # short last superblocks and whole ones
def test_quantize_is_as_close_as_groups_of_32(bits, inner):
    """Integer sub-scales cost nothing measurable against float ones per group (the fit
    refits each superblock's two factors by least squares)."""
    torch.manual_seed(0)
    weight = torch.randn(48, inner) * 0.02
    weight[3] = 0.0  # a zero row
    weight[5, :32] = 0.7  # a constant group
    codes = sb.quantize(weight, bits)
    assert codes.q.dtype == torch.uint8 and int(codes.q.max()) <= 2**bits - 1
    assert codes.sc.shape == codes.mn.shape == (48, inner // 32)
    assert codes.d.shape == codes.dmin.shape == (48, sb.supers_of(inner // 32))
    restored = codes.dequantize()
    assert torch.equal(restored[3], weight[3])
    error = float((restored - weight).norm() / weight.norm())
    grouped = groups.quantize(weight, bits).dequantize()
    reference = float((grouped - weight).norm() / weight.norm())
    assert error < reference * (1.01 if bits == 4 else 1.3), (error, reference)


def test_a_gguf_q4_k_block_comes_back_exactly():
    """Q4_K: w = d * sc * q - dmin * m with 6-bit sc and m per group and float16 d, dmin per
    256 weights. What a GGUF reader dequantizes from it quantizes back to the same weights, so
    loading a Q4_K_M file rounds nothing twice (``Linear.quantize_q4(exact_only=True)``)."""
    generator = torch.Generator().manual_seed(4)
    out, inner = 32, 512
    q = torch.randint(0, 16, (out, inner // 32, 32), generator=generator).float()
    q[..., 0], q[..., 1] = 0, 15  # llama.cpp's fit spans each group's range
    sc = torch.randint(1, 64, (out, inner // 32), generator=generator).float()
    sc[:, ::8] = 63  # each superblock's largest scale is 63
    m = torch.randint(0, 64, (out, inner // 32), generator=generator).float()
    m[:, 1::8] = 63
    d = (torch.rand(out, inner // 256, generator=generator) * 1e-3).half().float()
    dmin = (torch.rand(out, inner // 256, generator=generator) * 1e-3).half().float()
    scale = d.repeat_interleave(8, 1) * sc
    minimum = dmin.repeat_interleave(8, 1) * m
    weight = (q * scale.unsqueeze(-1) - minimum.unsqueeze(-1)).view(out, inner)
    again = sb.quantize(weight).dequantize()
    error = float((again - weight).norm() / weight.norm())
    assert error < 1e-5, error


def test_a_gguf_q6_k_block_comes_back_exactly():
    """Q6_K: w = d * sc * (q - 32) with a signed int8 sc per 16 weights (the largest at -128)
    and float16 d per 256, dequantized as llama.cpp does ((d * sc) * (q - 32) in float32).
    ``quantize_q6k`` finds codes and scales that give the same weights (a GGUF's Q6_K head and
    projections then
    cost 6.75 bits a weight on the kernel instead of 8.75, rounding nothing twice)."""
    generator = torch.Generator().manual_seed(5)
    out, inner = 24, 768
    q = torch.randint(0, 64, (out, inner // 16, 16), generator=generator).float()
    q[..., 0] = 0  # llama.cpp's fit maps each sub-block's largest magnitude to -32
    sc = torch.randint(-127, 128, (out, inner // 16), generator=generator).float()
    sc[:, ::16] = -128
    d = (torch.rand(out, inner // 256, generator=generator) * 1e-4 + 1e-5).half().float()
    step = d.repeat_interleave(16, 1) * sc
    weight = (step.unsqueeze(-1) * (q - 32)).view(out, inner)
    codes = sb.quantize_q6k(weight)
    assert codes.sub == 16 and codes.bits == 6 and codes.sc.dtype == torch.int8
    assert torch.equal(codes.dequantize(), weight)


@pytest.mark.parametrize("inner", [96, 896, 1536])
def test_q6k_of_float_weights_is_a_fine_six_bit_form(inner):
    """On weights that were never Q6_K: as near as 6-bit codes per 32 (about 0.017 of random
    weights, symmetric codes per 16 against asymmetric ones per 32)."""
    torch.manual_seed(0)
    weight = torch.randn(40, inner) * 0.02
    weight[3] = 0.0
    codes = sb.quantize_q6k(weight)
    assert torch.equal(codes.dequantize()[3], weight[3])
    error = float((codes.dequantize() - weight).norm() / weight.norm())
    six = sb.quantize(weight, 6).dequantize()
    assert error < 1.05 * float((six - weight).norm() / weight.norm()) and error < 0.02, error


def test_quantize_refuses_a_width_not_in_groups():
    with pytest.raises(ValueError, match="q4: in_features 40"):
        sb.quantize(torch.randn(4, 40))
    with pytest.raises(ValueError, match="q4: bits must be one of"):
        sb.quantize(torch.randn(4, 64), bits=3)


@pytest.mark.parametrize("half", [False, True], ids=["float32", "half"])
@pytest.mark.parametrize("bits", FORMS)
@pytest.mark.parametrize("path", PATHS)
def test_every_path_gives_the_reference_bits(path, bits, half):
    codes = random_codes(40, 352, seed=1, bits=bits, half=half)  # 11 groups: 1 superblock + 3
    generator = torch.Generator().manual_seed(3)
    bias = torch.randn(40, generator=generator)
    layer = sb.SuperWeights.build(codes, bias, path=path)
    assert layer.half == (half and path != kernels.REFERENCE)
    x = torch.randn(9, 352, generator=generator) * 3
    x[2, :256] = 0.0  # a zero superblock: scale 0
    x[4, 7] = 400.0  # an outlier coarsens only its own superblock
    expected = sb.reference(x, codes, bias)
    assert torch.equal(sb.linear(x, layer), expected)
    float_result = x @ codes.dequantize().T + bias
    # int8 activations per 256 inputs: about 1% of the product (the outlier's row more)
    usual = [row for row in range(9) if row != 4]
    relative = (expected - float_result)[usual].norm() / float_result[usual].norm()
    assert relative < 0.02, float(relative)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("path", PATHS)
def test_the_integer_sums_do_not_overflow_at_the_extremes(path, bits):
    """Every code at its top, every sub-scale and minimum at its bound, activations at +-127:
    the largest sums the layout allows (8 * 255 * 32 * 255 * 127 < 2^31 for 8 bits)."""
    out, inner = 16, 512
    groups = inner // 32
    codes = sb.SuperCodes(
        torch.full((out, inner), 2**bits - 1, dtype=torch.uint8),
        torch.full((out, groups), 255, dtype=torch.uint8),
        torch.full((out, groups), -127, dtype=torch.int8),
        torch.full((out, 2), 1e-6),
        torch.full((out, 2), 1e-6),
        bits,
    )
    if bits == 6:  # and the Q6_K form: codes 63 or 0 with sub-scales -128 (its extremes)
        sc = torch.full((out, inner // 16), -128, dtype=torch.int8)
        for top in (63, 0):
            q6k = sb.SuperCodes(
                torch.full((out, inner), top, dtype=torch.uint8),
                sc,
                sc,
                torch.full((out, 2), 1e-6),
                torch.full((out, 2), -32e-6),
                6,
                16,
            )
            x = torch.ones(6, inner)
            x[1::2] = -1.0
            y = sb.linear(x, sb.SuperWeights.build(q6k, path=path))
            assert torch.equal(y, sb.reference(x, q6k))
            assert torch.allclose(y, x @ q6k.dequantize().T, rtol=1e-4)
    layer = sb.SuperWeights.build(codes, path=path)
    x = torch.ones(6, inner)
    x[1::2] = -1.0
    y = sb.linear(x, layer)
    assert torch.equal(y, sb.reference(x, codes))
    expected = x @ codes.dequantize().T
    assert torch.allclose(y, expected, rtol=1e-4), (y[:, 0], expected[:, 0])


@pytest.mark.parametrize("half", [False, True], ids=["float32", "half"])
@pytest.mark.parametrize("bits", FORMS)
@pytest.mark.parametrize("path", PATHS)
def test_a_row_is_the_same_alone_or_in_any_batch(path, bits, half):
    """Whole tiles (16 rows with AVX-512 VNNI, 4 with 256-bit vectors) and remainders of every
    size: a row's bits never depend on its neighbours."""
    generator = torch.Generator().manual_seed(2)
    codes = random_codes(50, 288, seed=2, bits=bits, half=half)
    layer = sb.SuperWeights.build(codes, torch.randn(50, generator=generator), path=path)
    x = torch.randn(64, 288, generator=generator)
    whole = sb.linear(x, layer)
    for rows in (1, 2, 3, 5, 7, 8, 9, 13, 15, 16, 17, 24, 31, 32, 47, 64):
        chosen = torch.randperm(64, generator=generator)[:rows]
        assert torch.equal(sb.linear(x[chosen].contiguous(), layer), whole[chosen]), rows


def test_thread_count_changes_nothing():
    codes = random_codes(96, 512, seed=3)
    layer = sb.SuperWeights.build(codes)
    x = torch.randn(12, 512)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = sb.linear(x, layer)
        torch.set_num_threads(max(2, threads))
        assert torch.equal(sb.linear(x, layer), one)
    finally:
        torch.set_num_threads(threads)


def test_empty_batch_and_sizes():
    codes = random_codes(16, 288)
    layer = sb.SuperWeights.build(codes)
    assert sb.linear(torch.empty(0, 288), layer).shape == (0, 16)
    # 4.75 bits a weight for whole superblocks: codes, 8 sub-scales, 8 minimums, two floats
    assert sb.SuperWeights.build(random_codes(16, 256)).nbytes == 16 * 256 * 4.75 / 8


@pytest.mark.parametrize("bits", FORMS)
@pytest.mark.parametrize("path", [p for p in PATHS if p != kernels.REFERENCE])
def test_half_records_hold_the_same_weights_in_fewer_bytes(path, bits):
    """Codes whose factors are float16 pack in half records: the same product bit for bit as
    the float32 records, in a GGUF's own bytes for its forms (Q4_K's d and dmin, Q6_K's d)."""
    codes = random_codes(48, 512, seed=6, bits=bits, half=True)
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(5, 512, generator=generator)
    half = sb.SuperWeights.build(codes, path=path)
    wide = sb.SuperWeights(48, 512, path, sb.pack(codes), None, None, half.bits, half.sub)
    assert half.half and not wide.half
    assert torch.equal(sb.linear(x, half), sb.linear(x, wide))
    bits_a_weight = {4: 4.625, 6: 6.625, 8: 8.625, "q6k": 6.5625}[bits]
    assert half.nbytes == 48 * 512 * bits_a_weight / 8
    with pytest.raises(ValueError, match="half records need factors that are float16"):
        sb.pack(random_codes(16, 256, bits=bits), half=True)


def test_factors_that_are_not_float16_keep_float32_records():
    codes = random_codes(16, 256)
    assert not sb.holds_half(codes) and not sb.SuperWeights.build(codes).half
    assert sb.holds_half(sb.to_half(codes))
    q6k = sb.to_half(random_codes(16, 256, bits="q6k"))
    assert torch.equal(q6k.dmin, q6k.d * -32) and sb.holds_half(q6k)


def test_a_path_named_in_the_environment_is_the_one_that_runs(monkeypatch):
    """``QUICKDRAFT_Q4_PATH`` makes a host run a slower path (how benchmarks measure an
    AVX2-only host's kernels elsewhere); a path the host cannot run is one clear error."""
    try:
        for path in PATHS:
            monkeypatch.setenv(kernels.PATH_VARIABLE, path)
            kernels.best_path.cache_clear()
            assert kernels.best_path() == path
        monkeypatch.setenv(kernels.PATH_VARIABLE, "sse2")
        kernels.best_path.cache_clear()
        with pytest.raises(ValueError, match="QUICKDRAFT_Q4_PATH: q4 path: 'sse2'"):
            kernels.best_path()
    finally:
        monkeypatch.delenv(kernels.PATH_VARIABLE)
        kernels.best_path.cache_clear()
        kernels.attention_path.cache_clear()
