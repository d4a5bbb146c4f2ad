"""A quantized model's decoder layers in one compiled call (``models.fused``): the Python layers'
numbers to float rounding, batch-invariant bit for bit, on every compiled path the host runs
and both weight layouts, and refusing arguments that do not fit."""

import pytest
import torch
from conftest import tiny_hf_model

from quickdraft import kernels
from quickdraft.models import llama
from quickdraft.models.base import Slots
from quickdraft.models.kv_cache import KVCache
from quickdraft.models.llama import LlamaRunner

pytestmark = pytest.mark.skipif(not kernels.native(), reason="the compiled kernels are not built")

PATHS = [p for p in kernels.PATHS if p in kernels.runnable_paths()]


def target(family: str, layout: str, path: str, monkeypatch, bits: int = 4) -> LlamaRunner:
    """A tiny q4 model on one layout and code path, fused (its stack checked to exist)."""
    monkeypatch.setattr(llama, "LAYOUTS", (layout,))
    monkeypatch.setattr(kernels, "best_path", lambda: path)
    model = tiny_hf_model(family, layers=3)
    runner = LlamaRunner.from_state_dict(
        model.config.to_dict(), model.state_dict(), q4=True, q4_bits=bits, invariant=True,
        tap_layers=(0, 2),
    )  # fmt: skip
    assert runner.quant_layout == layout and runner._stack() is not None
    return runner


def run(model: LlamaRunner, fuse: bool, tokens, positions, cache, mask=None):
    model.fuse = fuse
    try:
        return model.forward(tokens, positions, cache, mask)
    finally:
        model.fuse = True


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("layout", ["superblock", "groups"])
@pytest.mark.parametrize(("family", "bits"), [("qwen2-bias", 4), ("llama-untied", 8)])
def test_fused_layers_compute_what_the_python_layers_do(family, bits, layout, path, monkeypatch):
    """Logits, taps and the keys and values written: the same but for rounding, over a prefill,
    then a tree. (Not bit for bit: the norm's sum and SiLU's exponential round in their own
    order, and a last-bit difference before an activation is quantized can move its code a
    whole step, about 1e-3 of these logits.)"""
    model = target(family, layout, path, monkeypatch, bits)
    prompt = (torch.arange(40) * 37 % 101).unsqueeze(0)
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    found = {}
    for fuse in (True, False):
        cache = model.new_cache(1, 48)
        first = run(model, fuse, prompt, torch.arange(40).unsqueeze(0), cache)
        cache.commit(40)
        nodes = run(model, fuse, torch.tensor([[3, 9, 27]]), torch.tensor([[40, 41, 41]]), cache,
                    tree)  # fmt: skip
        found[fuse] = (first, nodes, cache.keys[:, :, :43].clone(), cache.values[:, :, :43])
    fused, python = found[True], found[False]

    def near(a: torch.Tensor, b: torch.Tensor) -> bool:
        return bool((a - b).abs().max() <= 0.01 * b.abs().max())

    for a, b in zip(fused[:2], python[:2], strict=True):
        assert near(a.logits, b.logits) and near(a.hidden, b.hidden)
        assert a.taps.keys() == b.taps.keys() == {0, 2}
        assert near(a.taps[0], b.taps[0]) and near(a.taps[2], b.taps[2])
    assert near(fused[2], python[2]) and near(fused[3], python[3])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("layout", ["superblock", "groups"])
