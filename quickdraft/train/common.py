"""What every drafter training loop shares: its schedule and its resumable checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from quickdraft.artifacts import ArtifactError, read_checkpoint


def one_cycle(
    optimizer: torch.optim.Optimizer, lr: float, total: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """One-cycle learning rate over ``total`` steps (10% warm-up); a constant rate when there
    are too few steps for a warm-up phase."""
    if total >= 20:
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=total, pct_start=0.1)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


@dataclass
class Checkpoint:
    """A training run's state at ``path``: the module, optimizer and schedule, the history so
    far and the step reached. ``identity`` (settings and data size) must match on resume."""

    path: Path
    identity: dict
    module: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    history: list[dict] = field(default_factory=list)
    step: int = 0

    def resume(self) -> None:
        """Load the saved state, when there is one made with the same identity."""
        if not self.path.exists():
            return
        saved = read_checkpoint(self.path, "delete it to start the training over", trusted=True)
        if not isinstance(saved, dict) or not {"identity", "module", "step"} <= saved.keys():
            raise ArtifactError(self.path, "not a quickdraft training checkpoint", "delete it")
        if saved["identity"] != self.identity:
            raise ValueError(f"checkpoint: {self.path} was made with other settings or data")
        self.module.load_state_dict(saved["module"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.schedule.load_state_dict(saved["schedule"])
        self.history, self.step = saved["history"], saved["step"]

    def save(self, step: int) -> None:
        """Write the state after ``step`` steps (atomically: a temporary file, renamed)."""
        self.step = step
        state = {
            "identity": self.identity,
            "module": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "history": self.history,
            "step": step,
        }
        torch.save(state, self.path.with_suffix(".tmp"))
        self.path.with_suffix(".tmp").rename(self.path)
