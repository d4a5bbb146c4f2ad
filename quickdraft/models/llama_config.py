"""The shape of a Llama-family model (Llama, Mistral, Qwen2, SmolLM2) read from its Hugging
Face config, and its rotary frequencies."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_positions: int
    tie_word_embeddings: bool
    attention_bias: bool
    rope_scaling: dict | None = None
    sliding_window: int | None = None

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> LlamaConfig:
        """From a Hugging Face config.json dictionary."""
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not a Llama-family model; native "
                f"support covers {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        heads = config["num_attention_heads"]
        hidden = config["hidden_size"]
        # transformers >= 5 folds rope_theta and rope_scaling into rope_parameters.
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        theta = config.get("rope_theta") or rope.get("rope_theta", 10000.0)
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"} or None
        if scaling is not None and scaling.get("rope_type", scaling.get("type")) == "default":
            scaling = None
        window = config.get("sliding_window") if config.get("use_sliding_window", True) else None
        return cls(
            model_type=model_type,
            vocab_size=config["vocab_size"],
            hidden_size=hidden,
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or hidden // heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            max_positions=config.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(config.get("attention_bias", model_type == "qwen2")),
            rope_scaling=scaling,
            sliding_window=window,
        )


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq.float()
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return (inv_freq / scaling["factor"]).float()
    if kind == "llama3":  # Llama 3.1: smooth interpolation between low and high frequencies
        factor, low, high = (
            scaling["factor"],
            scaling["low_freq_factor"],
            scaling["high_freq_factor"],
        )
        original = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (original / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
        middle = (wavelen <= original / low) & (wavelen >= original / high)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return torch.where(middle, blended, scaled).float()
    raise ValueError(f"rope_scaling type {kind!r} is not supported (default, linear, llama3)")