def test_a_token_gets_the_same_logits_in_any_fused_pass(layout, path, monkeypatch):
    """Alone, in a chain, as a tree node, beside rows of other lengths, and through a gathered
    view of the cache (the engine's rows picked from a larger batch): the same bits."""
    torch.set_num_threads(2)  # the autouse fixture sets 1 again for the next test
    model = target("qwen2-bias", layout, path, monkeypatch)
    prompts = torch.tensor([[5, 17, 3, 99, 42, 5, 17, 8], [1, 2, 3, 4, 5, 6, 7, 8]] * 2)
    lengths = torch.tensor([8, 5, 8, 6])

    def cache_of(rows: list[int]) -> KVCache:
        cache = model.new_cache(len(rows), 16)
        model.forward(prompts[rows], torch.arange(8).expand(len(rows), -1), cache)
        cache.lengths += lengths[rows]
        return cache

    step = torch.tensor([[23], [4], [61], [9]])
    alone = [model.forward(step[[r]], lengths[[r]].unsqueeze(1), cache_of([r])).logits[0, 0]
             for r in range(4)]  # fmt: skip
    together = model.forward(step, lengths.unsqueeze(1), cache_of([0, 1, 2, 3])).logits[:, 0]
    gathered = cache_of([0, 1, 2, 3]).select(Slots.of([3, 1]))
    picked = model.forward(step[[3, 1]], lengths[[3, 1]].unsqueeze(1), gathered).logits[:, 0]
    chain = model.forward(torch.tensor([[23, 4, 61]]), 8 + torch.arange(3).unsqueeze(0),
                          cache_of([0])).logits[0]  # fmt: skip
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    nodes = model.forward(torch.tensor([[23, 4, 61]]), torch.tensor([[8, 9, 9]]), cache_of([0]),
                          tree).logits[0]  # fmt: skip
    for row in range(4):
        assert torch.equal(together[row], alone[row]), row
    assert torch.equal(picked[0], alone[3]) and torch.equal(picked[1], alone[1])
    assert torch.equal(chain[0], alone[0]) and torch.equal(nodes[0], alone[0])
    assert torch.equal(nodes[1], chain[1])


def test_the_fused_call_refuses_what_does_not_fit(monkeypatch):
    """A cache slot out of range, or weights that do not describe the layers: one clear error
    from the kernel, never a write out of bounds."""
    model = target("qwen2-bias", "superblock", kernels.best_path(), monkeypatch)
    stack = model._stack()
    cache = model.new_cache(1, 8)
    x = model.embed[torch.tensor([[1, 2]])]
    cos = sin = torch.ones(1, 2, 1, model.config.head_dim)
    groups = llama.seen_slots(model._mask(cache.lengths, 2, 2, None))
    with pytest.raises(RuntimeError, match="out of range"):
        stack.run(x.clone(), cos, sin, cache, torch.tensor([[7, 8]]), groups, 4, 1e-6, ())
    short = type(stack)(stack.weights[:-1], stack.biases, stack.spec, stack.path, stack.layers)
    with pytest.raises(RuntimeError, match="do not describe the same layers"):
        short.run(x.clone(), cos, sin, cache, torch.tensor([[0, 1]]), groups, 4, 1e-6, ())


@pytest.mark.parametrize("path", PATHS)
def test_a_product_in_two_forms_runs_fused(path, monkeypatch):
    """A q/k/v product whose value rows are Q6_K beside 4-bit q/k rows (``ops.StackedWeights``,
    as a Q4_K_M file gives it): the fused call computes what the Python layers do, and a token
    gets the same bits alone as in a batch."""
    from conftest import split_forms

    from quickdraft.models.ops import StackedWeights

    monkeypatch.setattr(kernels, "best_path", lambda: path)
    hf = tiny_hf_model("qwen2-bias", layers=3)
    model = LlamaRunner.from_state_dict(
        hf.config.to_dict(), split_forms(hf.state_dict()), q4=True, q4_exact=True,
        invariant=True,
    )  # fmt: skip
    assert isinstance(model.layers[0].qkv.quantized_weights, StackedWeights)
    assert model._stack() is not None
    prompt = (torch.arange(12) * 37 % 101).unsqueeze(0)
    logits = {}
    for fuse in (True, False):
        cache = model.new_cache(1, 16)
        logits[fuse] = run(model, fuse, prompt, torch.arange(12).unsqueeze(0), cache).logits
    fused, python = logits[True], logits[False]
    assert (fused - python).abs().max() <= 0.01 * python.abs().max()
    cache = model.new_cache(1, 16)
    first = run(model, True, prompt[:, :1], torch.zeros(1, 1, dtype=torch.long), cache).logits
    assert torch.equal(first[0, 0], fused[0, 0])
