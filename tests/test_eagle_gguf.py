"""EAGLE-3 drafters exported as GGUF files for llama.cpp's ``eagle3`` architecture.

The names, keys and shapes below were read from the llama.cpp inside llama-cpp-python 0.3.36:
``src/models/eagle3.cpp`` (``load_arch_hparams``: ``target_layers`` of exactly three ids,
``target_hidden_size``, optional ``norm_before_residual`` / ``norm_before_fc``;
``load_arch_tensors``: ``fc`` {3 * target hidden, n_embd}, ``attn_q/k/v`` over 2 * n_embd,
``attn_norm_2``, an optional ``output`` over the draft vocabulary with an I64 ``d2t`` of the
same length), ``conversion/llama.py`` (q/k rows permuted, ``d2t`` as absolute target ids) and
``src/llama-arch.cpp`` (tensor names). Where llama-cpp-python is importable (built as
``benchmarks/vs_llama_cpp.py`` says, into ``build/llama-cpp``), the real export is loaded by it.
"""

import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from quickdraft.drafters.eagle.net import EagleConfig, EagleNet
from quickdraft.interop.eagle_gguf import FILE, export_eagle_gguf, half_rows, pair_rows

ROOT = Path(__file__).resolve().parents[1]
LLAMA_CPP = ROOT / "build" / "llama-cpp"

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 64, 4, 2, 16, 96
LOADER_SHAPES = {  # llama.cpp's create_tensor shapes (ne: columns first), n_embd = HIDDEN
    "fc.weight": [3 * HIDDEN, HIDDEN],
    "output_norm.weight": [HIDDEN],
    "blk.0.attn_norm.weight": [HIDDEN],
    "blk.0.attn_norm_2.weight": [HIDDEN],
    "blk.0.attn_q.weight": [2 * HIDDEN, HEADS * HEAD_DIM],
    "blk.0.attn_k.weight": [2 * HIDDEN, KV_HEADS * HEAD_DIM],
    "blk.0.attn_v.weight": [2 * HIDDEN, KV_HEADS * HEAD_DIM],
    "blk.0.attn_output.weight": [HEADS * HEAD_DIM, HIDDEN],
    "blk.0.ffn_norm.weight": [HIDDEN],
    "blk.0.ffn_gate.weight": [HIDDEN, 128],
    "blk.0.ffn_up.weight": [HIDDEN, 128],
    "blk.0.ffn_down.weight": [128, HIDDEN],
}


def tiny_net(variant: str = "eagle3", draft_vocab: torch.Tensor | None = None) -> EagleNet:
    torch.manual_seed(0)
    vocab = draft_vocab if draft_vocab is not None else torch.randperm(VOCAB)[:40]
    config = EagleConfig(
        variant=variant, hidden_size=HIDDEN, intermediate_size=128, num_heads=HEADS,
        num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=VOCAB,
        draft_vocab_size=vocab.numel(), feature_layers=(1, 2, 3) if variant == "eagle3" else (),
    )  # fmt: skip
    net = EagleNet(config)
    net.draft_vocab = vocab
    return net.eval()


