"""A GGUF's Q4_K and Q6_K blocks read as the 4-bit kernel's codes (``gguf.BlockSource``): the
file's own integers and float16 factors, checked against the ``gguf`` package's own
dequantization, and taken by a quantized layer as they are."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize

from quickdraft.kernels import superblock
from quickdraft.models.exact import given_runs
from quickdraft.models.gguf import BlockSource
from quickdraft.models.ops import Linear

BYTES = {GGMLQuantizationType.Q4_K: 144, GGMLQuantizationType.Q6_K: 210}


def random_blocks(kind: GGMLQuantizationType, rows: int, inner: int, seed: int) -> np.ndarray:
    """Valid blocks of random codes and scales, float16 factors near a real file's."""
    generator = np.random.default_rng(seed)
    blocks = generator.integers(0, 256, (rows * inner // 256, BYTES[kind]), dtype=np.uint8)
    factors = (generator.random((len(blocks), 2)) * 1e-3 + 1e-5).astype(np.float16)
    if kind == GGMLQuantizationType.Q4_K:
        blocks[:, 0:4] = factors.view(np.uint8)  # d, dmin
    else:
        blocks[:, 208:210] = factors[:, :1].view(np.uint8)  # d
    return blocks


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[BlockSource, dict[str, np.ndarray]]:
    folder = tmp_path_factory.mktemp("blocks")
    path = folder / "model.gguf"
    writer = GGUFWriter(str(path), "qwen2")
    tensors = {
        "blk.0.ffn_up.weight": (GGMLQuantizationType.Q4_K, 48, 512),
        "blk.0.ffn_down.weight": (GGMLQuantizationType.Q6_K, 32, 768),
        "blk.0.attn_q.weight": (GGMLQuantizationType.Q4_K, 32, 256),
        "blk.0.attn_k.weight": (GGMLQuantizationType.Q4_K, 16, 256),
        "blk.0.attn_v.weight": (GGMLQuantizationType.Q6_K, 16, 256),
        "blk.0.attn_output.weight": (GGMLQuantizationType.Q8_0, 32, 256),
    }
    floats = {}
    for i, (name, (kind, rows, inner)) in enumerate(tensors.items()):
        if kind == GGMLQuantizationType.Q8_0:
            data = np.zeros((rows, inner // 32 * 34), dtype=np.uint8)
        else:
            data = random_blocks(kind, rows, inner, seed=i).reshape(rows, -1)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind)
        floats[name] = dequantize(data, kind).reshape(rows, inner)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    source = {"gguf": str(path), "sha256": "0", "size": path.stat().st_size}
    (folder / "source.json").write_text(json.dumps(source))
    found = BlockSource.of(folder, tied=False)
    assert found is not None and found._tensors is None  # the file is read at the first use
    return found, floats


@pytest.mark.parametrize(
    "name, gguf_name, bits",
    [
        ("model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight", 4),
        ("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight", 6),
    ],
)
def test_blocks_are_the_files_own_weights(source, name, gguf_name, bits):
    blocks, floats = source
    codes = blocks.codes(name)
    assert codes is not None and codes.bits == bits and superblock.holds_half(codes)
    expected = torch.from_numpy(floats[gguf_name])
    got = codes.dequantize()
    assert float((got - expected).abs().max()) <= 1e-6 * float(expected.abs().max())


def test_other_types_and_names_have_no_blocks(source, tmp_path):
    blocks, _ = source
    assert blocks.codes("model.layers.0.self_attn.o_proj.weight") is None  # Q8_0
    assert blocks.codes("model.layers.1.mlp.up_proj.weight") is None  # no such tensor
    assert blocks.codes("model.embed_tokens.weight") is None
    assert BlockSource.of(tmp_path, tied=False) is None  # no source.json
    (tmp_path / "source.json").write_text(json.dumps({"gguf": str(tmp_path / "gone.gguf")}))
    assert BlockSource.of(tmp_path, tied=False) is None
    (tmp_path / "source.json").write_text(json.dumps({"gguf": blocks.path.name}))  # relative
    assert BlockSource.of(tmp_path, tied=False) is None
    changed = {"gguf": str(blocks.path), "size": blocks.path.stat().st_size + 1}
    (tmp_path / "source.json").write_text(json.dumps(changed))
    assert BlockSource.of(tmp_path, tied=False) is None


def test_a_fused_layer_takes_the_files_blocks_run_by_run(source):
    """q and k in Q4_K beside v in Q6_K: two runs, each in half records, the product the
    same bits as the runs' own layers; codes that do not give the weight are not taken."""
    blocks, floats = source
    names = [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"]
    given = [blocks.codes(name) for name in names]
    weight = torch.cat([torch.from_numpy(floats[f"blk.0.attn_{p}.weight"]) for p in "qkv"])
    layer = Linear(weight.clone(), None, prepack=False)
    layer.quantize_q4(4, exact_only=True, groups_fallback=True, given=given)
    parts = layer.quantized_weights.parts
    assert [(p.out_features, p.bits, p.half) for p in parts] == [(48, 4, True), (16, 6, True)]
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0))
    alone = []
    for codes in (
        superblock.SuperCodes(
            *(
                torch.cat([getattr(given[0], f), getattr(given[1], f)])
                for f in ("q", "sc", "mn", "d", "dmin")
            )
        ),
        given[2],
    ):
        alone.append(superblock.linear(x, superblock.SuperWeights.build(codes)))
    assert torch.equal(layer(x), torch.cat(alone, dim=-1))
    assert given_runs(given, weight) is not None
    assert given_runs(given, weight.flip(0)) is None  # rows rearranged: the fit instead


def test_each_projection_is_named_by_its_weights_in_row_order():
    """``_quantize_q4`` pairs each projection with the file's tensors of its rows: the names'
    shapes, stacked, are the projection's."""
    from conftest import tiny_hf_model

    from quickdraft.models.llama import LlamaRunner

    hf = tiny_hf_model("qwen2-bias")
    runner = LlamaRunner.from_state_dict(hf.config.to_dict(), hf.state_dict())
    state = hf.state_dict()
    state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    projections, names = runner._projections(), runner._weight_names()
    assert len(projections) == len(names)
    for linear, group in zip(projections, names, strict=True):
        stacked = torch.cat([state[name] for name in group])
        assert linear.out_features == stacked.shape[0], group


def test_factors_beyond_float16_have_no_half_records():
    codes = superblock.SuperCodes(
        torch.zeros(16, 256, dtype=torch.uint8), torch.ones(16, 8, dtype=torch.uint8),
        torch.zeros(16, 8, dtype=torch.int8), torch.full((16, 1), 1e6), torch.ones(16, 1),
    )  # fmt: skip
    with pytest.raises(ValueError, match="beyond float16's range"):
        superblock.to_half(codes)
