"""load_model: aliases, GGUF files, Hugging Face folders, and clear errors."""

import json

import numpy as np
import pytest
import torch
from conftest import tiny_hf_model

from quickdraft import SamplingParams, SpecConfig, generate
from quickdraft.models.gguf import _unpermute
from quickdraft.models.hf import HFModel
from quickdraft.models.llama import LlamaRunner
from quickdraft.models.loading import ALIASES, load_model, resolve


def test_unpermute_inverts_llama_cpp_permutation():
    heads, head_dim, hidden = 3, 8, 12
    weight = np.arange(heads * head_dim * hidden, dtype=np.float32).reshape(-1, hidden)
    # llama.cpp's convert script: reshape(n_head, 2, dim/2, ...).swapaxes(1, 2)
    permuted = weight.reshape(heads, 2, head_dim // 2, hidden).swapaxes(1, 2).reshape(weight.shape)
    np.testing.assert_array_equal(_unpermute(permuted, heads), weight)


def test_default_alias_loads_the_packaged_smollm2(smollm2):
    model, tokenizer = smollm2
    assert isinstance(model, LlamaRunner)
    assert model.vocab_size == 49152 and model.config.num_layers == 30
    assert model.config.tie_word_embeddings and len(tokenizer) == 49152
    assert tokenizer.eos_token_ids == (2,)
    assert tokenizer.decode(tokenizer.encode("Hello, world")) == "Hello, world"
    assert tokenizer.apply_chat("hi")[-4:] == tokenizer.encode("<|im_start|>assistant\n")
    folder = resolve("smollm2-135m")
    assert (
        json.loads((folder / "source.json").read_text())["sha256"] == ALIASES["smollm2-135m"].sha256
    )


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, smollm2):
    """A tiny Qwen2 checkpoint saved as a Hugging Face folder, with SmolLM2's tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    model = tiny_hf_model("qwen2-bias", vocab_size=49152, layers=2)
    model.save_pretrained(folder)
    smollm2[1].hf.save_pretrained(folder)
    return folder, model


def test_hf_folder_loads_natively_or_through_transformers(hf_folder):
    folder, reference = hf_folder
    native, tokenizer = load_model(folder)
    adapter, _ = load_model(folder, backend="hf")
    assert isinstance(native, LlamaRunner) and isinstance(adapter, HFModel)
    prompt = tokenizer.encode("def add(a, b):")
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits
    got = native.forward(
        torch.tensor([prompt]),
        torch.arange(len(prompt)).unsqueeze(0),
        native.new_cache(1, len(prompt)),
    ).logits
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-4
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    assert (
        generate(native, prompt, sampling=greedy).token_ids
        == generate(adapter, prompt, sampling=greedy).token_ids
    )


def test_draft_with_a_padded_vocabulary_needs_matching_tokenizers(hf_folder, smollm2):
    folder, _ = hf_folder
    target, tokenizer = smollm2
    padded = tiny_hf_model("llama-tied", vocab_size=49152 + 64, layers=1)
    draft = LlamaRunner.from_state_dict(padded.config.to_dict(), padded.state_dict())
    prompt = tokenizer.encode("x = [1, 2, 3]\ny = ")
    greedy = SamplingParams(temperature=0, max_new_tokens=10)
    expected = generate(target, prompt, sampling=greedy).token_ids
    out = generate(
        target, prompt, sampling=greedy, draft=draft, tokenizer=tokenizer, draft_tokenizer=tokenizer
    )
    assert out.token_ids == expected
    with pytest.raises(ValueError, match="vocabulary"):
        generate(target, prompt, sampling=greedy, draft=draft)
    _, other = load_model(folder)
    other.hf.add_tokens(["<extra-token>"])
    with pytest.raises(ValueError, match="tokenizer"):
        generate(
            target,
            prompt,
            sampling=greedy,
            spec=SpecConfig(),
            draft=draft,
            tokenizer=tokenizer,
            draft_tokenizer=other,
        )


def test_bad_names_raise_value_errors(tmp_path):
    with pytest.raises(ValueError, match="name_or_path"):
        load_model(tmp_path / "missing.gguf")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="gguf"):
        load_model(tmp_path / "weights.bin")
    with pytest.raises(ValueError, match=r"config\.json"):
        load_model(tmp_path)
    with pytest.raises(ValueError, match="backend"):
        load_model("smollm2-135m", backend="onnx")
    with pytest.raises(ValueError, match="hub"):
        load_model("nobody/no-such-model-here")


def test_int8_needs_the_native_runner(hf_folder):
    folder, _ = hf_folder
    with pytest.raises(ValueError, match="int8"):
        load_model(folder, backend="hf", int8=True)
