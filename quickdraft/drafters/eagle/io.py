"""An EAGLE drafter's files: its network's weights and config, saved and loaded with checks
that name the file, and the folders shipped for known targets (``drafters.eagle`` drafts)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from quickdraft import artifacts
from quickdraft.artifacts import load_state, read_json, read_safetensors, write_safetensors
from quickdraft.config import MAX_DRAFT_TOKENS
from quickdraft.drafters.base import shipped_folder
from quickdraft.drafters.eagle.net import EagleConfig, EagleNet
from quickdraft.drafters.eagle.tree import DEFAULT_LOOKUP, DynamicTree, EagleTree
from quickdraft.vocab.choice import FULL, ShortlistChoice

CONFIG_FILE = "eagle.json"
WEIGHTS_FILE = "eagle.safetensors"
ARTIFACTS = Path(__file__).parent / "artifacts"
REMEDY = "retrain the drafter (quickdraft train eagle) or copy the folder again"


# The per-row scale of a matrix stored in int8 (``save_eagle(int8=True)``), beside it.
SCALE_SUFFIX = ".int8_scale"


def save_eagle(
    folder: str | Path, net: EagleNet, metadata: dict | None = None, *, int8: bool = False
) -> None:
    """The network's weights (fp16, its draft vocabulary as int64) and config. ``int8``: its
    matrices in int8 with an fp16 scale per row (half the file; the CPU drafter runs them in
    int8 per row anyway, ``drafter_int8``), the norms in fp16: how a drafter too large for
    the repository's artifact budget ships."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in net.state_dict().items():
        tensor = tensor.detach()
        if name == "draft_vocab":
            state[name] = tensor
        elif int8 and tensor.dim() == 2:
            scale = (tensor.float().abs().amax(1) / 127).clamp_min(1e-12).half()
            codes = (tensor.float() / scale.float().unsqueeze(1)).round().clamp(-127, 127)
            state[name], state[name + SCALE_SUFFIX] = codes.to(torch.int8), scale
        else:
            state[name] = tensor.half()
    write_safetensors(folder / WEIGHTS_FILE, state)
    record = {"config": net.config.to_dict(), **(metadata or {})}
    (folder / CONFIG_FILE).write_text(json.dumps(record, indent=2) + "\n")


def read_eagle_config(folder: str | Path) -> EagleConfig:
    """The drafter's config alone (no weights), for describing it."""
    folder = Path(folder)
    if not (folder / CONFIG_FILE).exists() and (folder / "config.json").exists():
        from quickdraft.interop.eagle_import import import_config

        return import_config(folder, num_target_layers=64)  # the layers do not matter here
    if not (folder / CONFIG_FILE).exists():
        raise ValueError(f"eagle_dir: {folder} holds no {CONFIG_FILE}")
    record = read_json(folder / CONFIG_FILE, REMEDY, required=("config",))
    return artifacts.build(folder / CONFIG_FILE, REMEDY, EagleConfig, record["config"])


def load_eagle(folder: str | Path, num_target_layers: int | None = None) -> EagleNet:
    """A drafter saved by quickdraft (``eagle.json``), or an EAGLE-1/EAGLE-3 folder in the
    layout vLLM and SGLang load (``config.json`` and ``model.safetensors``: exported by
    ``quickdraft export eagle`` or trained elsewhere; ``eagle_import``).
    ``num_target_layers``: the target's depth, for EAGLE-3 checkpoints that name no fused
    layers (the engines' default 2, L/2, L-3)."""
    folder = Path(folder)
    if not (folder / CONFIG_FILE).exists() and (folder / "config.json").exists():
        from quickdraft.interop.eagle_import import import_eagle

        return import_eagle(folder, num_target_layers)
    if not (folder / CONFIG_FILE).exists() or not (folder / WEIGHTS_FILE).exists():
        raise ValueError(
            f"eagle_dir: {folder} holds neither {CONFIG_FILE} and {WEIGHTS_FILE} (quickdraft's) "
            "nor config.json (vLLM's and SGLang's layout)"
        )
    record = read_json(folder / CONFIG_FILE, REMEDY, required=("config",))
    net = EagleNet(artifacts.build(folder / CONFIG_FILE, REMEDY, EagleConfig, record["config"]))
    state = read_safetensors(folder / WEIGHTS_FILE, REMEDY)
    state = _dequantized(folder / WEIGHTS_FILE, state)
    state = {k: v if k == "draft_vocab" else v.float() for k, v in state.items()}
    load_state(folder / WEIGHTS_FILE, net, state, REMEDY)
    vocab = state.get("draft_vocab")
    if vocab is not None and len(vocab) and int(vocab.max()) >= net.config.vocab_size:
        raise artifacts.ArtifactError(
            folder / WEIGHTS_FILE, "draft_vocab holds ids past the config's vocab_size", REMEDY
        )
    return net.eval()


