"""DynaSpec's router: a small MLP that scores token clusters before the drafter's head runs.

Its input is [embedding of x_t, the drafter's hidden state at t-1], both known before the
drafter's body processes x_t, so the router can run beside the body. Its M outputs rank the
clusters the next token may come from.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from quickdraft.artifacts import build, load_state, read_json, read_safetensors, write_safetensors
from quickdraft.models.ops import Linear


@dataclass(frozen=True, slots=True)
class RouterConfig:
    hidden_size: int  # the drafter's d; the input is 2d wide
    num_clusters: int
    width: int = 512

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_clusters", "width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class Router(nn.Module):
    def __init__(self, config: RouterConfig):
        super().__init__()
        self.config = config
        self.norm = nn.LayerNorm(2 * config.hidden_size)
        self.up = nn.Linear(2 * config.hidden_size, config.width)
        self.out = nn.Linear(config.width, config.num_clusters)
        self.inputs = "hidden"  # what H_{t-1} it was trained on (see ``save``)

    def forward(self, embedding: torch.Tensor, prev_hidden: torch.Tensor) -> torch.Tensor:
        """Cluster scores [..., M] from embedding and prev_hidden [..., d]."""
        x = self.norm(torch.cat([embedding, prev_hidden], dim=-1))
        return self.out(F.gelu(self.up(x)))

    def packed(self) -> PackedRouter:
        """A frozen copy for decoding, its first product prepacked like the drafter's layers."""
        return PackedRouter(self)

    def save(self, folder: str | Path, inputs: str = "hidden") -> None:
        """``inputs``: what its H_{t-1} was: "hidden" (a model's final hidden state: a draft
        model's, or the target's for Medusa) or "eagle" (an EAGLE drafter's features)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        record = {**asdict(self.config), "inputs": inputs}
        (folder / "router.json").write_text(json.dumps(record, indent=2) + "\n")
        state = {name: t.detach().half().contiguous() for name, t in self.state_dict().items()}
        write_safetensors(folder / "router.safetensors", state)

    @classmethod
    def load(cls, folder: str | Path) -> Router:
        folder = Path(folder)
        if not (folder / "router.json").exists():
            raise ValueError(f"router: no router.json in {folder}")
        remedy = "retrain the router (quickdraft train router) or copy the folder again"
        fields = read_json(folder / "router.json", remedy)
        inputs = fields.pop("inputs", "hidden")  # files before it was recorded: hidden states
        router = cls(build(folder / "router.json", remedy, RouterConfig, fields))
        router.inputs = inputs
        weights = folder / "router.safetensors"
        state = read_safetensors(weights, remedy)
        load_state(weights, router, {n: t.float() for n, t in state.items()}, remedy)
        return router.eval()


class PackedRouter:
    """A router frozen for decoding: the same function as ``Router.forward``, with its first
    product prepacked (``ops.Linear``: oneDNN on CPU, float32, exact up to rounding). The
    router runs at every draft level, a few rows at a time, where the module's plain
    ``F.linear`` reads its 3.7 MB first layer at about twice the packed kernel's cost
    (``benchmarks/results/defaults.md``)."""

    def __init__(self, router: Router):
        norm = router.norm
        self.norm_shape, self.eps = norm.normalized_shape, norm.eps
        self.norm_weight, self.norm_bias = norm.weight.detach(), norm.bias.detach()
        self.up = Linear(router.up.weight.detach().clone(), router.up.bias.detach().clone())
        # The M-wide output product stays a plain F.linear: prepacked, so small a product
        # costs more than it computes (benchmarks/results/defaults.md).
        self.out_weight = router.out.weight.detach().clone()
        self.out_bias = router.out.bias.detach().clone()

    def __call__(self, embedding: torch.Tensor, prev_hidden: torch.Tensor) -> torch.Tensor:
        x = torch.cat([embedding, prev_hidden], dim=-1)
        x = F.layer_norm(x, self.norm_shape, self.norm_weight, self.norm_bias, self.eps)
        return F.linear(F.gelu(self.up(x)), self.out_weight, self.out_bias)
