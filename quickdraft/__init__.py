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

__all__ = [
    "AcceptRule",
    "BatchGeneration",
    "Engine",
    "Generation",
    "Method",
    "RequestOutput",
    "SamplingParams",
    "SpecConfig",
    "generate",
    "generate_batch",
]
__version__ = "0.1.0"
