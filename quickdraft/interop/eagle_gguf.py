"""Export of a trained EAGLE-3 drafter as a GGUF file llama.cpp loads as an ``eagle3`` draft.

The layout follows llama.cpp's own converter and loader (``conversion/llama.py``,
``src/models/eagle3.cpp``, ``src/llama-arch.cpp``, ``gguf-py/gguf/constants.py`` of the
llama.cpp inside llama-cpp-python 0.3.36):

* architecture ``eagle3``: the usual Llama keys under ``eagle3.*`` (one block), plus
  ``eagle3.target_layers`` (the three target layers whose *inputs* it fuses: llama.cpp turns on
  ``llama_set_embeddings_layer_inp`` for each, the numbering of ``EagleConfig.feature_layers``
  and of vLLM's ``eagle_aux_hidden_state_layer_ids``), ``eagle3.target_hidden_size`` and
  ``eagle3.norm_before_residual`` (False: the fused feature itself is the residual, as in
  quickdraft's layer);
* tensors: ``fc.weight``; ``blk.0.attn_norm`` (the embedding's norm), ``blk.0.attn_norm_2``
  (the fused feature's ``hidden_norm``), ``blk.0.attn_{q,k,v,output}`` over twice the hidden
  width, ``blk.0.ffn_{norm,gate,up,down}``, ``output_norm``; the query and key rows permuted
  as llama.cpp's converter does, because its ``eagle3`` graph rotates adjacent pairs (rope
  type NORM) where Hugging Face's Llama rotates halves;
* the draft vocabulary: ``output.weight`` holds the rows the drafter scores (the target's LM
  head rows, or its own head) and ``d2t`` (int64) their *absolute* target ids; a drafter that
  scores the whole vocabulary in the target's order writes neither and reads the target's
  head, as llama.cpp's Llama 3.1 EAGLE-3 does. The token embedding is always the target's
  (llama.cpp reads it from the target's context).
* the tokenizer: copied key by key from the target's own GGUF (``tokenizer.*``), since a draft
  has to share the target's vocabulary and llama.cpp loads the vocabulary from each file.

Matrices are written in fp16, norms in fp32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from quickdraft.drafters.eagle.net import EagleNet, EagleVariant

ARCH = "eagle3"
FILE = "eagle3-draft.gguf"  # the file in an export folder
TENSORS = {  # quickdraft's layer names -> llama.cpp's
    "fc.weight": "fc.weight",
    "norm.weight": "output_norm.weight",
    "layers.0.input_layernorm.weight": "blk.0.attn_norm.weight",
    "layers.0.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "layers.0.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "layers.0.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "layers.0.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "layers.0.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "layers.0.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "layers.0.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "layers.0.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "layers.0.mlp.down_proj.weight": "blk.0.ffn_down.weight",
}


def pair_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a query or key projection reordered from rotate-half to adjacent pairs: in each
    head, row 2i is row i and row 2i + 1 is row i + D/2 (llama.cpp's converter's ``permute``)."""
    rows, columns = weight.shape
    return (
        weight.reshape(heads, 2, rows // heads // 2, columns).transpose(1, 2).reshape(rows, columns)
    )


def half_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of ``pair_rows``."""
    rows, columns = weight.shape
    return (
        weight.reshape(heads, rows // heads // 2, 2, columns).transpose(1, 2).reshape(rows, columns)
    )


def target_vocabulary(path: Path) -> tuple[list, dict[str, int]]:
    """The ``tokenizer.*`` fields of the target's GGUF and the shape facts the export checks
    (``tokens``, ``embedding_length``, ``block_count``); ValueError naming ``target_gguf``."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"target_gguf: {path} is not a readable GGUF file ({err})") from None
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None or "tokenizer.ggml.tokens" not in reader.fields:
        raise ValueError(f"target_gguf: {path} has no architecture or no tokenizer")
    arch = arch_field.contents()
    facts = {"tokens": len(reader.fields["tokenizer.ggml.tokens"].contents())}
    for key in ("embedding_length", "block_count"):
        field = reader.fields.get(f"{arch}.{key}")
        if field is None:
            raise ValueError(f"target_gguf: {path} has no {arch}.{key}")
        facts[key] = int(field.contents())
    fields = [f for name, f in reader.fields.items() if name.startswith("tokenizer.")]
    return fields, facts


def export_eagle_gguf(
    net: EagleNet,
    lm_head: torch.Tensor,
    target_gguf: str | Path,
    path: str | Path,
    max_positions: int = 8192,
) -> Path:
    """Write ``net`` (EAGLE-3) to ``path`` for llama.cpp. lm_head: the target's LM head weight
    [V, d] (the rows a drafter without its own head scores); target_gguf: the target's GGUF,
    whose vocabulary the file carries."""
    import gguf

    config = net.config
    if config.variant is not EagleVariant.EAGLE3:
        raise ValueError("engine: llama.cpp loads EAGLE-3 drafters only (this one is EAGLE-1)")
    fields, facts = target_vocabulary(Path(target_gguf))
    if facts["tokens"] != config.vocab_size:
        raise ValueError(
            f"target_gguf: {target_gguf} has {facts['tokens']:,} tokens, the drafter was "
            f"trained for a vocabulary of {config.vocab_size:,}"
        )
    if facts["embedding_length"] != config.hidden_size:
        raise ValueError(
            f"target_gguf: {target_gguf} has hidden size {facts['embedding_length']}, the "
            f"drafter reads features of {config.hidden_size}"
        )
    if max(config.feature_layers) >= facts["block_count"]:
        raise ValueError(
            f"target_gguf: {target_gguf} has {facts['block_count']} layers, the drafter fuses "
            f"layer {max(config.feature_layers)}"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), ARCH)
    writer.add_name("quickdraft EAGLE-3 drafter")
    writer.add_context_length(max_positions)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(1)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_array(f"{ARCH}.target_layers", [int(i) for i in config.feature_layers])
    writer.add_uint32(f"{ARCH}.target_hidden_size", config.hidden_size)
    writer.add_bool(f"{ARCH}.norm_before_residual", False)
    writer.add_bool(f"{ARCH}.norm_before_fc", False)
    for field in fields:
        _copy_field(writer, field)

    state = net.state_dict()
    for name, out in TENSORS.items():
        tensor = state[name].detach().float()
        if name.endswith("q_proj.weight"):
            tensor = pair_rows(tensor, config.num_heads)
        elif name.endswith("k_proj.weight"):
            tensor = pair_rows(tensor, config.num_kv_heads)
        dtype = np.float32 if tensor.dim() == 1 else np.float16
        writer.add_tensor(out, tensor.numpy().astype(dtype))
    vocab = net.draft_vocab.long()
    identity = vocab.numel() == config.vocab_size and bool(
        torch.equal(vocab, torch.arange(config.vocab_size))
    )
    if config.own_head or not identity:
        head = net.lm_head.weight if config.own_head else lm_head[vocab]
        writer.add_tensor("output.weight", head.detach().float().numpy().astype(np.float16))
        writer.add_tensor(
            "d2t", vocab.numpy().astype(np.int64), raw_dtype=gguf.GGMLQuantizationType.I64
        )
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    partial.replace(path)
    return path


def _copy_field(writer, field) -> None:
    """One key-value field of another GGUF, with its own types."""
    import gguf

    kind = field.types[0]
    if kind is gguf.GGUFValueType.ARRAY:
        writer.add_key_value(field.name, field.contents(), kind, sub_type=field.types[-1])
    else:
        writer.add_key_value(field.name, field.contents(), kind)
