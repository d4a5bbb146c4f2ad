"""quickdraft: exact speculative decoding for language models."""

from quickdraft.config import AcceptRule, Method, SamplingParams, SpecConfig
from quickdraft.engine import (
    BatchGeneration,
    Engine,
    Generation,
    RequestOutput,
    generate,
    generate_batch,
)
from quickdraft.models.loading import from_transformers, load_model

__all__ = [
    "AcceptRule",
    "BatchGeneration",
    "Engine",
    "Generation",
    "Method",
    "RequestOutput",
    "SamplingParams",
    "SpecConfig",
    "from_transformers",
    "generate",
    "generate_batch",
    "load_model",
]
__version__ = "0.1.0"
