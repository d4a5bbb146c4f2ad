"""A quantized model's decoder layers in one compiled call (``kernels/layer.cpp``).

A Python decoder layer costs about 40 small PyTorch operations. With the quantized products at
the memory rate, those were a quarter of Qwen2.5-Coder-1.5B's decode step (11.4 of 48.9 ms) and
most of SmolLM2-135M's (``benchmarks/results/step_profile.md``). ``decoder_layers`` runs every
layer of a pass in C++: norms, products, rotary, the cache write, attention, SiLU and the
residuals, each token's row by itself, so it is batch-invariant like the kernels (a token's
hidden state is the same bits whatever else the pass holds). Its numbers are not the Python
layers' bit for bit (its norm sums and exponential have their own order), so a model runs one
or the other for all its passes: ``LlamaRunner.fuse``.

    stack = Stack.of(runner.layers)     # None unless every projection is on a compiled path
    x, taps = stack.run(...)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft import kernels
from quickdraft.kernels import superblock
from quickdraft.models.attention import flat_slots
from quickdraft.models.kv_cache import KVCache
from quickdraft.models.ops import parts_of


@dataclass(frozen=True, slots=True)
class Stack:
    """The arguments ``decoder_layers`` takes for a run of layers: per layer its two norms and
    four products' packed parts (most products have one; ``ops.StackedWeights`` more), their
    biases, and per product its part count, then per part (layout, out, in, bits,
    sub-block, half records)."""

    weights: list[torch.Tensor]
    biases: list[torch.Tensor | None]
    spec: list[int]
    path: int
    layers: int

    @classmethod
    def of(cls, layers: list) -> Stack | None:
        """The stack of ``layers`` (``llama._Layer``), or None where a projection is not on a
        compiled quantized path (float, int8, the PyTorch reference) or a norm is not float32
        on CPU."""
        weights, biases, spec, paths = [], [], [], set()
        for layer in layers:
            norms = [layer.attn_norm, layer.mlp_norm]
            if any(n.dtype != torch.float32 or n.device.type != "cpu" for n in norms):
                return None
            weights += [n.contiguous() for n in norms]
            for linear in (layer.qkv, layer.o, layer.gate_up, layer.down):
                quant = getattr(linear, "quantized_weights", None)
                if quant is None:
                    return None
                parts = parts_of(quant)
                spec.append(len(parts))
                for part in parts:
                    if part.packed is None:
                        return None
                    weights.append(part.packed)
                    biases.append(part.bias)
                    layout = 0 if isinstance(part, superblock.SuperWeights) else 1
                    sub = getattr(part, "sub", superblock.GROUP)
                    half = int(getattr(part, "half", False))
                    spec += [layout, part.out_features, part.in_features, part.bits, sub, half]
                    paths.add(part.path)
        if len(paths) != 1:
            return None
        return cls(weights, biases, spec, kernels.PATHS[paths.pop()], len(layers))

    def run(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        write: torch.Tensor,
        groups: list,
        heads: int,
        eps: float,
        taps: tuple[int, ...],
        attn_input: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """x [B, T, d] (the embedded tokens, overwritten), cos/sin [B, T, D], write [B, T]
        (``Cache.slots_for``), groups (``attention.seen_slots`` of the pass's mask) -> (the
        last layer's output [B, T, d], the outputs of ``taps``). attn_input [B * T, w]: what
        a one-layer stack's q/k/v product reads in place of the normed x, which stays the
        residual (an EAGLE draft layer, ``drafters.eagle.compiled``)."""
        batch, num_new, hidden = x.shape
        rows, queries, slots, counts = flat_slots(groups)
        buffer_rows = cache._rows[:, 0]  # a row's place in the cache's buffers
        flat = x.reshape(batch * num_new, hidden)
        taps = tuple(sorted(t for t in taps if t < self.layers))
        found = torch.ops.quickdraft_kernels.decoder_layers(
            flat,
            self.weights,
            self.biases,
            self.spec,
            eps,
            cos.reshape(batch * num_new, -1).contiguous(),
            sin.reshape(batch * num_new, -1).contiguous(),
            cache.keys,
            cache.values,
            buffer_rows.repeat_interleave(num_new),
            write.reshape(-1).contiguous(),
            (rows * num_new + queries).contiguous(),
            buffer_rows[rows].contiguous(),
            slots,
            counts,
            heads,
            cache.keys.shape[3],
            list(taps),
            self.path,
            attn_input,
        )
        return flat.view(batch, num_new, hidden), {
            t: out.view(batch, num_new, hidden) for t, out in zip(taps, found, strict=True)
        }


def usable(cache: object, x: torch.Tensor) -> bool:
    """Whether a pass over ``cache`` with hidden states like ``x`` can run fused."""
    return (
        isinstance(cache, KVCache)
        and cache.keys.dtype == torch.float32
        and cache.keys.device.type == "cpu"
        and x.dtype == torch.float32
    )
