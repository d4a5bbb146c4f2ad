"""A draft model pruned from its target: the first decoder layers, an optional exit adapter,
then the target's own final norm and head (no weights of its own but the adapter's).

``LlamaRunner.truncated`` alone is layer skipping: an early layer's state read through the
final head. The exit adapter (residual blocks, ``drafters.medusa.ResidualBlock``) is trained by
distillation toward the full model's own next-token choices (``train.medusa.train_exit``), the
"distilled briefly" pruned draft of the tutorial's exercise 3.
"""

from __future__ import annotations

import torch
from torch import nn

from quickdraft.models.base import ModelOutput
from quickdraft.models.kv_cache import KVCache
from quickdraft.models.llama import LlamaRunner


class PrunedModel:
    def __init__(self, base: LlamaRunner, num_layers: int, adapter: nn.Module | None = None):
        self.runner = base.truncated(num_layers)
        self.adapter = None if adapter is None else adapter.eval()
        self.config = self.runner.config
        self.vocab_size = base.vocab_size
        self.max_positions = base.max_positions
        self.name: str | None = None  # not the model it was pruned from: no drafters ship for it
        self.head_weight = base.head_weight
        self.embed = base.embed
        self.int8 = base.int8
        self.device = base.device

    def new_cache(self, batch_size: int, capacity: int) -> KVCache:
        return self.runner.new_cache(batch_size, capacity)

    @torch.inference_mode()
    def body(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        tree_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        hidden, taps = self.runner.body(tokens, positions, cache, tree_mask)
        if self.adapter is not None:
            hidden = self.adapter(hidden.float()).to(hidden.dtype)
        return hidden, taps

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.runner.head(hidden)

    def with_taps(self, layers: tuple[int, ...]) -> PrunedModel:
        """The same pruned model, also returning ``layers``' outputs (of its own layers)."""
        clone = object.__new__(PrunedModel)
        clone.__dict__.update(self.__dict__)
        clone.runner = self.runner.with_taps(layers)
        return clone

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        tree_mask: torch.Tensor | None = None,
    ) -> ModelOutput:
        hidden, taps = self.body(tokens, positions, cache, tree_mask)
        with torch.inference_mode():
            logits = self.head(hidden).float()
        return ModelOutput(logits=logits, hidden=hidden, taps=taps)
