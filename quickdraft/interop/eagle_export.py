"""Export of a trained EAGLE drafter in the folder layout vLLM and SGLang load as a draft model.

The layouts follow the loaders of vLLM (``model_executor/models/llama_eagle.py``,
``llama_eagle3.py``) and SGLang (``srt/models/llama_eagle.py``, ``llama_eagle3.py``):

* EAGLE-1: ``fc.weight`` [d, 2d] over [embedding, feature], the decoder layer as
  ``layers.0.*`` without its input norm; embedding and LM head come from the target. vLLM's
  ``fc`` has no bias and rejects one; SGLang's has one, so its export adds a zero bias (or the
  drafter's own) and names the architecture ``LlamaForCausalLMEagle``. A draft vocabulary
  other than the target's in id order is written as ``token_map.pt`` (its token ids, SGLang's
  ``--speculative-token-map``), so the engine scores the rows quickdraft trained and measured;
  vLLM's EAGLE-1 has no such map and scores the whole head.
* EAGLE-3 (one folder for both): ``fc.weight`` [d, 3d], the layer as ``midlayer.*`` with
  ``input_layernorm`` (embedding) and ``hidden_norm`` (fused feature), ``norm.weight``, the
  draft vocabulary's LM head rows as ``lm_head.weight``, ``d2t`` (target id = i + d2t[i]) and
  ``t2d``; ``quickdraft_head: "target"`` in ``config.json`` marks LM head rows copied from
  the target (engines ignore the key; ``eagle_import`` reads them back as the target's). The
  fused layers: vLLM reads ``eagle_aux_hidden_state_layer_ids`` as the layers
  whose inputs it captures; SGLang reads ``eagle_config.eagle_aux_hidden_state_layer_ids``
  and adds one to each.

Neither engine runs on this project's CPU machines, so the layouts are checked against those
loaders' weight names and shapes (``tests/test_eagle.py``), not by serving them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from quickdraft.artifacts import write_safetensors
from quickdraft.drafters.eagle.net import EagleNet, EagleVariant

ENGINES = ("vllm", "sglang")
TOKEN_MAP = "token_map.pt"  # an EAGLE-1 draft vocabulary, for SGLang and for import


def export_eagle(
    net: EagleNet,
    lm_head: torch.Tensor,
    folder: str | Path,
    engine: str = "vllm",
    max_positions: int = 8192,
    choices: dict | None = None,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (fp16) into ``folder``. lm_head: the
    target's LM head weight [V, d] (EAGLE-3 stores its draft vocabulary's rows). ``choices``:
    the drafter's own run settings (its ``eagle.json``'s ``tree`` and ``lookup``), kept under
    ``config.json``'s ``quickdraft`` key (engines ignore it), so the export read back with
    ``--eagle-dir`` drafts as the original did."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    config = net.config
    eagle3 = config.variant is EagleVariant.EAGLE3
    state = {name: t.detach().half() for name, t in net.state_dict().items()}
    prefix = "midlayer." if eagle3 else "layers.0."
    weights = {}
    for name, tensor in state.items():
        if name.startswith("layers.0."):
            weights[prefix + name[len("layers.0.") :]] = tensor
        elif name.startswith(("fc.", "norm.")):
            weights[name] = tensor
    record = {
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": False,  # SGLang would tie the head to the embedding
        "torch_dtype": "float16",
    }
    if eagle3:
        # The network's own row order (d2t maps any order; EAGLE's own sorts ascending): the
        # rows keep their places, so an import scores them in the same order, bit for bit.
        vocab = net.draft_vocab
        if config.own_head:
            weights["lm_head.weight"] = net.lm_head.weight.detach().half().contiguous()
        else:
            weights["lm_head.weight"] = lm_head[vocab].half().contiguous()
            record["quickdraft_head"] = "target"
        weights["d2t"] = vocab - torch.arange(vocab.numel())
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[vocab] = True
        weights["t2d"] = t2d
        layers = list(config.feature_layers)
        record |= {
            "architectures": ["LlamaForCausalLMEagle3"],
            "draft_vocab_size": int(vocab.numel()),
            "target_hidden_size": config.hidden_size,
            "eagle_aux_hidden_state_layer_ids": layers,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers]},
        }
    elif engine == "sglang":
        if not config.fc_bias:
            weights["fc.bias"] = torch.zeros(config.hidden_size, dtype=torch.float16)
        record["architectures"] = ["LlamaForCausalLMEagle"]
    else:
        if config.fc_bias:
            raise ValueError("engine: vLLM's EAGLE-1 has no fc bias; export for sglang")
        record["architectures"] = ["LlamaForCausalLM"]  # vLLM maps it to its EAGLE model
    if choices:
        record["quickdraft"] = dict(choices)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    identity = torch.equal(net.draft_vocab.cpu(), torch.arange(config.vocab_size))
    if not eagle3 and not identity:  # a subset, or the whole vocabulary in another order
        torch.save(net.draft_vocab.clone(), folder / TOKEN_MAP)  # row order kept
    else:  # an earlier export's map would be read back as this drafter's vocabulary
        (folder / TOKEN_MAP).unlink(missing_ok=True)
    write_safetensors(folder / "model.safetensors", weights)
    (folder / "config.json").write_text(json.dumps(record, indent=2) + "\n")
    return folder
