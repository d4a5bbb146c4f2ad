"""quickdraft: exact speculative decoding for language models.

The names below load on first use (PEP 562), so that ``import quickdraft.config`` stays light:
importing a configuration loads no model code and no drafter.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quickdraft.config import AcceptRule, Method, SamplingParams, SpecConfig
    from quickdraft.drafters.registry import make_spec
    from quickdraft.engine import (
        BatchGeneration,
        Engine,
        Generation,
        RequestOutput,
        generate,
        generate_batch,
    )
    from quickdraft.models.loading import from_transformers, load_model

_HOMES = {
    "AcceptRule": "quickdraft.config",
    "Method": "quickdraft.config",
    "SamplingParams": "quickdraft.config",
    "SpecConfig": "quickdraft.config",
    "make_spec": "quickdraft.drafters.registry",
    "BatchGeneration": "quickdraft.engine",
    "Engine": "quickdraft.engine",
    "Generation": "quickdraft.engine",
    "RequestOutput": "quickdraft.engine",
    "generate": "quickdraft.engine",
    "generate_batch": "quickdraft.engine",
    "from_transformers": "quickdraft.models.loading",
    "load_model": "quickdraft.models.loading",
}

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
    "make_spec",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'quickdraft' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
