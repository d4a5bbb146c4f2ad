"""The native runner against transformers, and its KV cache bookkeeping."""

import pytest
import torch
from conftest import FAMILIES, tiny_hf_model

from quickdraft.models.base import Slots
from quickdraft.models.llama import LlamaConfig, LlamaRunner


def native(hf_model) -> LlamaRunner:
    return LlamaRunner.from_state_dict(hf_model.config.to_dict(), hf_model.state_dict())


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).abs().max() / expected.abs().max())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_transformers_in_one_pass_and_incrementally(family):
    hf = tiny_hf_model(family)
    runner = native(hf)
    ids = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
    one_pass = runner.forward(ids, torch.arange(20).expand(2, -1), runner.new_cache(2, 20))
    assert relative_error(one_pass.logits, expected) < 1e-4
    cache = runner.new_cache(2, 24)
    pieces = []
    for start, stop in ((0, 9), (9, 10), (10, 15), (15, 20)):
        out = runner.forward(ids[:, start:stop], torch.arange(start, stop).expand(2, -1), cache)
        cache.commit(stop - start)
        pieces.append(out.logits)
    assert relative_error(torch.cat(pieces, 1), expected) < 1e-4


def test_config_from_hf_reads_old_and_new_rope_layouts():
    base = dict(
        model_type="llama",
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    old = LlamaConfig.from_hf({**base, "rope_theta": 5e5})
    new = LlamaConfig.from_hf(
        {**base, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}
    )
    assert old.rope_theta == new.rope_theta == 5e5 and new.rope_scaling is None
    assert old.num_kv_heads == 2 and old.head_dim == 4
    with pytest.raises(ValueError, match="model_type"):
        LlamaConfig.from_hf({**base, "model_type": "gpt2"})


def test_rejection_keeps_exactly_prefix_plus_accepted_tokens():
    """Exercise 4: a 10-token prefix, 5 drafted tokens, a rejection at draft position 3."""
    runner = native(tiny_hf_model("qwen2-bias"))
    tokens = torch.randint(0, 101, (1, 15), generator=torch.Generator().manual_seed(2))
    prefix, drafts = tokens[:, :10], tokens[:, 10:]
    cache = runner.new_cache(1, 32)
    runner.forward(prefix, torch.arange(10).unsqueeze(0), cache)
    cache.commit(10)
    runner.forward(drafts, torch.arange(10, 15).unsqueeze(0), cache)  # verify all 5
    cache.commit(2)  # d1, d2 accepted; d3 rejected: d3, d4, d5 are not kept

    reference = runner.new_cache(1, 32)
    runner.forward(tokens[:, :12], torch.arange(12).unsqueeze(0), reference)
    reference.commit(12)
    assert cache.lengths.tolist() == reference.lengths.tolist() == [12]
    torch.testing.assert_close(cache.keys[:, :, :12], reference.keys[:, :, :12], rtol=0, atol=1e-6)
    torch.testing.assert_close(
        cache.values[:, :, :12], reference.values[:, :, :12], rtol=0, atol=1e-6
    )
    # And the next step reads exactly that: the same logits as from the rebuilt cache.
    next_token = torch.tensor([[7]])
    position = torch.tensor([[12]])
    torch.testing.assert_close(
        runner.forward(next_token, position, cache).logits,
        runner.forward(next_token, position, reference).logits,
    )


def test_rollback_then_recompute_matches():
    runner = native(tiny_hf_model("llama-tied"))
    tokens = torch.randint(0, 101, (1, 12), generator=torch.Generator().manual_seed(3))
    cache = runner.new_cache(1, 16)
    expected = runner.forward(tokens, torch.arange(12).unsqueeze(0), cache).logits
    cache.commit(12)
    cache.rollback(torch.tensor([8]))
    again = runner.forward(tokens[:, 8:], torch.arange(8, 12).unsqueeze(0), cache).logits
    torch.testing.assert_close(again, expected[:, 8:], rtol=1e-5, atol=1e-5)


def test_tree_mask_verifies_branches_like_separate_chains():
    runner = native(tiny_hf_model("mistral"))
    prefix = torch.randint(0, 101, (1, 6), generator=torch.Generator().manual_seed(4))
    # Tree over new tokens: 0 -> 1 -> 2 and 0 -> 3 (two branches sharing node 0).
    new = torch.tensor([[11, 12, 13, 14]])
    parents = [-1, 0, 1, 0]
    depth = torch.tensor([0, 1, 2, 1])
    mask = torch.zeros(4, 4, dtype=torch.bool)
    for node in range(4):
        walk = node
        while walk != -1:
            mask[node, walk] = True
            walk = parents[walk]
    cache = runner.new_cache(1, 16)
    runner.forward(prefix, torch.arange(6).unsqueeze(0), cache)
    cache.commit(6)
    tree = runner.forward(new, (6 + depth).unsqueeze(0), cache, tree_mask=mask).logits
    for branch in ([0, 1, 2], [0, 3]):
        chain = torch.cat([prefix, new[:, branch]], 1)
        expected = runner.forward(
            chain, torch.arange(chain.shape[1]).unsqueeze(0), runner.new_cache(1, 16)
        ).logits[:, 6:]
        torch.testing.assert_close(tree[:, branch], expected, rtol=1e-5, atol=1e-5)

    # Committing the accepted path [0, 3] leaves the cache a chain prefix + (11, 14).
    cache.commit_path(torch.tensor([[0, 3]]))
    chain = torch.cat([prefix, new[:, [0, 3]]], 1)
    reference = runner.new_cache(1, 16)
    runner.forward(chain, torch.arange(8).unsqueeze(0), reference)
    torch.testing.assert_close(cache.keys[:, :, :8], reference.keys[:, :, :8], rtol=1e-5, atol=1e-5)
    assert cache.lengths.tolist() == [8]


def test_hidden_taps_and_truncation():
    hf = tiny_hf_model("llama-untied", layers=4)
    runner = LlamaRunner.from_state_dict(hf.config.to_dict(), hf.state_dict(), tap_layers=(0, 2))
    ids = torch.randint(0, 101, (1, 5))
    with torch.no_grad():
        states = hf(ids, output_hidden_states=True).hidden_states
    out = runner.forward(ids, torch.arange(5).unsqueeze(0), runner.new_cache(1, 5))
    assert set(out.taps) == {0, 2}
    torch.testing.assert_close(out.taps[2], states[3], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.hidden, states[-1], rtol=1e-4, atol=1e-4)
    short = runner.truncated(2)
    assert short.config.num_layers == 2 and short.tap_layers == (0,)
    with pytest.raises(ValueError, match="tap_layers"):
        LlamaRunner.from_state_dict(hf.config.to_dict(), hf.state_dict(), tap_layers=(9,))
    with pytest.raises(ValueError, match="tree_mask"):
        runner.forward(
            ids,
            torch.arange(5).unsqueeze(0),
            runner.new_cache(1, 5),
            tree_mask=torch.ones(3, 3, dtype=torch.bool),
        )


def test_int8_linear_is_close_to_float():
    from quickdraft.models.ops import Linear

    weight = torch.randn(256, 128, generator=torch.Generator().manual_seed(6)) * 0.05
    x = torch.randn(3, 5, 128, generator=torch.Generator().manual_seed(7))
    exact = x @ weight.T
    assert relative_error(Linear(weight)(x), exact) < 1e-5
    assert relative_error(Linear(weight, int8=True)(x), exact) < 0.03


def test_int8_draft_keeps_greedy_output_exact():
    from quickdraft import SamplingParams, SpecConfig, generate

    hf = tiny_hf_model("llama-untied")
    target = native(hf)
    draft = LlamaRunner.from_state_dict(hf.config.to_dict(), hf.state_dict(), int8=True)
    assert draft.int8
    prompt = [4, 8, 15, 16, 23, 42]
    greedy = SamplingParams(temperature=0, max_new_tokens=30)
    expected = generate(target, prompt, sampling=greedy).token_ids
    whole = SpecConfig(num_speculative_tokens=4, adaptive_k=False)  # k each step
    out = generate(target, prompt, sampling=greedy, spec=whole, draft=draft)
    assert out.token_ids == expected
    assert out.stats.mean_accepted_length > 2.0  # the int8 copy agrees with its float original


def test_a_view_of_contiguous_slots_copies_nothing():
    runner = native(tiny_hf_model("llama-tied"))
    cache = runner.new_cache(4, 8)
    view = cache.select(Slots.of([1, 2]))
    assert view.keys.data_ptr() == cache.keys[:, 1].data_ptr()
    assert view.values.data_ptr() == cache.values[:, 1].data_ptr()
    assert view.lengths.data_ptr() == cache.lengths[1:].data_ptr()
    assert Slots.of([1, 2]).first == 1 and Slots.of([2, 0]).first is None
    assert Slots.of([0, 2]).first is None


def test_a_gathered_view_writes_back_entries_and_lengths_to_its_slots_only():
    """``Cache.select`` of slots with holes, out of order: a forward through the view gives each
    row the logits it gets alone and writes its entries into those slots of the full buffers;
    ``commit``, ``commit_path`` and ``rollback`` write the lengths back; other slots keep every
    entry and length."""
    runner = native(tiny_hf_model("llama-tied"))
    generator = torch.Generator().manual_seed(5)
    prompts = torch.randint(0, 101, (4, 6), generator=generator)
    cache = runner.new_cache(4, 16)
    runner.forward(prompts, torch.arange(6).expand(4, -1), cache)
    cache.commit(torch.tensor([6, 3, 5, 2]))
    keys, values = cache.keys.clone(), cache.values.clone()
    slots = Slots.of([2, 0])
    view = cache.select(slots)
    assert view.lengths.tolist() == [5, 6]
    new = torch.randint(0, 101, (2, 3), generator=generator)
    logits = runner.forward(new, view.lengths.unsqueeze(1) + torch.arange(3), view).logits
    view.commit(torch.tensor([3, 1]))
    assert cache.lengths.tolist() == [7, 3, 8, 2]
    for b, (slot, kept) in enumerate(((2, 8), (0, 7))):
        n = int(view.lengths[b]) - (3 if b == 0 else 1)
        sequence = torch.cat([prompts[slot, :n], new[b]]).unsqueeze(0)
        alone = runner.new_cache(1, 16)
        expected = runner.forward(sequence, torch.arange(n + 3).unsqueeze(0), alone).logits
        torch.testing.assert_close(logits[b], expected[0, n:], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            cache.keys[:, slot, :kept], alone.keys[:, 0, :kept], rtol=1e-5, atol=1e-5
        )
    for slot in (1, 3):
        assert torch.equal(cache.keys[:, slot], keys[:, slot])
        assert torch.equal(cache.values[:, slot], values[:, slot])

    # A tree pass's accepted path moves within each slot's own row.
    view = cache.select(slots)
    runner.forward(new, view.lengths.unsqueeze(1) + torch.arange(3), view)
    scratch = cache.keys[:, [2, 0]].clone()
    view.commit_path(torch.tensor([[0, 2], [1, 2]]), torch.tensor([2, 1]))
    assert cache.lengths.tolist() == [8, 3, 10, 2]
    assert torch.equal(cache.keys[:, 2, 8:10], scratch[:, 0, [8, 10]])
    assert torch.equal(cache.keys[:, 0, 7:9], scratch[:, 1, [8, 9]])
    cache.select(slots).rollback(torch.tensor([4, 1]))
    assert cache.lengths.tolist() == [1, 3, 4, 2]
    for slot in (1, 3):
        assert torch.equal(cache.keys[:, slot], keys[:, slot])
