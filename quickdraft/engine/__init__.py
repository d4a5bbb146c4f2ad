"""The serving engine (``Engine``: requests join and leave at any step) and the two calls
built on it for prompts at hand (``generate``, ``generate_batch``)."""

from quickdraft.engine.api import generate, generate_batch
from quickdraft.engine.core import Engine
from quickdraft.engine.requests import RequestOutput
from quickdraft.output import BatchGeneration, Generation

__all__ = [
    "BatchGeneration",
    "Engine",
    "Generation",
    "RequestOutput",
    "generate",
    "generate_batch",
]
