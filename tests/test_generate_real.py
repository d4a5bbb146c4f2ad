"""Greedy identity and the engine's edge cases on transformer models: tiny random families
and the real SmolLM2-135M."""

import pytest
import torch
from conftest import FAMILIES, tiny_hf_model

from quickdraft import Method, SamplingParams, SpecConfig, generate
from quickdraft.models.hf import HFModel
from quickdraft.models.llama import LlamaRunner

METHODS = [Method.DRAFT_MODEL, Method.NGRAM]
KS = [1, 2, 4, 8]


def greedy(max_new_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=max_new_tokens, **kwargs)


@pytest.fixture(scope="module")
def families():
    models = {}
    for family in FAMILIES:
        hf = tiny_hf_model(family, layers=3)
        target = LlamaRunner.from_state_dict(hf.config.to_dict(), hf.state_dict())
        models[family] = (target, target.truncated(1))
    return models


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_method_and_k_is_token_identical_on_tiny_families(families, family):
    target, draft = families[family]
    prompts = [[5, 17, 3, 99, 42, 5, 17], [1, 2, 3, 1, 2, 3, 1, 2]]
    for prompt in prompts:
        expected = generate(target, prompt, sampling=greedy(40)).token_ids
        for method in METHODS:
            for k in KS:
                spec = SpecConfig(method=method, num_speculative_tokens=k)
                out = generate(
                    target,
                    prompt,
                    sampling=greedy(40),
                    spec=spec,
                    draft=draft if method is Method.DRAFT_MODEL else None,
                )
                assert out.token_ids == expected, (family, method, k)


def test_batched_native_rows_match_single_runs(families):
    target, draft = families["qwen2-bias"]
    prompts = torch.randint(0, 101, (3, 6), generator=torch.Generator().manual_seed(5))
    from quickdraft import generate_batch

    batch = generate_batch(
        target, prompts, sampling=greedy(30), draft=draft, spec=SpecConfig(num_speculative_tokens=3)
    )
    for row, ids in zip(prompts.tolist(), batch.token_ids, strict=True):
        assert ids == generate(target, row, sampling=greedy(30)).token_ids


def test_hf_adapter_runs_chains_identically():
    hf = tiny_hf_model("llama-untied")
    adapter = HFModel(hf)
    native = LlamaRunner.from_state_dict(hf.config.to_dict(), hf.state_dict())
    prompt = [3, 4, 5, 3, 4]
    expected = generate(native, prompt, sampling=greedy(24)).token_ids
    assert generate(adapter, prompt, sampling=greedy(24)).token_ids == expected
    for method in METHODS:
        spec = SpecConfig(method=method, num_speculative_tokens=3)
        draft = (
            HFModel(tiny_hf_model("llama-untied", layers=1, seed=1))
            if method is Method.DRAFT_MODEL
            else None
        )
        out = generate(adapter, prompt, sampling=greedy(24), spec=spec, draft=draft)
        assert out.token_ids == expected
    with pytest.raises(ValueError, match="batch_size"):
        adapter.new_cache(2, 8)
    with pytest.raises(ValueError, match="tree_mask"):
        adapter.forward(
            torch.tensor([[1]]),
            torch.tensor([[0]]),
            adapter.new_cache(1, 4),
            tree_mask=torch.ones(1, 1, dtype=torch.bool),
        )


SMOL_PROMPTS = [
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "The three primary colours are red, yellow and blue. The three primary colours are",
]


@pytest.fixture(scope="module")
def smol_references(smollm2):
    target, tokenizer = smollm2
    prompts = [tokenizer.encode(text) for text in SMOL_PROMPTS]
    return [(prompt, generate(target, prompt, sampling=greedy(48)).token_ids) for prompt in prompts]


# Every k runs on the tiny families above; on SmolLM2 the draft model (8 of its 30 layers,
# 9-25 s a case) runs the shortest chain and a long one, prompt lookup (cheap) every k.
SMOL_CASES = [(Method.DRAFT_MODEL, 1), (Method.DRAFT_MODEL, 4)] + [(Method.NGRAM, k) for k in KS]


@pytest.mark.parametrize(("method", "k"), SMOL_CASES)
def test_smollm2_greedy_identity(smollm2, smol_references, method, k):
    target, _ = smollm2
    draft = target.truncated(8) if method is Method.DRAFT_MODEL else None
    spec = SpecConfig(method=method, num_speculative_tokens=k)
    for prompt, expected in smol_references:
        out = generate(target, prompt, sampling=greedy(48), spec=spec, draft=draft)
        assert out.token_ids == expected


def test_smollm2_edge_cases(smollm2):
    target, tokenizer = smollm2
    prompt = tokenizer.encode(SMOL_PROMPTS[0])
    reference = generate(target, prompt, sampling=greedy(20)).token_ids
    spec = SpecConfig(method=Method.NGRAM, num_speculative_tokens=4)
    for n in (1, 4, 5):
        assert generate(target, prompt, sampling=greedy(n), spec=spec).token_ids == reference[:n]
    stop = reference[6]
    out = generate(target, prompt, sampling=greedy(20, stop_token_ids=(stop,)), spec=spec)
    assert out.token_ids == reference[: reference.index(stop) + 1]
    with pytest.raises(ValueError, match="prompt"):
        generate(target, [])
    with pytest.raises(ValueError, match="context"):
        generate(target, [1] * 8190, sampling=greedy(10))
    sampled = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=16, seed=7)
    draft_spec = SpecConfig(num_speculative_tokens=3)
    runs = [
        generate(
            target, prompt, sampling=sampled, spec=draft_spec, draft=target.truncated(6)
        ).token_ids
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_smollm2_logits_match_transformers(smollm2):
    from transformers import AutoModelForCausalLM

    from quickdraft.models.sources import resolve

    target, tokenizer = smollm2
    hf = AutoModelForCausalLM.from_pretrained(
        str(resolve("smollm2-135m")), dtype=torch.float32
    ).eval()
    ids = torch.tensor([tokenizer.encode(SMOL_PROMPTS[0])])
    with torch.no_grad():
        expected = hf(ids).logits
    got = target.forward(
        ids, torch.arange(ids.shape[1]).unsqueeze(0), target.new_cache(1, ids.shape[1])
    ).logits
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-4
