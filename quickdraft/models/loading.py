"""``load_model``: a name or path to a ready Model and its tokenizer.

Accepted: an alias (``smollm2-135m``, the default model; ``qwen2.5-coder-0.5b``/``-1.5b``), a GGUF
file, a local Hugging Face folder (config.json + safetensors), or a hub id where a hub is
reachable (``models.sources`` finds the files). Llama-family weights run on the native runner;
anything else on the transformers adapter.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from quickdraft.artifacts import (
    ArtifactError,
    brief,
    read_json,
    read_safetensors,
)
from quickdraft.models import gguf, quantized
from quickdraft.models import int8 as int8_ops
from quickdraft.models.base import Model
from quickdraft.models.llama import SUPPORTED_MODEL_TYPES, LlamaConfig, LlamaRunner
from quickdraft.models.sources import ALIASES, resolve
from quickdraft.models.tokenizer import HFTokenizer

DEFAULT_MODEL = "smollm2-135m"
QUANTS = ("int8", "q4")
# One INFO record per loading stage; the command line prints them to stderr, a library caller
# sees them only if it configures logging.
log = logging.getLogger("quickdraft.load")


def load_model(
    name_or_path: str | Path = DEFAULT_MODEL,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    backend: str = "auto",
    tap_layers: tuple[int, ...] = (),
    int8: bool = False,
    int8_fallback: bool = True,
    quant: str | None = None,
) -> tuple[Model, HFTokenizer]:
    """Load a model and its tokenizer.

    backend: "auto" (native for Llama-family weights, else transformers), "native" or "hf".
    tap_layers: decoder layers whose outputs the native runner returns in ``taps``.
    int8: int8 weights on the native CPU runner, for draft models (see ``models.int8``). The
    int8 model is compared with its float original on a fixed probe at load; if it agrees on
    fewer than 95% of top-1 tokens, ``int8_fallback`` loads float weights instead with a
    one-line warning (a draft), else raises ValueError (a model that must not drift).
    quant: keeps a model's weights quantized whatever its role, a target included: "q4"
    (4-bit weights with int8 activations, ``kernels.superblock``: the compiled kernel this CPU runs,
    else PyTorch) or "int8" (8-bit weights on the same kernel), checked like int8 drafts. A failed
    check raises. Speculation is then exact with respect to the quantized model (its own
    plain decoding), as it is for any target: every token gets the same logits in a verify
    pass as in a one-token step.
    """
    # A quantized target runs on quickdraft's own kernel (``kernels.superblock``): 4-bit codes, or
    # 8-bit ones for int8. Both give a token the same bits in any pass on every host; the
    # fbgemm int8 layers (``int8=True``) stay for drafts, where that does not matter.
    q4 = quant is not None
    if quant is not None:
        if quant not in QUANTS:
            raise ValueError(f"quant: {quant!r} is not offered ({', '.join(QUANTS)})")
        if torch.device(device).type != "cpu":
            raise ValueError(f"quant: {quant} weights run on CPU kernels, not on {device}")
        int8, int8_fallback = False, False
    if backend not in ("auto", "native", "hf"):
        raise ValueError(f"backend must be auto, native or hf, got {backend!r}")
    _check_device(device)
    started = time.perf_counter()
    folder = resolve(name_or_path)
    remedy = _remedy(name_or_path, folder)
    config = read_json(folder / "config.json", remedy, required=("model_type",))
    _check_config(folder, remedy)
    native = config.get("model_type") in SUPPORTED_MODEL_TYPES
    weights = sorted(folder.glob("*.safetensors"))
    if not native or backend == "hf":
        weights += sorted(folder.glob("pytorch_model*.bin"))
    if not weights:
        raise ArtifactError(folder, "holds no weights (*.safetensors)", remedy)
    tokenizer = _tokenizer(folder, config, remedy)
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise ArtifactError(
            folder,
            f"its tokenizer has {len(tokenizer):,} tokens, more than the {vocab:,} rows of "
            "the model's embedding (config.json vocab_size): the two do not belong together",
            remedy,
        )
    if backend == "native" and not native:
        raise ValueError(
            f"backend: model_type {config.get('model_type')!r} has no native "
            f"runner ({', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if backend == "hf" or not native:
        if int8 or q4:
            field = "quant" if quant else "int8"
            raise ValueError(f"{field}: only the native runner has quantized weights")
        return _hf_model(folder, dtype, device), tokenizer
    log.info("loading %s: reading weights from %s", name_or_path, folder)
    state: dict[str, torch.Tensor] = {}
    for shard in weights:
        state.update(read_safetensors(shard, remedy))
    if not state:
        raise ValueError(f"name_or_path: no safetensors weights in {folder}")
    try:
        LlamaConfig.from_hf(config)
    except (KeyError, TypeError) as error:
        raise ArtifactError(folder / "config.json", f"lacks {error}", remedy) from None
    calibration = probe = None
    exact = (folder / "source.json").is_file()  # converted from a GGUF file
    tied = bool(config.get("tie_word_embeddings"))
    blocks = gguf.BlockSource.of(folder, tied) if q4 and exact else None
    if int8 or q4:
        calibration = torch.tensor(tokenizer.encode(int8_ops.CALIBRATION_TEXT))
        probe = torch.tensor(tokenizer.encode(int8_ops.PROBE_TEXT))
    stored = (
        None if quant is None else quantized.cache_path(weights, quant, exact, blocks is not None)
    )
    if quant is not None:
        how = "from the store" if stored.exists() else "once, then stored"
        log.info("loading %s: %s layers (quantized %s) and their check", name_or_path, quant, how)
    elif int8:
        log.info("loading %s: int8 layers and their check", name_or_path)
    try:
        runner = LlamaRunner.from_state_dict(
            config,
            state,
            dtype=dtype,
            device=device,
            tap_layers=tap_layers,
            int8=int8,
            calibration=calibration,
            probe=probe,
            invariant=quant is not None,
            q4=q4,
            q4_exact=exact,
            q4_bits=8 if quant == "int8" else 4,
            quantized_cache=stored,
            q4_source=blocks,
        )
    except KeyError as error:
        raise ArtifactError(folder, f"lacks the weight {error}", remedy) from None
    except RuntimeError as error:  # a weight whose shape disagrees with config.json
        problem = f"weights do not fit config.json ({brief(error)})"
        raise ArtifactError(folder, problem, remedy) from None
    check = runner.quant_check
    if check is not None and not check.passed:
        if not int8_fallback:
            field = "quant" if quant else "int8"
            raise ValueError(
                f"{field}: {name_or_path} quantized fails its check: {check.describe()}"
            )
        warnings.warn(
            f"int8: {name_or_path} quantized fails its check ({check.describe()}); "
            "using float weights",
            Int8FallbackWarning,
            stacklevel=2,
        )
        runner = LlamaRunner.from_state_dict(
            config, state, dtype=dtype, device=device, tap_layers=tap_layers
        )
    log.info("loaded %s in %.1f s", name_or_path, time.perf_counter() - started)
    return _named(runner, name_or_path), tokenizer


def from_transformers(
    model: Any, *, shared: bool = True, tap_layers: tuple[int, ...] = ()
) -> LlamaRunner:
    """A Llama-family transformers model as the native runner, so EAGLE, Medusa, trees and
    batched decoding work on it: a model object (sharing its weights by default, see
    ``LlamaRunner.from_transformers``) or a Hugging Face folder (loaded natively)."""
    if isinstance(model, (str, Path)):
        runner, _ = load_model(model, backend="native", tap_layers=tap_layers)
        assert isinstance(runner, LlamaRunner)
        return runner
    return LlamaRunner.from_transformers(model, shared=shared, tap_layers=tap_layers)


def _check_device(device: str | torch.device) -> None:
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        raise ValueError(f"device: {device!r} is not a device (cpu, cuda, cuda:1, mps)") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device} is not available (this torch has no usable CUDA GPU)")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device: {device} is not available on this machine")


def _remedy(name_or_path: str | Path, folder: Path) -> str:
    """What to do about a bad file in ``folder``: a converted cache entry is rebuilt once
    deleted; a user's folder has to be re-saved."""
    if folder.is_relative_to(gguf.cache_root()):
        return f"delete {folder} and load {name_or_path} again to rebuild it"
    return "re-save the model folder (config.json, *.safetensors and tokenizer files)"


