"""Medusa's heads (Cai et al. 2024): residual blocks on the target's final hidden state, one
stack per head, scored by the target's LM head or a head of their own; saved and loaded with
checks that name the file, and the heads shipped for known targets."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from quickdraft import artifacts
from quickdraft.artifacts import load_state, read_json, read_safetensors, write_safetensors
from quickdraft.config import show_value
from quickdraft.drafters.base import shipped_folder

CONFIG_FILE = "medusa.json"
WEIGHTS_FILE = "medusa.safetensors"
ARTIFACTS = Path(__file__).parent / "artifacts"


@dataclass(frozen=True, slots=True)
class MedusaConfig:
    hidden_size: int
    vocab_size: int
    num_heads: int = 3
    num_layers: int = 1
    own_head: bool = False

    def __post_init__(self) -> None:
        for name in ("hidden_size", "vocab_size", "num_heads", "num_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {show_value(value)}")


class ResidualBlock(nn.Module):
    """x + SiLU(W x + b), W and b zero at initialisation (the identity)."""

    def __init__(self, size: int):
        super().__init__()
        self.linear = nn.Linear(size, size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` independent heads. ``forward(h [.., d])`` -> their states [.., H, d];
    ``logits(states, lm_head)`` -> [.., H, V] with the target's head weight [V, d] or their own.
    """

    def __init__(self, config: MedusaConfig, lm_head: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        # Held-out accuracy of each head's r-th candidate, when known (set by training / load).
        self.rank_accuracy: list[list[float]] | None = None
        # The tokens the heads were trained to rank (``train_vocab``), None for the whole
        # vocabulary. Drafting then scores these rows only, as in training.
        self.vocab: torch.Tensor | None = None
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResidualBlock(config.hidden_size) for _ in range(config.num_layers)))
            for _ in range(config.num_heads)
        )
        self.lm_heads: nn.ModuleList | None = None
        if config.own_head:
            if lm_head is None:
                raise ValueError("lm_head: heads of their own start from the target's head weight")
            self.lm_heads = nn.ModuleList(
                nn.Linear(config.hidden_size, config.vocab_size, bias=False)
                for _ in range(config.num_heads)
            )
            for head in self.lm_heads:
                head.weight.data.copy_(lm_head[: config.vocab_size])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.stack([block(hidden) for block in self.blocks], dim=-2)

    def logits(self, states: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        """states [.., H, d] -> logits [.., H, V] (training; inference packs the head)."""
        if self.lm_heads is None:
            return F.linear(states, lm_head)
        return torch.stack(
            [head(states[..., i, :]) for i, head in enumerate(self.lm_heads)], dim=-2
        )


def save_heads(folder: str | Path, heads: MedusaHeads, metadata: dict | None = None) -> None:
    """The heads' weights (fp16) and config; ``metadata`` (e.g. training settings) goes into
    the config file too."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        name: tensor.detach().half().contiguous() for name, tensor in heads.state_dict().items()
    }
    if heads.vocab is not None:
        state["vocab"] = heads.vocab.long().contiguous()
    write_safetensors(folder / WEIGHTS_FILE, state)
    record = {"config": asdict(heads.config), **(metadata or {})}
    (folder / CONFIG_FILE).write_text(json.dumps(record, indent=2) + "\n")


def read_heads_config(folder: str | Path) -> MedusaConfig:
    """The heads' config alone (no weights), for describing them."""
    folder = Path(folder)
    remedy = "retrain the heads (quickdraft train medusa) or copy the folder again"
    record = read_json(folder / CONFIG_FILE, remedy, required=("config",))
    return artifacts.build(folder / CONFIG_FILE, remedy, MedusaConfig, record["config"])


def load_heads(folder: str | Path) -> MedusaHeads:
    folder = Path(folder)
    if not (folder / CONFIG_FILE).exists() or not (folder / WEIGHTS_FILE).exists():
        raise ValueError(f"medusa_dir: {folder} holds no {CONFIG_FILE} and {WEIGHTS_FILE}")
    remedy = "retrain the heads (quickdraft train medusa) or copy the folder again"
    record = read_json(folder / CONFIG_FILE, remedy, required=("config",))
    config = artifacts.build(folder / CONFIG_FILE, remedy, MedusaConfig, record["config"])
    # Heads of their own are overwritten by the file: any starting weight will do.
    placeholder = torch.zeros(config.vocab_size, config.hidden_size) if config.own_head else None
    heads = MedusaHeads(config, placeholder)
    state = read_safetensors(folder / WEIGHTS_FILE, remedy)
    heads.vocab = state.pop("vocab", None)
    if heads.vocab is not None and (heads.vocab.dim() != 1 or heads.vocab.dtype.is_floating_point):
        raise artifacts.ArtifactError(folder / WEIGHTS_FILE, "vocab is not a list of ids", remedy)
    if heads.vocab is not None and len(heads.vocab) and int(heads.vocab.max()) >= config.vocab_size:
        raise artifacts.ArtifactError(
            folder / WEIGHTS_FILE, f"vocab holds ids past vocab_size {config.vocab_size}", remedy
        )
    load_state(folder / WEIGHTS_FILE, heads, {k: t.float() for k, t in state.items()}, remedy)
    heads.rank_accuracy = record.get("rank_accuracy")
    return heads.eval()


def heads_folder(target_name: str | None, folder: str | Path | None = None) -> Path:
    """The explicit folder, else the heads shipped for ``target_name``."""
    return shipped_folder(ARTIFACTS, target_name, folder, "medusa_dir", "Medusa heads, medusa")
