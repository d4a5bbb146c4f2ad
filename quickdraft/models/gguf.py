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
import struct
from pathlib import Path
from typing import Any

import numpy as np
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
        source = {"gguf": str(path.resolve()), "sha256": digest, "size": path.stat().st_size}
        (partial / "source.json").write_text(json.dumps(source))
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


# Hugging Face's projection names to llama.cpp's, for the tensors read as blocks.
_BLOCK_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


class BlockSource:
    """The Q4_K and Q6_K tensors of the GGUF file a converted folder came from, as the 4-bit
    kernel's codes (``kernels.superblock.SuperCodes``), read from the file's blocks: the
    file's own integers and float16 factors, which the float weights of the converted folder
    are the dequantization of (``Linear.quantize_q4`` checks that before it takes them). A
    Q4_K_M file then loads without fitting codes to its floats again (the 1.5B's took three
    minutes) and every record keeps the file's float16 factors (fewer bytes a token). The
    file is opened at the first ``codes`` call: a load that finds its quantized weights
    stored never reads it."""

    def __init__(self, path: Path, tied: bool):
        self.path = path
        self.tied = tied
        self._tensors: dict[str, Any] | None = None

    @classmethod
    def of(cls, folder: Path, tied: bool) -> BlockSource | None:
        """The source of a converted ``folder`` (its ``source.json``), or None where there is
        none, its path is not absolute, or its file is gone or of another size than the one
        converted (the float weights are then quantized as they are)."""
        try:
            source = json.loads((Path(folder) / "source.json").read_text())
            path = Path(source["gguf"])
            if not path.is_absolute() or not path.is_file():
                return None
            size = source.get("size")
            if size is not None and path.stat().st_size != size:
                return None
            return cls(path, tied)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def _tensor(self, name: str) -> Any:
        if self._tensors is None:
            from gguf import GGUFReader

            try:
                self._tensors = {t.name: t for t in GGUFReader(str(self.path)).tensors}
            except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
                self._tensors = {}  # unreadable now: every layer is fitted instead
        return self._tensors.get(name)

    def codes(self, name: str) -> Any:
        """The codes of the Hugging Face weight ``name`` (``model.layers.3.mlp.up_proj.weight``,
        ``lm_head.weight``), or None where its tensor is not Q4_K or Q6_K."""
        from gguf import GGMLQuantizationType

        tensor = self._tensor(self._gguf_name(name) or "")
        if tensor is None:
            return None
        kinds = {GGMLQuantizationType.Q4_K: q4_k_codes, GGMLQuantizationType.Q6_K: q6_k_codes}
        decode = kinds.get(tensor.tensor_type)
        if decode is None:
            return None
        rows, inner = int(tensor.shape[1]), int(tensor.shape[0])  # GGUF lists columns first
        if inner % 256:
            return None
        try:
            return decode(np.asarray(tensor.data).reshape(rows * inner // 256, -1), rows, inner)
        except ValueError:  # not the blocks its header says: fitted instead
            return None

    def _gguf_name(self, name: str) -> str | None:
        if name == "lm_head.weight":
            return "token_embd.weight" if self.tied else "output.weight"
        parts = name.split(".")
        if len(parts) != 6 or parts[:2] != ["model", "layers"] or parts[-1] != "weight":
            return None
        short = _BLOCK_NAMES.get(".".join(parts[3:5]))
        return None if short is None else f"blk.{parts[2]}.{short}.weight"


def q4_k_codes(blocks: np.ndarray, rows: int, inner: int) -> Any:
    """Q4_K blocks [n, 144] (d, dmin float16, 12 bytes of 6-bit scales and minimums, 128 of
    codes) as superblock codes: w = d * sc * q - dmin * m = d * sc * q + dmin * (-m)."""
    from gguf.quants import Q4_K

    from quickdraft.kernels import superblock

    _check_blocks(blocks, 144, rows, inner, "Q4_K")
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(
        1, 1, 2, 1
    )
    q = (qs & np.uint8(15)).reshape(rows, inner)
    supers = inner // 256
    return superblock.SuperCodes(
        torch.from_numpy(np.ascontiguousarray(q)),
        torch.from_numpy(sc.astype(np.uint8).reshape(rows, supers * 8)),
        torch.from_numpy((-m.astype(np.int16)).astype(np.int8).reshape(rows, supers * 8)),
        torch.from_numpy(d.reshape(rows, supers)),
        torch.from_numpy(dmin.reshape(rows, supers)),
    )


def q6_k_codes(blocks: np.ndarray, rows: int, inner: int) -> Any:
    """Q6_K blocks [n, 210] (128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales,
    d float16) as the superblock Q6_K form: w = d * sc * (q - 32), q in 0..63."""
    from quickdraft.kernels import superblock

    _check_blocks(blocks, 210, rows, inner, "Q6_K")
    ql = blocks[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(
        1, 1, 2, 1
    )
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(
        1, 1, 4, 1
    )
    q = (ql & np.uint8(15)).reshape(-1, 256) | ((qh & np.uint8(3)).reshape(-1, 256) << np.uint8(4))
    sc = blocks[:, 192:208].copy().view(np.int8)
    d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)
    supers = inner // 256
    sc_t = torch.from_numpy(np.ascontiguousarray(sc).reshape(rows, supers * 16))
    d_t = torch.from_numpy(d.reshape(rows, supers))
    return superblock.SuperCodes(
        torch.from_numpy(np.ascontiguousarray(q).reshape(rows, inner)),
        sc_t,
        sc_t,
        d_t,
        d_t * -superblock.Q6K_OFFSET,
        bits=6,
        sub=superblock.Q6K_SUB,
    )


def _check_blocks(blocks: np.ndarray, width: int, rows: int, inner: int, kind: str) -> None:
    if blocks.shape != (rows * inner // 256, width):
        raise ValueError(
            f"{kind} blocks: expected {rows * inner // 256} of {width} bytes for a "
            f"{rows} x {inner} tensor, got {tuple(blocks.shape)}"
        )