class Int8FallbackWarning(UserWarning):
    """An int8 draft model disagreed with its float original and was loaded in float."""


def _named(runner: LlamaRunner, name_or_path: str | Path) -> LlamaRunner:
    """Remember the alias a model came from: it finds the drafters shipped for it."""
    runner.name = str(name_or_path) if str(name_or_path) in ALIASES else None
    return runner


def _check_config(folder: Path, remedy: str) -> None:
    """config.json as transformers reads it: its own validation (a hidden size that is not a
    multiple of the heads, say) becomes one error naming the file."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(str(folder))
    except Exception as error:
        raise ArtifactError(
            folder / "config.json", f"is not valid ({brief(error)})", remedy
        ) from None


def _tokenizer(folder: Path, config: dict[str, Any], remedy: str) -> HFTokenizer:
    from transformers import AutoTokenizer

    eos = config.get("eos_token_id")
    generation = folder / "generation_config.json"
    if generation.exists():
        eos = json.loads(generation.read_text()).get("eos_token_id", eos)
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    try:
        hf = AutoTokenizer.from_pretrained(str(folder))
    except (ValueError, OSError, KeyError, TypeError) as error:
        raise ArtifactError(folder, f"has no usable tokenizer ({brief(error)})", remedy) from None
    return HFTokenizer(hf, eos_ids)


def _hf_model(folder: Path, dtype: torch.dtype, device: str | torch.device) -> Model:
    from transformers import AutoModelForCausalLM

    from quickdraft.models.hf import HFModel

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).to(device)
    return HFModel(model)
