"""A native runner for the Llama family (Llama, Mistral, Qwen2, SmolLM2) in plain PyTorch.

Why not just call transformers: a verify step feeds 2-16 tokens, and on CPUs plain ``F.linear``
with that few rows falls onto slow GEMM paths (a 5-row product costs 3.5 one-row products here).
Weights prepacked once for oneDNN make the cost of a few extra rows nearly flat, which is what
speculation needs. The runner also owns its KV cache (commit, rollback, tree paths), takes tree
attention masks, and exposes hidden-state taps for feature-level drafters.

Weights use Hugging Face names and layouts, so a transformers state dict loads as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from quickdraft.models import fused, quantized
from quickdraft.models import int8 as int8_ops
from quickdraft.models.attention import attend, attend_each, prefix_tree_mask, seen_slots
from quickdraft.models.base import ModelOutput
from quickdraft.models.kv_cache import KVCache
from quickdraft.models.llama_config import (
    SUPPORTED_MODEL_TYPES,
    LlamaConfig,
    rope_inv_freq,
)
from quickdraft.models.ops import LAYOUTS, Joined, Linear, layout_of, rms_norm, rotate

# The output head's code width on the quantized kernels: 8 (4 costs the 1.5B 94.1% top-1
# agreement on its probe against 98.2%). A head from a quantized file takes the narrowest form
# that reproduces it (``ops.Linear.quantize_q4``'s ``exact_only``: a GGUF's Q6_K head keeps its
# form).
HEAD_BITS = 8


class _Layer:
    def __init__(
        self, weights: dict[str, torch.Tensor], prefix: str, bias: bool, linear: Callable,
        fused: bool = True,
    ):  # fmt: skip
        attn, mlp = prefix + "self_attn.", prefix + "mlp."
        # The weights of each product (q/k/v, o, gate/up, down), in its rows' order.
        self.names = (
            tuple(attn + f"{p}_proj.weight" for p in "qkv"),
            (attn + "o_proj.weight",),
            (mlp + "gate_proj.weight", mlp + "up_proj.weight"),
            (mlp + "down_proj.weight",),
        )
        qkv = [weights[name] for name in self.names[0]]
        qkv_bias = [weights[attn + f"{p}_proj.bias"] for p in "qkv"] if bias else [None] * 3
        gate_up = [weights[name] for name in self.names[2]]
        self.qkv: Linear | Joined
        self.gate_up: Linear | Joined
        if fused:  # one product each: fewer, larger kernels
            self.qkv = linear(torch.cat(qkv), None if not bias else torch.cat(qkv_bias))
            self.gate_up = linear(torch.cat(gate_up))
        else:  # the tensors as given, no copy
            self.qkv = Joined(*(linear(w, b) for w, b in zip(qkv, qkv_bias, strict=True)))
            self.gate_up = Joined(*(linear(w) for w in gate_up))
        self.o = linear(weights[self.names[1][0]])
        self.down = linear(weights[self.names[3][0]])
        self.attn_norm = weights[prefix + "input_layernorm.weight"]
        self.mlp_norm = weights[prefix + "post_attention_layernorm.weight"]


class LlamaRunner:
    """Implements the ``Model`` protocol for Llama-family weights.

    tap_layers: indices of decoder layers whose outputs are returned in ``ModelOutput.taps``
    (EAGLE-3 reads low, middle and high layers); ``hidden`` is always the final normed state.
    int8: int8 weights for every projection and the head (CPU, ``models.int8``). Changes the
    model's own distribution slightly, so it is for draft models: speculation stays exact
    whatever the draft computes, and a 4x smaller draft streams 4x less memory per token.
    fuse (attribute, default True): a q4 model on a compiled path runs all its decoder layers
    in one call (``models.fused``), batch-invariant; False runs them layer by layer in PyTorch
    (slower, and not the same bits: compare a model with itself, not across the two).
    calibration: [T] token ids run once in float before quantizing, to find each
    projection's outlier input channels (kept in float); None keeps none.
    probe: [T] token ids to compare the int8 model with its float self on; the result is
    ``quant_check`` (None without a probe).
    q4: 4-bit weights for every projection and 8-bit ones for the head (``kernels.superblock``):
    batch-invariant, so for targets as well as drafts; needs no calibration; ``probe`` checks
    it as for int8. q4_exact: the weights came from a quantized file; a projection that 4 bits
    do not reproduce keeps 8 (a GGUF's Q6_K and Q8_0 tensors). q4_bits=8: 8-bit codes for
    every layer on the same kernel (``load_model(quant="int8")``). quantized_cache: a file
    (``models.quantized``) the quantized layers are read from when it holds them, and written
    to after quantizing when it does not.
    shared: compute with the given tensors themselves (no fused or prepacked copies), so the
    runner holds no weights of its own (``from_transformers``).
    invariant: every token's logits are the same bit for bit whatever else the pass holds
    (other tokens, rows, tree nodes): integer outlier products in int8 layers, and each query
    attends over exactly the keys it sees, in order. A quantized target needs it: rounding
    activations to 8 bits turns the last-bit differences of batch-dependent float kernels into
    whole quantization steps, and its verify passes would not reproduce its own decoding.
    """

    def __init__(
        self,
        config: LlamaConfig,
        weights: dict[str, torch.Tensor],
        *,
        tap_layers: tuple[int, ...] = (),
        int8: bool = False,
        calibration: torch.Tensor | None = None,
        probe: torch.Tensor | None = None,
        shared: bool = False,
        invariant: bool = False,
        q4: bool = False,
        q4_exact: bool = False,
        q4_bits: int = 4,
        quantized_cache: Path | None = None,
        q4_source: Any = None,
    ):
        if shared and (int8 or q4):
            field = "int8" if int8 else "q4"
            raise ValueError(f"{field}: quantized weights are a copy; they cannot be shared")
        if int8 and q4:
            raise ValueError("q4: a model is quantized to int8 or to 4 bits, not both")
        self.config = config
        self.name: str | None = None  # the alias it was loaded from (``load_model``)
        self.vocab_size = config.vocab_size
        self.max_positions = config.max_positions
        for layer in tap_layers:
            if not 0 <= layer < config.num_layers:
                raise ValueError(f"tap_layers: {layer} is not in 0..{config.num_layers - 1}")
        self.tap_layers = tuple(tap_layers)
        self.embed = weights["model.embed_tokens.weight"]
        self.dtype, self.device = self.embed.dtype, self.embed.device
        # int8 builds float layers first: they keep their dense weights to be quantized.
        linear = partial(Linear, prepack=not (int8 or q4 or shared))
        self.layers = [
            _Layer(weights, f"model.layers.{i}.", config.attention_bias, linear, fused=not shared)
            for i in range(config.num_layers)
        ]
        self.norm = weights["model.norm.weight"]
        # The dense head stays referenced (it is the embedding when tied): vocabulary
        # shortlists pack their own row subsets of it.
        self.head_weight = self.embed if config.tie_word_embeddings else weights["lm_head.weight"]
        self.head = linear(self.head_weight)
        self.int8 = int8
        self.q4 = q4
        # What load_model's quant names: "q4", "int8" (8-bit codes on the q4 kernel), or None.
        self.quant: str | None = ("q4" if q4_bits == 4 else "int8") if q4 else None
        self.invariant = invariant
        self.inv_freq = rope_inv_freq(config).to(self.device)
        self.quant_check: int8_ops.QuantCheck | None = None
        self.fuse = True
        self._stacks: dict[int, fused.Stack | None] = {}  # per layer count: clones share it
        stored = None
        if q4 and quantized_cache is not None:
            stored = quantized.load(quantized_cache, self._projections())
        if stored is not None:
            self._stacks.clear()
            self.quant_check = stored.check
        elif int8:
            original = None if probe is None else self._logits(probe)
            self._quantize(calibration)
            self.quant_check = self._check(probe, original)
        elif q4:
            original = None if probe is None else self._logits(probe)
            for layout in LAYOUTS:
                self._quantize_q4(q4_bits, q4_exact, layout, q4_source)
                self.quant_check = self._check(probe, original)
                # Superblocks share an activation scale over 256 inputs; a model with outlier
                # channels (SmolLM2-135M: 92.9% top-1 agreement on the probe against 97.5%)
                # takes the groups' scale per 32 instead.
                if self.quant_check is None or self.quant_check.passed:
                    break
            for linear_layer in self._projections():
                linear_layer.release_dense()
            if quantized_cache is not None:
                quantized.save(quantized_cache, self._projections(), self.quant_check)
        if q4:
            quantized.gather(self._projections())
            self._stacks.clear()

    def _check(
        self, probe: torch.Tensor | None, original: torch.Tensor | None
    ) -> int8_ops.QuantCheck | None:
        """The quantized model against its float logits on the probe (None without one)."""
        return None if original is None else int8_ops.compare(self._logits(probe), original)

    @property
    def quant_layout(self) -> str | None:
        """The layout its quantized layers use (``ops.LAYOUTS``), "superblock+groups" when
        both (a quantized file's 8-bit fallback tensors take groups), None in float or int8."""
        used = {
            part
            for layer in self._projections()
            for part in (layout_of(layer.quantized_weights) or "").split("+")
        }
        return "+".join(layout for layout in LAYOUTS if layout in used) or None

    def _quantize_q4(self, bits: int, exact_only: bool, layout: str, source: Any = None) -> None:
        """Every projection to ``bits``; with ``exact_only`` and a ``source``
        (``gguf.BlockSource``) on superblocks, each takes its file's own blocks where they
        are Q4_K or Q6_K (a 4-bit target: 8-bit codes would be wider than the file's)."""
        self._stacks.clear()
        # A 4-bit target's 8-bit fallbacks multiply activations per 32, as llama.cpp's do.
        fallback = bits == 4
        blocks = exact_only and source is not None and layout == "superblock" and bits == 4
        for linear_layer, names in zip(self._projections(), self._weight_names(), strict=True):
            given = None
            if blocks:
                found = [source.codes(name) for name in names]
                given = None if any(c is None for c in found) else found
            head = linear_layer is self.head
            linear_layer.quantize_q4(
                HEAD_BITS if head else bits, exact_only, layout, groups_fallback=fallback,
                given=given,
            )  # fmt: skip

    def _weight_names(self) -> list[tuple[str, ...]]:
        """The Hugging Face weights of each of ``_projections``, in their rows' order."""
        return [("lm_head.weight",)] + [names for layer in self.layers for names in layer.names]

    def _projections(self) -> list[Linear]:
        """Every linear layer: the head, then each layer's q/k/v, o, gate/up and down."""
        layers = [self.head]
        for layer in self.layers:
            layers += [layer.qkv, layer.o, layer.gate_up, layer.down]
        return layers

    def _quantize(self, calibration: torch.Tensor | None) -> None:
        """Every projection and the head to int8, in place; ``calibration`` first runs in
        float to find each one's outlier input channels."""
        usual, down = int8_ops.OUTLIER_DIVISOR, int8_ops.DOWN_OUTLIER_DIVISOR
        if self.invariant:  # integer outlier products cost no more bytes: keep more apart
            usual = down = int8_ops.INVARIANT_OUTLIER_DIVISOR
        linears = [(self.head, usual)]
        for layer in self.layers:
            linears += [(layer.qkv, usual), (layer.o, usual), (layer.gate_up, usual)]
            linears.append((layer.down, down))
        if calibration is not None:
            for linear, _ in linears:
                linear.observe()
            self._logits(calibration)
        for linear, divisor in linears:
            linear.quantize(divisor, invariant=self.invariant)

    def _logits(self, ids: torch.Tensor) -> torch.Tensor:
        """[T] token ids -> [T, V] logits of one fresh pass."""
        ids = ids.reshape(1, -1).to(self.device)
        positions = torch.arange(ids.shape[1], device=self.device).unsqueeze(0)
        return self.forward(ids, positions, self.new_cache(1, ids.shape[1])).logits[0]

    @classmethod
    def from_state_dict(
        cls,
        config: dict[str, Any] | LlamaConfig,
        state_dict: dict[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        **kwargs: Any,
    ) -> LlamaRunner:
        if not isinstance(config, LlamaConfig):
            config = LlamaConfig.from_hf(config)
        weights = {
            name: tensor.detach().to(device=device, dtype=dtype)
            for name, tensor in state_dict.items()
        }
        return cls(config, weights, **kwargs)

    @classmethod
    def from_transformers(
        cls, model: Any, *, shared: bool = True, tap_layers: tuple[int, ...] = ()
    ) -> LlamaRunner:
        """The native runner of a Llama-family transformers model (Llama, Mistral, Qwen2,
        SmolLM2: ``model_type`` llama, mistral or qwen2), on its device and in its dtype, so
        that EAGLE, Medusa, trees and batches run on it.

        shared (default): the runner computes with the model's own parameter tensors and holds
        no weights of its own; an update to the model (a fine-tuning step) is seen by the next
        call. shared=False builds the layout ``load_model`` builds (fused q/k/v and gate/up
        products, prepacked for oneDNN on CPU in float32): a copy of every projection. Which
        is faster depends on the CPU: prepacking helped a verify pass on an AVX2 EPYC and
        slowed a step on an AVX-512 Xeon (``benchmarks/results/defaults.md``).
        """
        config = getattr(model, "config", None)
        if config is None or not callable(getattr(model, "state_dict", None)):
            raise ValueError(
                f"model: expected a transformers model with a config, got {type(model).__name__}"
            )
        if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model: model_type {getattr(config, 'model_type', None)!r} has no native "
                f"runner ({', '.join(SUPPORTED_MODEL_TYPES)}); use models.hf.HFModel"
            )
        state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
        if "lm_head.weight" not in state and not config.tie_word_embeddings:
            raise ValueError("model: no lm_head.weight (pass the ...ForCausalLM model)")
        llama = LlamaConfig.from_hf(config.to_dict())
        return cls(llama, state, shared=shared, tap_layers=tap_layers)

    def truncated(self, num_layers: int) -> LlamaRunner:
        """A cheaper model sharing this one's weights: its first ``num_layers`` decoder layers,
        then the final norm and head. A classic self-drafting draft model (layer skipping)."""
        if not 1 <= num_layers <= self.config.num_layers:
            raise ValueError(f"num_layers must be in 1..{self.config.num_layers}, got {num_layers}")
        clone = object.__new__(LlamaRunner)
        clone.__dict__.update(self.__dict__)
        clone.config = dataclasses.replace(self.config, num_layers=num_layers)
        clone.name = None  # another model: what ships for the full one does not fit it
        clone.layers = self.layers[:num_layers]
        clone.tap_layers = tuple(i for i in self.tap_layers if i < num_layers)
        return clone

    def with_taps(self, layers: tuple[int, ...]) -> LlamaRunner:
        """A view of this model, sharing its weights, that also returns the outputs of
        ``layers`` (and of those it already taps) in ``ModelOutput.taps``."""
        for layer in layers:
            if not 0 <= layer < self.config.num_layers:
                raise ValueError(f"tap_layers: {layer} is not in 0..{self.config.num_layers - 1}")
        clone = object.__new__(LlamaRunner)
        clone.__dict__.update(self.__dict__)
        clone.tap_layers = tuple(sorted(set(self.tap_layers) | set(layers)))
        return clone

    def new_cache(self, batch_size: int, capacity: int) -> KVCache:
        config = self.config
        return KVCache(
            config.num_layers,
            batch_size,
            capacity,
            config.num_kv_heads,
            config.head_dim,
            dtype=self.dtype,
            device=self.device,
        )

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        tree_mask: torch.Tensor | None = None,
    ) -> ModelOutput:
        """tokens, positions: [B, T]; tree_mask: [T, T] bool, True where new token t may attend
        to new token s (itself and its ancestors); None is causal. The committed prefix of each
        row is always visible. Writes the new keys and values at each row's length."""
        hidden, taps = self.body(tokens, positions, cache, tree_mask)
        with torch.inference_mode():
            logits = self.head(hidden).float()
        return ModelOutput(logits=logits, hidden=hidden, taps=taps)

    @torch.inference_mode()
    def body(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        tree_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """``forward`` without the output head: (final normed hidden [B, T, d], taps). For
        callers that apply their own head, such as a vocabulary shortlist."""
        config = self.config
        batch, num_new = tokens.shape
        slots = cache.slots_for(num_new)
        used = int(cache.lengths.max()) + num_new
        if config.sliding_window is not None and used > config.sliding_window:
            raise ValueError(
                f"context of {used} tokens exceeds the sliding window "
                f"({config.sliding_window}), which this runner does not apply"
            )
        mask = self._mask(cache.lengths, num_new, used, tree_mask)
        stack = self._stack()
        # invariant: each query over exactly its own keys, their slots found once a pass
        invariant = self.invariant or stack is not None
        attention, visible = (attend_each, seen_slots(mask)) if invariant else (attend, mask)
        freqs = positions.to(self.device).unsqueeze(-1).float() * self.inv_freq  # [B, T, D/2]
        angles = torch.cat([freqs, freqs], dim=-1).unsqueeze(2)  # [B, T, 1, D]
        cos, sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)

        heads, kv_heads, dim = config.num_heads, config.num_kv_heads, config.head_dim
        x = self.embed[tokens]
        eps = config.rms_norm_eps
        if stack is not None and fused.usable(cache, x):
            x, taps = stack.run(x, cos, sin, cache, slots, visible, heads, eps, self.tap_layers)
            return rms_norm(x, self.norm, eps), taps
        taps = {}
        for index, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, config.rms_norm_eps)
            qk, v = layer.qkv(h).split([(heads + kv_heads) * dim, kv_heads * dim], dim=-1)
            # queries and keys rotated in one pass: half the small operations a layer
            qk = rotate(qk.reshape(batch, num_new, heads + kv_heads, dim), cos, sin)
            q, k = qk.split([heads, kv_heads], dim=2)
            cache.write(index, k, v.view(batch, num_new, kv_heads, dim), slots)
            keys, values = cache.view(index, used)
            attended = attention(q.transpose(1, 2), keys, values, visible, heads != kv_heads)
            x = x + layer.o(attended.transpose(1, 2).reshape(batch, num_new, heads * dim))
            h = rms_norm(x, layer.mlp_norm, config.rms_norm_eps)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
            if index in self.tap_layers:
                taps[index] = x
        return rms_norm(x, self.norm, config.rms_norm_eps), taps

    def _stack(self) -> fused.Stack | None:
        """The fused form of this model's layers (``models.fused``), or None where it has none
        or ``fuse`` is off."""
        if not (self.q4 and self.fuse):
            return None
        count = len(self.layers)
        if count not in self._stacks:
            self._stacks[count] = fused.Stack.of(self.layers)
        return self._stacks[count]

    def _mask(
        self, lengths: torch.Tensor, num_new: int, used: int, tree_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """[B, 1, T, used] bool: the committed prefix, then the new tokens causally or by tree."""
        if tree_mask is not None and tree_mask.shape != (num_new, num_new):
            raise ValueError(
                f"tree_mask must be [T, T] = [{num_new}, {num_new}], got {list(tree_mask.shape)}"
            )
        return prefix_tree_mask(lengths.to(self.device), used, tree_mask, num_new)


def quant_layout(model: object) -> str | None:
    """The kernel layout a quantized native model's layers use ("superblock", "groups",
    "superblock+groups"), for reports; None for any other model."""
    return model.quant_layout if isinstance(model, LlamaRunner) else None
