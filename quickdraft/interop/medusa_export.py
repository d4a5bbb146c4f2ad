"""Export of Medusa heads in the folder layout vLLM loads as a Medusa draft model.

The layout follows vLLM's loader (``model_executor/models/medusa.py`` and its
``transformers_utils/configs/medusa.py``): ``config.json`` with ``model_type: "medusa"``,
``architectures: ["MedusaModel"]``, ``num_heads``, ``num_hidden_layers``, ``vocab_size`` and
``truncated_vocab_size``; ``model.safetensors`` with each head's residual blocks as
``blocks.{h}.layers.{l}.weight``/``.bias`` (x + SiLU(W x + b), ``medusa_fc_bias``), each head's
LM head rows as ``lm_heads.{h}.weight`` (the target's rows for heads that score them, or their
own) and, for heads trained on a frequent-token vocabulary, ``token_map`` (the ids of those
rows). SGLang has no Medusa. vLLM was not run here (no GPU): the names and shapes are checked
against its loader's (``tests/test_interop_launch.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from quickdraft.artifacts import write_safetensors
from quickdraft.drafters.medusa.net import MedusaHeads


def export_medusa(heads: MedusaHeads, lm_head: torch.Tensor, folder: str | Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (fp16) into ``folder``. lm_head: the
    target's LM head weight [V, d] (for heads that score the target's rows)."""
    config = heads.config
    rows = heads.vocab.long() if heads.vocab is not None else None
    weights: dict[str, torch.Tensor] = {}
    for h, block in enumerate(heads.blocks):
        for layer, residual in enumerate(block):
            weights[f"blocks.{h}.layers.{layer}.weight"] = residual.linear.weight.detach()
            weights[f"blocks.{h}.layers.{layer}.bias"] = residual.linear.bias.detach()
        if heads.lm_heads is not None:
            own = heads.lm_heads[h].weight.detach()
            weights[f"lm_heads.{h}.weight"] = own if rows is None else own[rows]
        else:
            target = lm_head[: config.vocab_size]
            weights[f"lm_heads.{h}.weight"] = target if rows is None else target[rows]
    weights = {name: tensor.half().contiguous() for name, tensor in weights.items()}
    if rows is not None:
        weights["token_map"] = rows.contiguous()
    record = {
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "num_heads": config.num_heads,
        "num_hidden_layers": config.num_layers,
        "truncated_vocab_size": int(rows.numel()) if rows is not None else config.vocab_size,
        "medusa_fc_bias": True,
        "original_lm_head": False,
        "torch_dtype": "float16",
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "model.safetensors", weights)
    (folder / "config.json").write_text(json.dumps(record, indent=2) + "\n")
    return folder
