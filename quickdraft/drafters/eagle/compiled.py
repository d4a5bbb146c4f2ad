"""The draft layer's pass in one compiled call, where its products are on a compiled path.

A pass of the layer in PyTorch is about 40 small operations (the q/k/v products one by one,
rotary, the cache write, the mask, attention, the output product, the norm, the MLP): on
SmolLM2-135M's AVX2 code 0.67 ms of a draft level's 0.96, its products 0.15 of them. The
target's layers already run in one call (``models.fused``); the draft layer is one of them
with its own attention input: EAGLE-1's fc output as it is (no input norm), EAGLE-3's normed
embedding and feature side by side. ``decoder_layers`` reads that input in place of the normed
state, which stays the residual. Its numbers are not the PyTorch layer's bit for bit (the
norm's and exponential's orders): drafts only, which the target verifies.

    layer = CompiledLayer.of(net, packed_net)   # None unless every product is compiled
    output = layer.run(cache, attn_input, residual, positions, ancestors, offset)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from quickdraft.drafters.eagle.net import EagleNet, rotary
from quickdraft.models.attention import SlotGroups
from quickdraft.models.fused import Stack, usable
from quickdraft.models.kv_cache import KVCache
from quickdraft.models.ops import draft_linear


@dataclass(frozen=True, slots=True)
class _Layer:
    """What ``Stack.of`` reads of a decoder layer. The attention norm is never applied (the
    attention input is given), so it is ones."""

    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    qkv: object
    o: object
    gate_up: object
    down: object


@dataclass(frozen=True, slots=True)
class CompiledLayer:
    stack: Stack
    heads: int
    eps: float
    inv_freq: torch.Tensor

    @classmethod
    def of(cls, net: EagleNet, packed: EagleNet) -> CompiledLayer | None:
        """The layer of ``net`` (its trained form) in the stacked layout: q/k/v and gate/up
        joined and quantized as ``draft_linear`` quantizes, the output and down products
        those of ``packed`` (``ops.packed_copy`` of it, quantized); None where a product is
        not on a compiled path (no compiled kernels, float drafters, another device)."""
        layer, used = net.layers[0], packed.layers[0]
        attn, mlp = layer.self_attn, layer.mlp
        if any(p.bias is not None for p in (attn.q_proj, attn.k_proj, attn.v_proj)):
            return None
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        size = net.config.hidden_size
        norm = layer.post_attention_layernorm.weight.detach().float().contiguous()
        stacked = _Layer(
            attn_norm=torch.ones(size),
            mlp_norm=norm,
            qkv=draft_linear(qkv, quantize=True),
            o=used.self_attn.o_proj.linear,
            gate_up=draft_linear(gate_up, quantize=True),
            down=used.mlp.down_proj.linear,
        )
        stack = Stack.of([stacked])
        if stack is None:
            return None
        config = net.config
        return cls(stack, config.num_heads, config.rms_norm_eps, net.inv_freq.float())

    def run(
        self,
        cache: KVCache,
        attn_input: torch.Tensor,
        residual: torch.Tensor,
        positions: torch.Tensor,
        ancestors: torch.Tensor,
        offset: int,
    ) -> torch.Tensor | None:
        """One pass for T new entries per row, written at scratch slots offset..offset+T-1
        past each row's committed length: attn_input [B, T, w], residual [B, T, d],
        positions [B, T], ancestors [T, offset + T] (the scratch entries each sees; the
        committed ones always) -> the layer's outputs [B, T, d]; None where the cache or
        inputs are not what the call takes (the caller runs the PyTorch layer)."""
        # The call adds into x in place: one copy, contiguous.
        x = residual.float().clone(memory_format=torch.contiguous_format)
        if not usable(cache, x):
            return None
        lengths = cache.lengths
        write = lengths.unsqueeze(1) + offset + torch.arange(x.shape[1])  # [B, T]
        cos, sin = rotary(positions, self.inv_freq)  # [B, 1, T, D]
        flat = attn_input.float().reshape(-1, attn_input.shape[-1]).contiguous()
        out, _ = self.stack.run(
            x, cos.squeeze(1), sin.squeeze(1), cache, write, tree_slots(lengths, ancestors),
            self.heads, self.eps, (), attn_input=flat,
        )  # fmt: skip
        return out


def tree_slots(lengths: torch.Tensor, ancestors: torch.Tensor) -> SlotGroups:
    """The slots each of T new entries per row reads (``attention.flat_slots``' table): the
    row's committed ones, then the scratch entries ``ancestors`` [T, S] marks, written from
    lengths[b] on. What ``seen_slots(prefix_tree_mask(...))`` finds, built on the host from
    the few entries a pass has (the mask and its search in tensors were a fifth of a draft
    level's time on SmolLM2-135M)."""
    lens = lengths.tolist()  # host sync: the table is built on the host
    seen = [np.flatnonzero(row) for row in ancestors.cpu().numpy()]
    num, batch = len(seen), len(lens)
    counts = np.array([[length + len(s) for s in seen] for length in lens], dtype=np.int64)
    slots = np.zeros((batch * num, int(counts.max())), dtype=np.int64)
    for b, length in enumerate(lens):
        block = slots[b * num : (b + 1) * num]
        block[:, :length] = np.arange(length)
        for t, scratch in enumerate(seen):
            block[t, length : length + len(scratch)] = length + scratch
    rows = np.repeat(np.arange(batch, dtype=np.int64), num)
    queries = np.tile(np.arange(num, dtype=np.int64), batch)
    groups = SlotGroups()
    groups.flat = tuple(
        torch.from_numpy(part) for part in (rows, queries, slots, counts.reshape(-1))
    )  # type: ignore[assignment]
    return groups
