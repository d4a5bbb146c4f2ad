"""A transformers model object as the native runner: its own tensors (no copy by default),
its logits, and EAGLE, Medusa, trees and batches token-identical to transformers' own greedy
decoding of it."""

import pytest
import torch
from conftest import FAMILIES, prompt_logits, tiny_hf_model
from test_eagle import random_net
from test_medusa import random_heads

from quickdraft import SamplingParams, from_transformers, generate, generate_batch
from quickdraft.drafters.eagle.drafter import EagleDrafter
from quickdraft.drafters.eagle.tree import DynamicTree
from quickdraft.drafters.medusa.drafter import MedusaDrafter
from quickdraft.drafters.medusa.tree import parse_tree
from quickdraft.models.llama import LlamaRunner

GREEDY = SamplingParams(temperature=0, max_new_tokens=16)
PROMPTS = [[5, 17, 3, 99, 42], [1, 2, 3, 1, 2], [8, 8, 8, 8, 8]]


def transformers_greedy(model, prompt: list[int]) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=GREEDY.max_new_tokens, do_sample=False,
        pad_token_id=0, eos_token_id=None,
    )  # fmt: skip
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("shared", [True, False])
def test_a_transformers_model_drafts_and_batches_as_transformers_decodes(family, shared):
    model = tiny_hf_model(family, layers=3)
    runner = from_transformers(model, shared=shared)
    prompt = PROMPTS[0]
    with torch.no_grad():
        expected = model(torch.tensor([prompt])).logits
    got = prompt_logits(runner, prompt)
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-5
    hidden = runner.config.hidden_size
    drafters = {
        "eagle": EagleDrafter(runner, random_net(runner, "eagle3"), DynamicTree(3, 2, 6)),
        "medusa": MedusaDrafter(
            runner, random_heads(hidden, runner.vocab_size), parse_tree("default", 3)
        ),
    }
    for prompt in PROMPTS:
        reference = transformers_greedy(model, prompt)
        assert generate(runner, prompt, sampling=GREEDY).token_ids == reference
        for name, drafter in drafters.items():
            out = generate(runner, prompt, sampling=GREEDY, draft=drafter)
            assert out.token_ids == reference, (family, name, prompt)
    batch = generate_batch(runner, torch.tensor(PROMPTS), sampling=GREEDY, draft=drafters["eagle"])
    assert batch.token_ids == [transformers_greedy(model, p) for p in PROMPTS]


def test_a_shared_runner_holds_no_weights_of_its_own_and_sees_updates():
    model = tiny_hf_model("qwen2-bias", layers=2)
    runner = from_transformers(model)
    attention = model.model.layers[0].self_attn
    q = runner.layers[0].qkv.parts[0]
    assert q.weight.data_ptr() == attention.q_proj.weight.data_ptr()
    assert q.bias.data_ptr() == attention.q_proj.bias.data_ptr()
    assert runner.head_weight.data_ptr() == model.lm_head.weight.data_ptr()
    with torch.no_grad():  # a training step on the model, in place
        attention.v_proj.weight.mul_(0.5)
        expected = model(torch.tensor([PROMPTS[0]])).logits
    got = prompt_logits(runner, PROMPTS[0])
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-5


def test_a_model_without_a_native_runner_is_named(tmp_path):
    import transformers

    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        from_transformers(transformers.GPT2LMHeadModel(config))
    with pytest.raises(ValueError, match="transformers model"):
        from_transformers(object())
    model = tiny_hf_model("llama-untied", layers=1)
    with pytest.raises(ValueError, match="lm_head"):
        from_transformers(model.model)  # the bare decoder, without its head
    with pytest.raises(ValueError, match="int8"):
        LlamaRunner(runner_config(model), dict(model.state_dict()), int8=True, shared=True)


def runner_config(model):
    from quickdraft.models.llama import LlamaConfig

    return LlamaConfig.from_hf(model.config.to_dict())