def _dequantized(path: Path, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """int8 matrices (``save_eagle(int8=True)``) times their row scales; the rest as read. An
    int8 matrix without a scale of one per row, or a scale without its matrix, names the
    file."""
    out = {k: v for k, v in state.items() if not k.endswith(SCALE_SUFFIX)}
    for name in [k for k in state if k.endswith(SCALE_SUFFIX)]:
        if name[: -len(SCALE_SUFFIX)] not in out:
            raise artifacts.ArtifactError(path, f"{name} scales no matrix", REMEDY)
    for name, tensor in out.items():
        if tensor.dtype != torch.int8:
            continue
        scale = state.get(name + SCALE_SUFFIX)
        if scale is None or tensor.dim() != 2 or scale.shape != tensor.shape[:1]:
            raise artifacts.ArtifactError(path, f"{name} is int8 without a scale per row", REMEDY)
        out[name] = tensor.float() * scale.float().unsqueeze(1)
    return out


def with_full_vocabulary(net: EagleNet) -> EagleNet:
    """The same network scoring every row of the target's head (EAGLE-2's arrangement): its
    draft vocabulary was the rows it trained on, and since those rows are the target's own,
    its states rank the others too. The head is then most of the drafter's step on a large
    vocabulary, which is what a shortlist (``SpecConfig.draft_shortlist``) cuts."""
    if net.config.own_head:
        raise ValueError("eagle_dir: this drafter scores an LM head of its own, not the target's")
    full = EagleNet(replace(net.config, draft_vocab_size=net.config.vocab_size))
    state = {**net.state_dict(), "draft_vocab": torch.arange(net.config.vocab_size)}
    full.load_state_dict(state)
    return full.eval()


def offered_by_auto(folder: str | Path) -> bool:
    """Whether ``--method auto`` may choose this shipped drafter: ``"auto": false`` in its
    ``eagle.json`` holds it back (its card says why) until a bench shows it beats the other
    methods for its target; ``--method eagle`` uses it either way."""
    path = Path(folder) / CONFIG_FILE
    if not path.exists():
        return False
    offered = read_json(path, REMEDY, required=("config",)).get("auto", True)
    if not isinstance(offered, bool):
        raise artifacts.ArtifactError(path, "'auto' must be true or false", REMEDY)
    return offered


def shipped_shortlist(folder: str | Path) -> ShortlistChoice:
    """The head shortlist this drafter runs with when none is asked for: ``"shortlist"`` in
    its ``eagle.json`` (a kind of ``--shortlist``, whose artifacts are the folder's
    ``shortlist/``), set where a bench measured it faster than the full head; else the full
    head."""
    path = Path(folder) / CONFIG_FILE
    if not path.exists():
        return FULL
    text = read_json(path, REMEDY, required=("config",)).get("shortlist", "full")
    try:
        return ShortlistChoice.parse(text)
    except ValueError as error:
        raise artifacts.ArtifactError(
            path, f"'shortlist' must be a shortlist such as dyna-pa:4 ({error})", REMEDY
        ) from None


RUN_CHOICES = ("tree", "lookup")  # what an export carries of a drafter's eagle.json


def run_choices(folder: str | Path) -> dict:
    """The run settings a drafter's folder names (``RUN_CHOICES``): from its ``eagle.json``,
    or from ``config.json``'s ``quickdraft`` key in a folder ``export eagle`` wrote (engines
    ignore the key); {} where there are none."""
    folder = Path(folder)
    if (folder / CONFIG_FILE).exists():
        record = read_json(folder / CONFIG_FILE, REMEDY, required=("config",))
    elif (folder / "config.json").exists():
        record = read_json(folder / "config.json", REMEDY).get("quickdraft", {})
        if not isinstance(record, dict):
            raise artifacts.ArtifactError(
                folder / "config.json", "'quickdraft' must be an object", REMEDY
            )
    else:
        return {}
    return {key: record[key] for key in RUN_CHOICES if key in record}


def _choices_file(folder: str | Path) -> Path:
    """The file ``run_choices`` reads (for the errors that name it)."""
    own = Path(folder) / CONFIG_FILE
    return own if own.exists() else Path(folder) / "config.json"


def shipped_tree(folder: str | Path, device: str) -> DynamicTree | None:
    """The tree this drafter grows on ``device`` ("cpu", "cuda") when none is asked for:
    ``"tree": {"cpu": "DEPTH,TOPK,TOKENS[,MIN_PROB]"}`` in its ``eagle.json``, set where a
    sweep on calibration prompts measured it faster than the device's default
    (``benchmarks/eagle_tree_sweep.py``); None: the device's default."""
    path = _choices_file(folder)
    trees = run_choices(folder).get("tree", {})
    if not isinstance(trees, dict):
        raise artifacts.ArtifactError(path, "'tree' must map a device to a tree", REMEDY)
    text = trees.get(device)
    if text is None:
        return None
    try:
        return DynamicTree.parse(text)
    except (TypeError, ValueError) as error:
        raise artifacts.ArtifactError(path, f"'tree' for {device}: {error}", REMEDY) from None


def shipped_lookup(folder: str | Path) -> int | None:
    """The prompt-lookup tokens this drafter grafts onto its trees when ``eagle_lookup`` is
    not given: ``"lookup"`` in its ``eagle.json``, measured with its tree; None: the
    default (``tree.DEFAULT_LOOKUP``)."""
    path = _choices_file(folder)
    lookup = run_choices(folder).get("lookup")
    if lookup is not None and (
        isinstance(lookup, bool) or not isinstance(lookup, int) or lookup < 0
    ):
        raise artifacts.ArtifactError(path, "'lookup' must be an integer >= 0", REMEDY)
    return lookup


def tree_choice(
    asked: EagleTree, lookup: int | None, folder: str | Path, device: str
) -> tuple[DynamicTree, int]:
    """The tree and grafted lookup tokens a drafter runs with: those asked for (the ``tree``
    and ``eagle_lookup`` options), else its own (``shipped_tree``, ``shipped_lookup``), else
    the device's defaults. One rule for the Python API, the command line, the server and
    the launch commands of other engines. A ValueError when the two exceed one verify pass."""
    tree = asked.shape or shipped_tree(folder, device) or asked.resolve(device)
    if lookup is None:
        lookup = shipped_lookup(folder)
    lookup = DEFAULT_LOOKUP if lookup is None else lookup
    if tree.tokens + lookup > MAX_DRAFT_TOKENS:
        raise ValueError(
            f"tree: {tree.tokens} tokens plus eagle_lookup {lookup} exceed the "
            f"{MAX_DRAFT_TOKENS} tokens of one verify pass"
        )
    return tree, lookup


def shortlist_choice(asked: ShortlistChoice | None, folder: str | Path) -> ShortlistChoice:
    """The head shortlist a drafter runs with: the one asked for (the ``draft_shortlist``
    option), else its own (``shipped_shortlist``). One rule for the Python API, the command
    line and the server."""
    return shipped_shortlist(folder) if asked is None else asked


def eagle_folder(target_name: str | None, folder: str | Path | None = None) -> Path:
    """The explicit folder, else the drafter shipped for ``target_name``."""
    return shipped_folder(ARTIFACTS, target_name, folder, "eagle_dir", "EAGLE drafters, eagle")
