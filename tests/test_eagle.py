"""EAGLE drafters: token identity with plain decoding, the draft cache against training's
unrolled passes, save/load, export, and the training pipeline on a tiny model."""

import pytest
import torch
from conftest import FAMILIES, tiny_hf_model

from quickdraft import SamplingParams, SpecConfig, generate, generate_batch
from quickdraft.drafters.base import DecodeState
from quickdraft.drafters.eagle import DynamicTree, EagleDrafter, load_eagle, save_eagle
from quickdraft.drafters.eagle_net import EagleConfig, EagleNet
from quickdraft.models.llama import LlamaRunner

GREEDY = SamplingParams(temperature=0, max_new_tokens=32)
PROMPTS = [[5, 17, 3, 99, 42, 5, 17], [1, 2, 3, 1, 2, 3, 1, 2], [7]]


def random_net(target: LlamaRunner, variant: str, draft_vocab: int = 60, seed: int = 0):
    """An untrained network with weights large enough that its drafts vary with the context."""
    torch.manual_seed(seed)
    net = EagleNet(EagleConfig.for_target(target.config, variant, draft_vocab))
    with torch.no_grad():
        for parameter in net.parameters():
            if parameter.dim() == 2:
                parameter.mul_(3.0)
        net.draft_vocab = torch.randperm(target.vocab_size)[:draft_vocab]
    return net.eval()


@pytest.fixture(scope="module")
def targets():
    models = {}
    for family in FAMILIES:
        hf = tiny_hf_model(family, layers=4)
        models[family] = LlamaRunner.from_state_dict(hf.config.to_dict(), hf.state_dict())
    return models


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
@pytest.mark.parametrize("tree", ["default", "3,1,3", "2,3,5", "5,2,10"])
def test_eagle_trees_are_token_identical_to_plain_decoding(targets, family, variant, tree):
    target = targets[family]
    drafter = EagleDrafter(target, random_net(target, variant), DynamicTree.parse(tree))
    for prompt in PROMPTS:
        expected = generate(target, prompt, sampling=GREEDY).token_ids
        out = generate(target, prompt, sampling=GREEDY, draft=drafter)
        assert out.token_ids == expected, (family, variant, tree, prompt)


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_batched_rows_share_a_tree_shape_and_stay_identical(targets, variant):
    target = targets["llama-untied"]
    drafter = EagleDrafter(target, random_net(target, variant), DynamicTree(3, 3, 7))
    prompts = torch.tensor([[5, 17, 3, 99, 42], [1, 2, 3, 1, 2], [8, 8, 8, 8, 8]])
    out = generate_batch(target, prompts, sampling=GREEDY, draft=drafter)
    for row, prompt in enumerate(prompts.tolist()):
        assert out.token_ids[row] == generate(target, prompt, sampling=GREEDY).token_ids


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_draft_cache_sees_what_training_unrolls(targets, variant):
    """The drafter's incremental passes (catch-up over real features, then tree nodes over
    its cache) compute exactly the states that ``EagleNet.unroll`` trains on: the same
    network, inputs and attention, step by step along the real continuation."""
    target = targets["llama-tied"]
    net = random_net(target, variant)
    drafter = EagleDrafter(target, net, DynamicTree(3, 1, 3))
    sequence = torch.tensor([[5, 17, 3, 99, 42, 5, 17, 60, 2, 33, 71]])
    length, steps = sequence.shape[1], 3
    tapped = target.with_taps(drafter.target_taps)
    full = tapped.forward(sequence, torch.arange(length).unsqueeze(0), tapped.new_cache(1, length))
    taps = [full.taps[i] for i in drafter.target_taps]
    with torch.no_grad():
        features = net.fuse(full.hidden, taps)
        embeds = target.embed[sequence[:, 1:]]  # e_{t+1} for anchor t
        anchors = length - steps  # anchors 0..anchors-1 have every step's inputs
        unrolled = net.unroll(
            embeds[:, : anchors + steps - 1], features[:, :anchors], steps,
            torch.zeros(1, anchors, dtype=torch.bool),
        )  # fmt: skip

    # The engine's state with tokens 0..n-1 (n - 1 pending) and the target's features at
    # 0..n-2, as after a prefill of n - 1 tokens.
    n = anchors + 1
    state = DecodeState(
        tokens=torch.cat([sequence, torch.zeros(1, 8, dtype=torch.long)], 1),
        lengths=torch.tensor([n]),
        prompt_length=n,
        sampling=GREEDY,
        generator=torch.Generator(),
        fresh_hidden=full.hidden[:, : n - 1],
        fresh_taps={i: t[:, : n - 1] for i, t in full.taps.items()},
        fresh_count=torch.tensor([n - 1]),
    )
    drafter.begin(state)
    with torch.inference_mode():
        output = drafter._catch_up(state)  # the pending token's entry: anchor n - 2, step 0
        torch.testing.assert_close(output[0], unrolled[0][0, n - 2], atol=1e-4, rtol=1e-4)
        entries: list[int] = []
        for step in range(1, steps):  # a chain along the real tokens n, n + 1, ..
            token = sequence[:, n - 1 + step]
            attn_input, residual = net.project(target.embed[token].unsqueeze(1), output[:, None])
            entries.append(len(entries) - 1)
            ancestors = torch.ones(len(entries), len(entries), dtype=torch.bool).tril()[-1:]
            position = torch.tensor([[n - 2 + step]])
            output = drafter._attend(attn_input, residual, position, ancestors, step - 1)[:, 0]
            torch.testing.assert_close(output[0], unrolled[step][0, n - 2], atol=1e-4, rtol=1e-4)


def test_save_load_round_trip_and_config_errors(targets, tmp_path):
    target = targets["llama-tied"]
    net = random_net(target, "eagle3")
    save_eagle(tmp_path / "d", net, {"note": "test"})
    loaded = load_eagle(tmp_path / "d")
    assert loaded.config == net.config
    assert torch.equal(loaded.draft_vocab, net.draft_vocab)
    for name, tensor in net.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name].float(), tensor.half().float())
    with pytest.raises(ValueError, match="eagle_dir"):
        load_eagle(tmp_path / "missing")
    with pytest.raises(ValueError, match="feature_layers"):
        EagleConfig.for_target(target.config, "eagle3", 10, feature_layers=(0, 1, 2))
    with pytest.raises(ValueError, match="draft_vocab_size"):
        EagleConfig.for_target(target.config, "eagle1", 10**6)
    with pytest.raises(ValueError, match="variant|eagle2"):
        EagleConfig.for_target(target.config, "eagle2", 10)


def test_tree_option_is_validated_at_the_boundary():
    assert DynamicTree.parse("default") == DynamicTree()
    assert DynamicTree.parse("5,4,16") == DynamicTree(5, 4, 16)
    with pytest.raises(ValueError, match="tree"):
        SpecConfig(method="eagle", tree="4,2")
    with pytest.raises(ValueError, match="tree"):
        SpecConfig(method="eagle", tree="0,2,3")
    with pytest.raises(ValueError, match="eagle_dir"):
        SpecConfig(method="medusa", eagle_dir="x")
    assert SpecConfig(method="eagle", tree="4,1,4").tree == "4,1,4"
