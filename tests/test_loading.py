"""load_model: aliases, GGUF files, Hugging Face folders, and clear errors."""

import json

import numpy as np
import pytest
import torch
from conftest import prompt_logits, tiny_hf_model

from quickdraft import SamplingParams, SpecConfig, generate
from quickdraft.models.hf import HFModel
from quickdraft.models.llama import LlamaRunner
from quickdraft.models.loading import load_model
from quickdraft.models.sources import ALIASES, packaged_gguf, resolve

GGUF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}  # fmt: skip


def write_gguf(path, model, tokenizer_source) -> None:
    """``model`` (a tiny transformers Llama or Qwen2) as llama.cpp's converter writes it:
    GGUF names, q/k rows permuted for Llama's rotary layout, float32, and the tokenizer of
    the GGUF file ``tokenizer_source``."""
    from gguf import GGUFReader, GGUFWriter

    config = model.config
    arch = config.model_type
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    source = GGUFReader(str(tokenizer_source))
    field = lambda key: source.fields[key].contents()  # noqa: E731
    writer.add_tokenizer_model(field("tokenizer.ggml.model"))
    writer.add_tokenizer_pre(field("tokenizer.ggml.pre"))
    writer.add_token_list(field("tokenizer.ggml.tokens"))
    writer.add_token_types(field("tokenizer.ggml.token_type"))
    writer.add_token_merges(field("tokenizer.ggml.merges"))
    writer.add_bos_token_id(field("tokenizer.ggml.bos_token_id"))
    writer.add_eos_token_id(field("tokenizer.ggml.eos_token_id"))
    writer.add_chat_template(field("tokenizer.chat_template"))
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    for name, tensor in model.state_dict().items():
        array = tensor.float().numpy()
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if name.startswith("model.layers."):
            _, _, index, *module, suffix = name.split(".")
            kind = GGUF_NAMES[".".join(module)]
            if arch == "llama" and kind in heads:  # llama.cpp's permutation of rotary rows
                n = heads[kind]
                array = array.reshape(n, 2, array.shape[0] // n // 2, *array.shape[1:])
                array = array.swapaxes(1, 2).reshape(tensor.shape)
            name = f"blk.{index}.{kind}.{suffix}"
        else:
            name = {"model.embed_tokens.weight": "token_embd.weight",
                    "model.norm.weight": "output_norm.weight",
                    "lm_head.weight": "output.weight"}[name]  # fmt: skip
        writer.add_tensor(name, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("family", ["llama-tied", "qwen2-bias"])
def test_a_gguf_file_loads_to_the_model_it_was_written_from(tmp_path, monkeypatch, family):
    """A tiny model written as llama.cpp writes GGUF (q/k permuted for Llama) converts back,
    through transformers' GGUF loader, to the native runner with the original's logits."""
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    reference = tiny_hf_model(family, vocab_size=49152, layers=2)
    path = tmp_path / f"{family}.gguf"
    write_gguf(path, reference, packaged_gguf("smollm2-135m"))
    native, tokenizer = load_model(path)
    assert isinstance(native, LlamaRunner)
    assert native.config.tie_word_embeddings == reference.config.tie_word_embeddings
    prompt = tokenizer.encode("def add(a, b):")
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits
    got = prompt_logits(native, prompt)
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-5
    assert resolve(path) == resolve(path)  # converted once, then found by its sha256


def test_smollm2_runs_natively_as_transformers_runs_its_gguf(smollm2):
    """The default model's converted weights on the native runner against transformers' own
    model of the same folder: logits to 1e-5 relative."""
    native, tokenizer = smollm2
    folder = resolve("smollm2-135m")
    adapter, _ = load_model(folder, backend="hf")
    prompt = tokenizer.encode("def fibonacci(n):\n    ")
    with torch.no_grad():
        expected = adapter.model(torch.tensor([prompt])).logits
    got = prompt_logits(native, prompt)
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-5


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
    got = prompt_logits(native, prompt)
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
    for empty in ("", " "):  # Path("") would be the working folder
        with pytest.raises(ValueError, match="name_or_path is empty"):
            load_model(empty)
    with pytest.raises(ValueError, match="backend"):
        load_model("smollm2-135m", backend="onnx")
    with pytest.raises(ValueError, match="hub"):
        load_model("nobody/no-such-model-here")


def test_int8_needs_the_native_runner(hf_folder):
    folder, _ = hf_folder
    with pytest.raises(ValueError, match="int8"):
        load_model(folder, backend="hf", int8=True)
