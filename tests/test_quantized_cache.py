"""Quantized weights stored on disk (``models.quantized``): a second load reads what the first
quantized, gives the same logits and check, and a damaged entry is quantized again."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import prompt_logits, split_forms, tiny_hf_model

from quickdraft import kernels
from quickdraft.models.llama import LlamaRunner
from quickdraft.models.ops import LAYOUTS


def build(hf, path):
    probe = torch.arange(48) % hf.config.vocab_size
    return LlamaRunner.from_state_dict(
        hf.config.to_dict(), hf.state_dict(), q4=True, invariant=True, probe=probe,
        quantized_cache=path,
    )  # fmt: skip


@pytest.mark.skipif(not kernels.native(), reason="the store holds compiled paths' weights")
def test_a_second_load_reads_what_the_first_quantized(tmp_path, monkeypatch):
    hf = tiny_hf_model("llama-tied")
    path = tmp_path / "entry.safetensors"
    first = build(hf, path)
    assert path.is_file() and first.quant_check is not None
    calls = []
    monkeypatch.setattr("quickdraft.models.ops.Linear.quantize_q4", lambda *a, **k: calls.append(a))
    second = build(hf, path)
    assert calls == []  # nothing quantized: every layer came from the file
    assert second.quant_check == first.quant_check
    prompt = [3, 14, 15, 92, 65, 35]
    assert torch.equal(prompt_logits(second, prompt), prompt_logits(first, prompt))
    layouts = {type(layer.quantized_weights).__name__ for layer in second._projections()}
    assert len(layouts) == 1 and len(LAYOUTS) == 2


@pytest.mark.skipif(not kernels.native(), reason="the store holds compiled paths' weights")
def test_a_damaged_entry_is_quantized_again(tmp_path):
    hf = tiny_hf_model("llama-tied")
    path = tmp_path / "entry.safetensors"
    path.write_bytes(b"not a safetensors file")
    runner = build(hf, path)
    assert runner.quant_check is not None and runner.quant_check.passed
    again = build(hf, path)  # the rewritten entry reads back
    prompt = [7, 1, 8, 2, 8]
    assert torch.equal(prompt_logits(again, prompt), prompt_logits(runner, prompt))


@pytest.mark.skipif(not kernels.native(), reason="the store holds compiled paths' weights")
def test_an_entry_keeps_a_products_runs_of_rows(tmp_path):
    """A q/k/v product whose value rows came in Q6_K beside 4-bit q/k rows is stored as its
    runs (``ops.StackedWeights``) and read back as them, with the same logits."""
    from quickdraft.models.ops import StackedWeights

    hf = tiny_hf_model("qwen2-bias")
    state = split_forms(hf.state_dict())
    path = tmp_path / "entry.safetensors"

    def load() -> LlamaRunner:
        return LlamaRunner.from_state_dict(
            hf.config.to_dict(), state, q4=True, q4_exact=True, invariant=True,
            quantized_cache=path,
        )  # fmt: skip

    first, second = load(), load()
    for model in (first, second):
        qkv = [layer.qkv.quantized_weights for layer in model.layers]
        assert all(isinstance(weights, StackedWeights) for weights in qkv)
    prompt = [3, 14, 15, 92, 65, 35]
    assert torch.equal(prompt_logits(second, prompt), prompt_logits(first, prompt))


@pytest.mark.skipif(not kernels.native(), reason="the store holds compiled paths' weights")
def test_a_new_entry_replaces_its_models_stale_ones(tmp_path, monkeypatch):
    """Another quickdraft's entry for the same model, unread for a day, goes when a new one is
    written, as does one named the older way; a recently read one stays (two installations
    side by side), and so do other models' entries. A load marks its entry read."""
    import os
    import time

    from quickdraft.models import quantized

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights")
    path = quantized.cache_path([weights], "q4", False)
    model = path.name.partition("-")[0]
    assert len(model) == 12 and path.name != quantized.cache_path([weights], "int8", False).name
    path.parent.mkdir(parents=True)
    old = time.time() - 2 * quantized.STALE_SECONDS
    stale, recent = (
        path.with_name(f"{model}-{'a' * 24}.safetensors"),
        path.with_name(f"{model}-{'b' * 24}.safetensors"),
    )
    other, legacy = (
        path.with_name(f"{'c' * 12}-{'d' * 24}.safetensors"),
        path.with_name(f"{'e' * 24}.safetensors"),
    )
    for entry in (stale, recent, other, legacy):
        entry.write_bytes(b"entry")
        os.utime(entry, (old, old))
    os.utime(recent)
    hf = tiny_hf_model("llama-tied")
    build(hf, path)
    assert path.is_file() and recent.is_file() and other.is_file()
    assert not stale.exists() and not legacy.exists()
    os.utime(path, (old, old))
    calls = []
    monkeypatch.setattr("quickdraft.models.ops.Linear.quantize_q4", lambda *a, **k: calls.append(a))
    build(hf, path)  # read back, nothing quantized: and marked as read now
    assert calls == [] and time.time() - path.stat().st_mtime < 60
    assert not list(path.parent.glob("*.partial"))


