"""EAGLE drafters in the layouts vLLM and SGLang load, read into quickdraft's network.

The inverse of ``eagle_export``, and the way in for drafters trained elsewhere:

* EAGLE-3 (``architectures`` naming Eagle3): ``fc.weight`` [d, 3d], the layer as ``midlayer.*``
  (or ``layers.0.*``) with ``input_layernorm`` and ``hidden_norm``, ``norm.weight``, an LM head
  over the draft vocabulary (``lm_head.weight`` [N, d]) and ``d2t`` (row i scores target id
  i + d2t[i]); ``t2d`` is checked against it. The fused layers: vLLM's
  ``eagle_aux_hidden_state_layer_ids`` (the layers whose inputs are captured, quickdraft's
  ``feature_layers``), else SGLang's ``eagle_config.eagle_aux_hidden_state_layer_ids`` (one
  less each), else the engines' default 2, L/2, L-3 of the ``num_target_layers`` given.
* EAGLE-1: ``fc.weight`` [d, 2d] with or without ``fc.bias``, the layer as ``layers.0.*``
  without its input norm; the target's LM head scores a draft vocabulary from
  ``token_map.pt`` (hot token ids, SGLang's ``--speculative-token-map``) when the folder has
  one, else the whole vocabulary.

* The ``speculators`` layout (``speculators_model_type: "eagle3"``): the layer's shape in
  ``transformer_layer_config``, ``draft_vocab_size`` and ``eagle_aux_hidden_state_layer_ids``
  at the top (vLLM's meaning), weights as EAGLE-3's with ``layers.0.*``. A drafter whose
  residual is taken after the norm (``norm_before_residual``) is refused: quickdraft's layer
  adds the raw feature.

Embedding weights in a checkpoint are not read: the drafter uses the target's. A folder
exported by quickdraft says in ``quickdraft_head`` that its LM head rows are the target's own,
so the imported drafter scores the target's rows as the original did (same drafts).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from quickdraft.artifacts import ArtifactError, read_json, read_safetensors
from quickdraft.drafters.eagle.net import EagleConfig, EagleNet, EagleVariant
from quickdraft.interop.eagle_export import TOKEN_MAP

REMEDY = "export the drafter again, or check the folder is an EAGLE draft model"
_LAYER_PREFIXES = ("midlayer.", "layers.0.", "model.layers.0.")


def import_config(folder: Path, num_target_layers: int | None = None) -> EagleConfig:
    """The drafter's config from ``config.json`` (no weights read)."""
    path = folder / "config.json"
    record = read_json(path, REMEDY)
    if "speculators_model_type" in record:
        if record["speculators_model_type"] != "eagle3":
            raise ArtifactError(
                path, f"is a {record['speculators_model_type']!r} speculator", "only eagle3 is read"
            )
        # vLLM reads a missing norm_before_residual as True: only an explicit False is ours.
        if record.get("norm_before_residual", True):
            raise ArtifactError(path, "takes its residual after the norm (norm_before_residual "
                                "true or absent, as vLLM reads it)",
                                "quickdraft's EAGLE-3 layer adds the raw feature")  # fmt: skip
        extra = [k for k in ("norm_before_fc", "fc_norm", "norm_output") if record.get(k)]
        if extra:
            raise ArtifactError(
                path, f"sets {', '.join(extra)}", "quickdraft's layer has no such norm"
            )
        layer = record.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise ArtifactError(path, "has no transformer_layer_config", REMEDY)
        record = {**layer, **{k: v for k, v in record.items() if k != "transformer_layer_config"},
                  "architectures": ["Eagle3Speculator"]}  # fmt: skip
    names = " ".join(record.get("architectures") or [])
    eagle3 = "eagle3" in names.lower() or "draft_vocab_size" in record
    hidden = _field(record, path, "hidden_size")
    heads = _field(record, path, "num_attention_heads")
    vocab = _field(record, path, "vocab_size")
    layers: tuple[int, ...] = ()
    if eagle3:
        if record.get("eagle_aux_hidden_state_layer_ids"):
            layers = _layer_ids(record["eagle_aux_hidden_state_layer_ids"], path, 0)
        elif (record.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"):
            ids = record["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
            layers = _layer_ids(ids, path, 1)
        elif num_target_layers is not None:
            total = num_target_layers
            layers = (2, total // 2, total - 3)
        else:
            raise ArtifactError(path, "names no fused layers (eagle_aux_hidden_state_layer_ids)",
                                "add them, as vLLM reads them")  # fmt: skip
    intermediate = _field(record, path, "intermediate_size")
    try:  # _number's and EagleConfig's own checks name the field
        return EagleConfig(
            variant=EagleVariant.EAGLE3 if eagle3 else EagleVariant.EAGLE1,
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_heads=heads,
            num_kv_heads=_number(record, "num_key_value_heads", heads, int),
            head_dim=_number(record, "head_dim", hidden // heads, int),
            vocab_size=vocab,
            draft_vocab_size=_number(record, "draft_vocab_size", vocab, int),
            rms_norm_eps=_number(record, "rms_norm_eps", 1e-5, float),
            rope_theta=_number(record, "rope_theta", 10000.0, float),
            feature_layers=layers,
            own_head=eagle3 and record.get("quickdraft_head") != "target",
            fc_bias=False,
        )
    except ValueError as error:
        raise ArtifactError(path, f"has invalid settings ({error})", REMEDY) from None


def _number(record: dict, name: str, default: float, kind: type) -> Any:
    """``record[name]`` as ``kind`` (``default`` where it is absent, or a null or 0 integer
    size, as engines' configs write "the usual"); a ValueError naming it where it is not a
    number (a string, true, a null float)."""
    value = record.get(name, default)
    if kind is int and not value:
        value = default
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if kind is int and value != int(value):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return kind(value)


def _layer_ids(ids: object, path: Path, offset: int) -> tuple[int, ...]:
    """Fused layer numbers as a config lists them, plus ``offset`` (SGLang's count from 0)."""
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise ArtifactError(path, f"eagle_aux_hidden_state_layer_ids must be layer numbers, "
                                  f"got {ids!r}", REMEDY)  # fmt: skip
    return tuple(i + offset for i in ids)


def _field(record: dict, path: Path, name: str) -> int:
    value = record.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ArtifactError(path, f"has no positive integer {name}", REMEDY)
    return value


def import_eagle(folder: str | Path, num_target_layers: int | None = None) -> EagleNet:
    folder = Path(folder)
    weights_path = folder / "model.safetensors"
    if not weights_path.exists():
        raise ValueError(f"eagle_dir: {folder} has config.json but no model.safetensors")
    config = import_config(folder, num_target_layers)
    weights = read_safetensors(weights_path, REMEDY)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        for prefix in _LAYER_PREFIXES:
            if name.startswith(prefix):
                state["layers.0." + name[len(prefix) :]] = tensor.float()
                break
        else:
            if name in ("fc.weight", "fc.bias", "norm.weight"):
                state[name] = tensor.float()
    if "fc.bias" in state:
        if config.variant is EagleVariant.EAGLE3:
            raise ArtifactError(weights_path, "has an fc.bias, which EAGLE-3 does not", REMEDY)
        if bool(state["fc.bias"].any()):
            config = EagleConfig(**{**config.to_dict(), "fc_bias": True})
        else:  # a zero bias (SGLang's layout of a drafter without one) is no bias
            del state["fc.bias"]
    if config.variant is EagleVariant.EAGLE3:
        vocab = _eagle3_vocab(weights, config, weights_path)
        if config.own_head:
            if "lm_head.weight" not in weights:
                raise ArtifactError(weights_path, "has no lm_head.weight", REMEDY)
            state["lm_head.weight"] = weights["lm_head.weight"].float()
    else:
        vocab = _token_map(folder, config)
        config = EagleConfig(**{**config.to_dict(), "draft_vocab_size": int(vocab.numel())})
    net = EagleNet(config)
    state["draft_vocab"] = vocab
    missing = set(net.state_dict()) - set(state)
    if missing:
        raise ArtifactError(weights_path, f"lacks {', '.join(sorted(missing))}", REMEDY)
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as error:  # shapes that do not match the config
        first = str(error).splitlines()[-1].strip()
        raise ArtifactError(weights_path, f"does not match config.json ({first})", REMEDY) from None
    return net.eval()


def _eagle3_vocab(weights: dict, config: EagleConfig, path: Path) -> torch.Tensor:
    """Target ids of the draft vocabulary's rows: i + d2t[i] (no d2t: the first N ids)."""
    rows = torch.arange(config.draft_vocab_size)
    if "d2t" not in weights:
        if config.draft_vocab_size != config.vocab_size:
            raise ArtifactError(path, "has a draft vocabulary but no d2t map", REMEDY)
        return rows
    d2t = weights["d2t"].long().flatten()
    if d2t.numel() != config.draft_vocab_size:
        size = config.draft_vocab_size  # a null or absent one reads as vocab_size, as vLLM's
        raise ArtifactError(
            path, f"has a d2t map of {d2t.numel()} rows where config.json's draft_vocab_size "
            f"(null or absent: its vocab_size) is {size}", REMEDY,
        )  # fmt: skip
    vocab = rows + d2t
    if int(vocab.min()) < 0 or int(vocab.max()) >= config.vocab_size:
        raise ArtifactError(path, "d2t maps rows outside the vocabulary", REMEDY)
    if "t2d" in weights:
        t2d = weights["t2d"].bool()
        if (
            t2d.numel() != config.vocab_size
            or not bool(t2d[vocab].all())
            or int(t2d.sum()) != vocab.numel()
        ):
            raise ArtifactError(path, "t2d disagrees with d2t", REMEDY)
    return vocab


def _token_map(folder: Path, config: EagleConfig) -> torch.Tensor:
    path = folder / TOKEN_MAP
    if not path.exists():
        return torch.arange(config.vocab_size)
    try:
        ids = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ArtifactError(path, f"cannot be read ({type(error).__name__})", REMEDY) from None
    ids = torch.as_tensor(ids).long().flatten()
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size:
        raise ArtifactError(path, "holds ids outside the vocabulary", REMEDY)
    return ids
