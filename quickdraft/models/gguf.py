"""GGUF files to Hugging Face-layout folders: config.json, model.safetensors and the tokenizer.

Tensors are read and dequantized to float32 with the ``gguf`` package; names are mapped back to
Hugging Face's, and the rotary permutation that llama.cpp applies to Llama q/k weights is undone.
The result is cached under ``$QUICKDRAFT_CACHE`` (default ``~/.cache/quickdraft``), keyed by the
file's sha256, so each file is converted once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quickdraft.artifacts import ArtifactError, brief, partial_suffix, remove_stale_partials

ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "mistral": "mistral"}

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def cache_root() -> Path:
    return Path(os.environ.get("QUICKDRAFT_CACHE", Path.home() / ".cache" / "quickdraft"))


def sha256_of(path: Path, chunk: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_config(reader: Any) -> dict[str, Any]:
    """A Hugging Face config.json dictionary from GGUF metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported ({', '.join(ARCHITECTURES)})"
        )
    get = lambda key, default=None: _field(reader, f"{arch}.{key}", default)  # noqa: E731
    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    tensor_names = {tensor.name for tensor in reader.tensors}
    vocab = get("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    return {
        "model_type": ARCHITECTURES[arch],
        "architectures": [
            {
                "llama": "LlamaForCausalLM",
                "qwen2": "Qwen2ForCausalLM",
                "mistral": "MistralForCausalLM",
            }[arch]
        ],
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved to half-split rotary pairs)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def read_state_dict(
    reader: Any, config: dict[str, Any], *, progress: str | None = None
) -> dict[str, torch.Tensor]:
    """All tensors, dequantized to float32, under Hugging Face names; ``progress`` labels a
    progress bar on stderr."""
    from gguf.quants import dequantize
    from rich.console import Console
    from rich.progress import track

    llama_rope = config["model_type"] == "llama"
    state = {}
    tensors = reader.tensors
    if progress is not None:
        tensors = track(tensors, description=progress, console=Console(stderr=True), transient=True)
    for tensor in tensors:
        array = dequantize(tensor.data, tensor.tensor_type)
        array = np.asarray(array, dtype=np.float32).reshape(
            [int(n) for n in reversed(tensor.shape.tolist())]
        )
        name = tensor.name
        if name in _GLOBAL_NAMES:
            state[_GLOBAL_NAMES[name]] = torch.from_numpy(np.array(array, copy=True))
            continue
        block, index, kind, suffix = name.split(".")
        if block != "blk" or kind not in _LAYER_NAMES:
            raise ValueError(f"unexpected GGUF tensor {name!r}")
        if llama_rope and kind == "attn_q":
            array = _unpermute(array, config["num_attention_heads"])
        elif llama_rope and kind == "attn_k":
            array = _unpermute(array, config["num_key_value_heads"])
        state[f"model.layers.{index}.{_LAYER_NAMES[kind]}.{suffix}"] = torch.from_numpy(
            np.array(array, copy=True)
        )
    return state


def convert(path: Path, *, sha256: str | None = None) -> Path:
    """The cached Hugging Face folder for a GGUF file, converting it on first use."""
    from gguf import GGUFReader
    from safetensors.torch import save_file

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"name_or_path: GGUF file {path} does not exist")
    digest = sha256 or sha256_of(path)
    folder = cache_root() / "converted" / digest[:32]
    if (folder / "model.safetensors").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(folder.parent, "*.partial-*")  # left by interrupted conversions
    remedy = "the file is truncated or not a GGUF model: download or copy it again"
    try:
        reader = GGUFReader(str(path))
    except (ValueError, IndexError, KeyError, OSError, TypeError) as error:
        raise ArtifactError(path, f"unreadable GGUF ({brief(error)})", remedy) from None
    try:
        config = read_config(reader)  # its own ValueError names an unsupported architecture
        state = read_state_dict(reader, config, progress=f"converting {path.name} (once)")
    except (IndexError, KeyError, TypeError) as error:
        problem = f"GGUF metadata or tensors incomplete ({brief(error)})"
        raise ArtifactError(path, problem, remedy) from None
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    # Write beside the target and rename into place, so concurrent loaders never see half a
    # folder; whoever renames first wins and the other's copy is dropped. A failure or Ctrl-C
    # removes the half-written copy at once; a killed process leaves it to the next start.
    partial = folder.with_name(f"{folder.name}.partial-{partial_suffix()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=True)
        save_file(state, str(partial / "model.safetensors"))
        (partial / "config.json").write_text(json.dumps(config, indent=2))
        _save_tokenizer(path, partial)
        (partial / "source.json").write_text(json.dumps({"gguf": str(path), "sha256": digest}))
        partial.rename(folder)
    except OSError:  # another process finished first
        if not (folder / "model.safetensors").exists():
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def _save_tokenizer(path: Path, folder: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.save_pretrained(str(folder))