@pytest.mark.skipif(not kernels.native(), reason="the store holds compiled paths' weights")
def test_an_entry_named_by_its_key_alone_takes_the_new_name(tmp_path, monkeypatch):
    """Earlier versions named an entry by its key: a load finds it under the new name
    instead of quantizing the model again."""
    hf = tiny_hf_model("llama-tied")
    old = tmp_path / f"{'f' * 24}.safetensors"
    build(hf, old)
    path = tmp_path / f"{'0' * 12}-{old.name}"
    calls = []
    monkeypatch.setattr("quickdraft.models.ops.Linear.quantize_q4", lambda *a, **k: calls.append(a))
    build(hf, path)
    assert calls == [] and path.is_file() and not old.exists()


def test_an_interrupted_save_leaves_no_partial_file(tmp_path, monkeypatch):
    from quickdraft.models import quantized

    def interrupted(tensors, name, metadata=None):
        Path(name).write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr("safetensors.torch.save_file", interrupted)
    linear = type("L", (), {"quantized_weights": None})()
    quantized.save(tmp_path / "m-k.safetensors", [linear], None)  # nothing packed: nothing
    hf = tiny_hf_model("llama-tied")
    runner = build(hf, None)
    with pytest.raises(KeyboardInterrupt):
        quantized.save(tmp_path / "m-k.safetensors", runner._projections(), None)
    assert list(tmp_path.iterdir()) == []


def test_small_weight_files_are_known_by_their_bytes(tmp_path, monkeypatch):
    """The same small weights saved again elsewhere (each test run saves its tiny models anew)
    find one entry; other bytes another; a large file is known by its path."""
    from quickdraft.models import quantized

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    first, again, other = (tmp_path / name for name in ("a.safetensors", "b.safetensors", "c"))
    first.write_bytes(b"weights")
    again.write_bytes(b"weights")
    other.write_bytes(b"weightz")
    entry = quantized.cache_path([first], "q4", False)
    assert quantized.cache_path([again], "q4", False) == entry
    assert quantized.cache_path([other], "q4", False) != entry
    monkeypatch.setattr(quantized, "CONTENT_BYTES", 0)
    assert quantized.cache_path([again], "q4", False) != quantized.cache_path([first], "q4", False)


@pytest.mark.skipif(not kernels.native(), reason="packed weights are the compiled paths'")
def test_a_loaded_targets_packed_weights_share_one_region(tmp_path):
    """A q4 target's packed weights lie in one region (advised for 2 MB pages), a line apart;
    gathering them again moves the same bytes and changes no logit."""
    from quickdraft.models import quantized
    from quickdraft.models.ops import parts_of

    model = build(tiny_hf_model("qwen2-bias"), None)

    def packed() -> list[torch.Tensor]:
        return [
            part.packed
            for linear in model._projections()
            for part in parts_of(linear.quantized_weights)
        ]

    first = packed()
    pointers = sorted(t.data_ptr() for t in first)
    assert len({t.untyped_storage().data_ptr() for t in first}) == 1
    assert all(p % quantized.ALIGN == 0 for p in pointers)
    span = pointers[-1] + max(t.numel() for t in first) - pointers[0]
    assert span < sum(t.numel() for t in first) + quantized.ALIGN * len(first) + max(
        t.numel() for t in first
    )
    prompt = [3, 14, 15, 92, 65, 35]
    before = prompt_logits(model, prompt)
    quantized.gather(model._projections())
    model._stacks.clear()
    again = packed()
    assert again[0].untyped_storage().data_ptr() != first[0].untyped_storage().data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert torch.equal(prompt_logits(model, prompt), before)
