"""Any transformers ``AutoModelForCausalLM`` behind the quickdraft ``Model`` protocol.

For architectures the native runner does not cover. The cache is transformers' own
``DynamicCache``: rollback crops it to the committed length before each forward. One row at a
time and chains only (no tree masks); the native runner is the fast path.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from quickdraft.models.base import Cache, ModelOutput


class HFCache(Cache):
    def __init__(self, capacity: int, hf_cache: Any):
        super().__init__(1, capacity)
        self.hf_cache = hf_cache

    def _narrow_buffers(self, start: int, count: int) -> None:
        if (start, count) != (0, 1):
            raise ValueError("the Hugging Face adapter's cache holds one row")


class HFModel:
    def __init__(self, model: Any):
        self.model = model.eval()
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 20))
        self.name: str | None = None
        self.device = torch.device("cpu")  # outputs come back to the host
        # transformers 5.x renames past_key_values to cache; support both.
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"

    def new_cache(self, batch_size: int, capacity: int) -> HFCache:
        from transformers import DynamicCache

        if batch_size != 1:
            raise ValueError(
                "batch_size: the Hugging Face adapter runs one row at a time; "
                "use the native runner for batches"
            )
        return HFCache(capacity, DynamicCache(config=self.model.config))

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: Cache,
        tree_mask: torch.Tensor | None = None,
    ) -> ModelOutput:
        if tree_mask is not None:
            raise ValueError("tree_mask: the Hugging Face adapter verifies chains only")
        if not isinstance(cache, HFCache):
            raise ValueError(f"cache must be an HFCache, got {type(cache).__name__}")
        cache.slots_for(tokens.shape[1])  # capacity check
        surplus = cache.hf_cache.get_seq_length() - int(cache.lengths[0])
        if surplus > 0:
            cache.hf_cache.crop(-surplus)  # a negative count removes that many from the end
        device = self.model.device
        out = self.model(
            input_ids=tokens.to(device),
            position_ids=positions.to(device),
            **{self._cache_argument: cache.hf_cache},
            use_cache=True,
            output_hidden_states=True,
        )
        return ModelOutput(logits=out.logits.float().cpu(), hidden=out.hidden_states[-1].cpu())