def tiny_target_gguf(path: Path, tokens: int = VOCAB, hidden: int = HIDDEN) -> Path:
    """A target GGUF with a tokenizer and the shape keys the export reads (no tensors)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(5)
    writer.add_embedding_length(hidden)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list([f"t{i}" for i in range(tokens)])
    writer.add_token_types([1] * tokens)
    writer.add_token_merges(["t 1", "t 2"])
    writer.add_bos_token_id(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def read(path: Path) -> tuple[dict, dict]:
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    return tensors, {name: f.contents() for name, f in reader.fields.items()}


def test_the_gguf_has_the_names_shapes_and_keys_llama_cpps_eagle3_loader_reads(tmp_path):
    net = tiny_net()
    head = torch.randn(VOCAB, HIDDEN)
    path = export_eagle_gguf(net, head, tiny_target_gguf(tmp_path / "t.gguf"), tmp_path / FILE)
    tensors, fields = read(path)
    assert fields["general.architecture"] == "eagle3"
    assert fields["eagle3.target_layers"] == [1, 2, 3]
    assert fields["eagle3.target_hidden_size"] == HIDDEN
    assert fields["eagle3.block_count"] == 1
    assert fields["eagle3.embedding_length"] == HIDDEN
    assert fields["eagle3.attention.head_count_kv"] == KV_HEADS
    assert fields["eagle3.norm_before_residual"] is False
    # the vocabulary is the target's, field by field
    assert fields["tokenizer.ggml.tokens"] == [f"t{i}" for i in range(VOCAB)]
    assert fields["tokenizer.ggml.pre"] == "smollm"
    assert fields["tokenizer.ggml.merges"] == ["t 1", "t 2"]
    for name, shape in LOADER_SHAPES.items():
        assert tensors[name].shape.tolist() == shape, name
    # the draft vocabulary: its head rows and their absolute target ids, in the net's order
    assert tensors["output.weight"].shape.tolist() == [HIDDEN, 40]
    assert tensors["d2t"].tensor_type == gguf.GGMLQuantizationType.I64
    assert tensors["d2t"].data.tolist() == net.draft_vocab.tolist()
    expected_head = head[net.draft_vocab].half().numpy()
    assert np.array_equal(np.asarray(tensors["output.weight"].data), expected_head)
    # query and key rows in llama.cpp's adjacent-pair order; the rest as they are (fp16)
    state = net.state_dict()
    for name, ours, heads in (("attn_q", "q_proj", HEADS), ("attn_k", "k_proj", KV_HEADS)):
        stored = torch.from_numpy(np.array(tensors[f"blk.0.{name}.weight"].data)).float()
        expected = state[f"layers.0.self_attn.{ours}.weight"].half().float()
        assert torch.equal(half_rows(stored, heads), expected)
    stored = np.array(tensors["blk.0.ffn_down.weight"].data)
    assert np.array_equal(stored, state["layers.0.mlp.down_proj.weight"].half().numpy())


def test_pair_rows_matches_rotating_adjacent_pairs():
    """Rotating adjacent pairs of the permuted projection equals rotating halves of the
    original, which is why the rows move: x W^T rotated by halves, one head of 8."""
    torch.manual_seed(0)
    weight, x = torch.randn(8, 5), torch.randn(5)
    angles = torch.rand(4)
    y = weight @ x
    cos, sin = angles.cos(), angles.sin()
    halves = torch.cat([y[:4] * cos - y[4:] * sin, y[4:] * cos + y[:4] * sin])
    z = pair_rows(weight, 1) @ x
    pairs = torch.stack([z[0::2] * cos - z[1::2] * sin, z[1::2] * cos + z[0::2] * sin], -1)
    assert torch.allclose(pairs.reshape(-1), pair_rows(halves[:, None], 1).flatten(), atol=1e-6)
    assert torch.equal(half_rows(pair_rows(weight, 1), 1), weight)


def test_a_full_vocabulary_in_the_targets_order_reads_the_targets_head(tmp_path):
    net = tiny_net(draft_vocab=torch.arange(VOCAB))
    target = tiny_target_gguf(tmp_path / "t.gguf")
    tensors, _ = read(export_eagle_gguf(net, torch.randn(VOCAB, HIDDEN), target, tmp_path / FILE))
    assert "output.weight" not in tensors and "d2t" not in tensors


def test_what_llama_cpp_cannot_load_is_refused_naming_the_field(tmp_path):
    head = torch.randn(VOCAB, HIDDEN)
    target = tiny_target_gguf(tmp_path / "t.gguf")
    with pytest.raises(ValueError, match=r"^engine: llama.cpp loads EAGLE-3"):
        export_eagle_gguf(tiny_net("eagle1"), head, target, tmp_path / FILE)
    small = tiny_target_gguf(tmp_path / "small.gguf", tokens=VOCAB - 1)
    with pytest.raises(ValueError, match=r"^target_gguf: .* 95 tokens"):
        export_eagle_gguf(tiny_net(), head, small, tmp_path / FILE)
    narrow = tiny_target_gguf(tmp_path / "narrow.gguf", hidden=32)
    with pytest.raises(ValueError, match=r"^target_gguf: .* hidden size 32"):
        export_eagle_gguf(tiny_net(), head, narrow, tmp_path / FILE)
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
    with pytest.raises(ValueError, match=r"^target_gguf: .* not a readable GGUF"):
        export_eagle_gguf(tiny_net(), head, tmp_path / "junk.gguf", tmp_path / FILE)
    assert not (tmp_path / FILE).exists()  # nothing half-written is left under the name


def _llama_cpp_python() -> str:
    """The interpreter path plus sys.path entry under which ``llama_cpp`` imports, or skip."""
    for extra in ("", str(LLAMA_CPP)):
        probe = f"import sys; sys.path[:0] = [{extra!r}] if {extra!r} else []; import llama_cpp"
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True)
        if done.returncode == 0:
            return extra
    pytest.skip(
        "llama-cpp-python is not installed (build it into build/llama-cpp as "
        "benchmarks/vs_llama_cpp.py describes)"
    )


DRAFT_IN_LLAMA_CPP = """
import ctypes, json, sys
import numpy as np, torch
if EXTRA:
    sys.path.insert(0, EXTRA)
