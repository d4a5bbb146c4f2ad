"""GGUF files to Hugging Face-layout folders: config.json, model.safetensors and the tokenizer.

transformers' GGUF loader reads the file: the config, every tensor dequantized to float32 by
the ``gguf`` package, under Hugging Face's names, with llama.cpp's q/k rotary permutation
undone. It reads every architecture transformers does; Llama-family ones then run on the
native runner, the others on the transformers adapter. The result is cached under
``$QUICKDRAFT_CACHE`` (default ``~/.cache/quickdraft``), keyed by the file's sha256, so each
file is converted once.

transformers' loader is slower than the hand-written tables it replaced (SmolLM2-135M Q4_1:
about 20 s against 7 s, once per file: it builds its name map once per submodule and parses
the metadata twice); the tensors are bitwise the same, and one mapping to maintain is worth
that once-per-file cost.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from quickdraft.artifacts import ArtifactError, brief, partial_suffix, remove_stale_partials


def cache_root() -> Path:
    return Path(os.environ.get("QUICKDRAFT_CACHE", Path.home() / ".cache" / "quickdraft"))


def sha256_of(path: Path, chunk: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_checkpoint(path: Path) -> tuple[Any, dict[str, torch.Tensor]]:
    """The transformers config and the float32 state dict (Hugging Face names) of a GGUF
    file, read by transformers' own GGUF loader: its name map and its inverse of llama.cpp's
    q/k permutation, for every architecture it reads. A model skeleton on the meta device
    gives the loader the names to map to without allocating weights."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    config.architectures = [type(skeleton).__name__]
    parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)
    state = {name: tensor.float().contiguous() for name, tensor in parsed["tensors"].items()}
    missing = set(skeleton.state_dict()) - set(state)
    if config.tie_word_embeddings:
        missing.discard("lm_head.weight")
    if missing:
        raise KeyError(f"no tensor for {sorted(missing)[0]}")
    return config, state


def converted_folder(sha256: str) -> Path:
    """Where ``convert`` puts (or finds) the Hugging Face folder of the GGUF with this
    digest."""
    return cache_root() / "converted" / sha256[:32]


def convert(path: Path, *, sha256: str | None = None) -> Path:
    """The cached Hugging Face folder for a GGUF file, converting it on first use."""
    from gguf import GGUFReader
    from safetensors.torch import save_file

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"name_or_path: GGUF file {path} does not exist")
    digest = sha256 or sha256_of(path)
    folder = converted_folder(digest)
    if (folder / "model.safetensors").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(folder.parent, "*.partial-*")  # left by interrupted conversions
    remedy = "the file is truncated or not a GGUF model: download or copy it again"
    try:
        GGUFReader(str(path))
    except (ValueError, IndexError, KeyError, OSError, TypeError) as error:
        raise ArtifactError(path, f"unreadable GGUF ({brief(error)})", remedy) from None
    from rich.console import Console

    Console(stderr=True, soft_wrap=True).print(f"converting {path.name} once, into {folder}")
    try:
        config, state = read_checkpoint(path)
    except (IndexError, KeyError, TypeError, AttributeError) as error:
        problem = f"GGUF metadata or tensors incomplete ({brief(error)})"
        raise ArtifactError(path, problem, remedy) from None
    except (ValueError, NotImplementedError) as error:  # an architecture transformers lacks
        raise ValueError(f"{path}: {brief(error)}") from None
    # Write beside the target and rename into place, so concurrent loaders never see half a
    # folder; whoever renames first wins and the other's copy is dropped. A failure or Ctrl-C
    # removes the half-written copy at once; a killed process leaves it to the next start.
    partial = folder.with_name(f"{folder.name}.partial-{partial_suffix()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=True)
        save_file(state, str(partial / "model.safetensors"))
        config.save_pretrained(str(partial))
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
