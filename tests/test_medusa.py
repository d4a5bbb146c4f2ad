"""Medusa heads: tree drafting on the target's own hidden state, exact and token-identical."""

import pytest
import torch
from conftest import FAMILIES, tiny_hf_model

from quickdraft import SamplingParams, SpecConfig, generate, generate_batch
from quickdraft.config import Method
from quickdraft.drafters import build_drafter
from quickdraft.drafters.medusa import (
    MedusaConfig,
    MedusaDrafter,
    MedusaHeads,
    default_tree,
    load_heads,
    parse_tree,
    save_heads,
)
from quickdraft.models.llama import LlamaRunner

GREEDY = SamplingParams(temperature=0, max_new_tokens=40)
PROMPTS = [[5, 17, 3, 99, 42, 5, 17], [1, 2, 3, 1, 2, 3, 1, 2], [7]]


def random_heads(hidden: int, vocab: int, num_heads: int = 3, seed: int = 0, own=None):
    """Heads with random (not zero) blocks, so their candidates differ from the target's."""
    torch.manual_seed(seed)
    heads = MedusaHeads(MedusaConfig(hidden, vocab, num_heads, own_head=own is not None), own)
    with torch.no_grad():
        for block in heads.blocks:
            for layer in block:
                layer.linear.weight.normal_(0, 0.3)
    return heads.eval()


@pytest.fixture(scope="module")
def targets():
    models = {}
    for family in FAMILIES:
        hf = tiny_hf_model(family, layers=2)
        models[family] = LlamaRunner.from_state_dict(hf.config.to_dict(), hf.state_dict())
    return models


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("tree", ["default", "3,2,1", "1,1,1", "2"])
def test_medusa_trees_are_token_identical_to_plain_decoding(targets, family, tree):
    target = targets[family]
    heads = random_heads(target.config.hidden_size, target.vocab_size)
    drafter = MedusaDrafter(target, heads, parse_tree(tree, 3))
    for prompt in PROMPTS:
        expected = generate(target, prompt, sampling=GREEDY).token_ids
        out = generate(target, prompt, sampling=GREEDY, draft=drafter)
        assert out.token_ids == expected, (family, tree, prompt)
        assert out.stats.target_forwards <= len(expected)


def test_untrained_heads_repeat_the_targets_next_token_and_heads_of_their_own_work(targets):
    target = targets["llama-untied"]
    config = MedusaConfig(target.config.hidden_size, target.vocab_size, 2)
    states = MedusaHeads(config)(torch.randn(4, config.hidden_size))
    assert states.shape == (4, 2, config.hidden_size)
    own = random_heads(
        target.config.hidden_size, target.vocab_size, 2, own=target.head_weight.float()
    )
    drafter = MedusaDrafter(target, own)
    for prompt in PROMPTS[:2]:
        expected = generate(target, prompt, sampling=GREEDY).token_ids
        assert generate(target, prompt, sampling=GREEDY, draft=drafter).token_ids == expected


def test_batched_rows_match_single_runs(targets):
    target = targets["qwen2-bias"]
    drafter = MedusaDrafter(target, random_heads(target.config.hidden_size, target.vocab_size))
    prompts = torch.randint(0, 101, (3, 6), generator=torch.Generator().manual_seed(5))
    batch = generate_batch(target, prompts, sampling=GREEDY, draft=drafter)
    for row, ids in zip(prompts.tolist(), batch.token_ids, strict=True):
        assert ids == generate(target, row, sampling=GREEDY).token_ids


def test_sampling_with_trees_runs_and_is_seeded(targets):
    target = targets["llama-tied"]
    drafter = MedusaDrafter(target, random_heads(target.config.hidden_size, target.vocab_size))
    sampling = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=30, seed=3)
    a = generate(target, PROMPTS[0], sampling=sampling, draft=drafter)
    b = generate(target, PROMPTS[0], sampling=sampling, draft=drafter)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 30
    assert all(0 <= t < target.vocab_size for t in a.token_ids)


def test_heads_round_trip_and_build_from_a_spec(targets, tmp_path):
    target = targets["llama-tied"]
    heads = random_heads(target.config.hidden_size, target.vocab_size, 2)
    save_heads(tmp_path, heads, {"note": "test"})
    loaded = load_heads(tmp_path)
    hidden = torch.randn(3, target.config.hidden_size)
    torch.testing.assert_close(loaded(hidden), heads(hidden), atol=1e-2, rtol=1e-2)  # fp16 file
    spec = SpecConfig(method=Method.MEDUSA, medusa_dir=str(tmp_path), tree="2,2")
    drafter = build_drafter(spec, target)
    assert isinstance(drafter, MedusaDrafter) and drafter.num_tokens == 6 and drafter.depth == 2


def test_bad_medusa_settings_name_the_field(targets, tmp_path):
    target = targets["llama-tied"]
    with pytest.raises(ValueError, match="tree applies to method medusa"):
        SpecConfig(method=Method.NGRAM, tree="2,2")
    with pytest.raises(ValueError, match="tree"):
        SpecConfig(method=Method.MEDUSA, tree="two")
    with pytest.raises(ValueError, match="medusa_dir"):
        build_drafter(SpecConfig(method=Method.MEDUSA, medusa_dir=str(tmp_path)), target)
    with pytest.raises(ValueError, match="medusa_dir: no Medusa heads ship"):
        build_drafter(SpecConfig(method=Method.MEDUSA), target, target_name="nope")
    heads = random_heads(target.config.hidden_size, target.vocab_size, 2)
    with pytest.raises(ValueError, match="tree: 3 levels"):
        MedusaDrafter(target, heads, parse_tree("2,2,2", 3))
    with pytest.raises(ValueError, match="hidden size"):
        MedusaDrafter(target, random_heads(32, target.vocab_size))
    assert default_tree(3).num_nodes == 14 and default_tree(5).max_depth == 5