import llama_cpp as L
from quickdraft.drafters.eagle.io import eagle_folder, load_eagle
from quickdraft.models.loading import load_model
from quickdraft.models.sources import packaged_gguf

target, _ = load_model("smollm2-135m")
net = load_eagle(eagle_folder("smollm2-135m"), target.config.num_layers)
# the draft's context reads the token embedding (and a missing head) from the target's
host = L.Llama(model_path=str(packaged_gguf("smollm2-135m")), n_ctx=64, verbose=False)
model = L.llama_model_load_from_file(DRAFT.encode(), L.llama_model_default_params())
params = L.llama_context_default_params()
params.n_ctx = params.n_batch = params.n_ubatch = 64
params.ctx_other = host._ctx.ctx
ctx = L.llama_init_from_model(model, params)
vocab = L.llama_n_vocab(L.llama_model_get_vocab(model))
# five positions: (token t + 1, feature g_t) at position t, as llama.cpp's eagle3 decoder takes
torch.manual_seed(0)
length = 5
tokens = torch.randint(0, vocab, (length + 1,))
features = np.ascontiguousarray((torch.randn(length, net.config.hidden_size) * 2).numpy())
batch = L.llama_batch_ext_init(ctx)
positions = [(ctypes.c_int32 * 1)(t) for t in range(length)]
for t in range(length):
    i = L.llama_batch_ext_add_token(batch, 0, int(tokens[t + 1]))
    row = features[t].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    assert L.llama_batch_ext_set_embd_token(batch, i, L.llama_embd(row, 1, features.shape[1]))
    assert L.llama_batch_ext_set_pos(batch, i, positions[t])
    assert L.llama_batch_ext_set_output_logits(batch, i, True)
assert L.llama_process(ctx, L.LLAMA_PROCESS_TYPE_DECODE, batch) == 0
got = torch.stack([
    torch.from_numpy(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, t), shape=(vocab,)).copy())
    for t in range(length)
])
with torch.no_grad():
    embeds = target.embed[tokens[1:]].float().unsqueeze(0)
    pad = torch.zeros(1, length, dtype=torch.bool)
    out = net.unroll(embeds, torch.from_numpy(features).unsqueeze(0), 1, pad)[0]
    expected = net.head_input(out)[0] @ target.head_weight.float()[net.draft_vocab].T
scored = got[:, net.draft_vocab]
print(json.dumps({
    "shape": [L.llama_model_n_embd(model), L.llama_model_n_layer(model), vocab],
    "finite": torch.isfinite(got).sum(1).tolist(),
    "error": (scored - expected).abs().max().item() / expected.abs().max().item(),
    "top1": (scored.argmax(1) == expected.argmax(1)).tolist(),
}))
"""


def test_llama_cpp_drafts_with_the_shipped_smollm2_drafter_as_quickdraft_does(tmp_path):
    """``quickdraft export eagle --engine llama.cpp`` on the shipped SmolLM2-135M drafter; then
    llama.cpp loads the file (its loader checks every tensor's shape and the eagle3 keys) in a
    draft context whose other context is the SmolLM2 GGUF target, and its eagle3 decoder,
    given the same tokens and fused features at five positions, gives the logits quickdraft's
    network gives: the same rows (d2t), within fp16 rounding (rotary positions 0-4, so the
    query/key row order matters: unpermuted rows give an error about 100x larger). In a
    child process: a loader failure there is an exit code, not a crash of the suite."""
    extra = _llama_cpp_python()
    out = tmp_path / "export"
    done = subprocess.run(
        [sys.executable, "-m", "quickdraft", "export", "eagle", "--target", "smollm2-135m",
         "--engine", "llama.cpp", "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--spec-type draft-eagle3" in done.stdout
    script = f"EXTRA = {extra!r}\nDRAFT = {str(out / FILE)!r}\n" + DRAFT_IN_LLAMA_CPP
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["shape"] == [576, 1, 49152]
    assert result["finite"] == [8192] * 5  # the draft vocabulary's rows, the rest -inf
    assert result["error"] < 0.005, result
    assert all(result["top1"]), result
