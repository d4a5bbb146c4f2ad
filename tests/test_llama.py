"""The native runner against transformers, and its KV cache bookkeeping."""

import pytest
import torch
from conftest import FAMILIES, tiny_hf_model

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
    out = generate(
        target, prompt, sampling=greedy, spec=SpecConfig(num_speculative_tokens=4), draft=draft
    )
    assert out.token_ids == expected
    assert out.stats.mean_accepted_length > 2.0  # the int8 copy agrees with its float original
