"""The EAGLE draft network: one decoder layer that drafts in the target's feature space.

EAGLE-1 (Li et al. 2024): the input at position t is fc([e_{t+1}, f_t]), the embedding of the
next token beside the target's final feature f_t (its hidden state before the LM head); one
Llama decoder layer (no input norm, as in the paper's code) turns it into a prediction of
f_{t+1}, which the target's own LM head reads as the distribution of token t + 2. The predicted
feature is fed back to draft further.

EAGLE-3 (Li et al. 2025): f_t is fc([l_t, m_t, h_t]), a fusion of a low, a middle and a high
layer of the target; the layer's attention reads [norm(e_{t+1}), norm(f_t)] (twice the hidden
width) with f_t as the residual; a final norm precedes the LM head. It does not regress
features: trained on its own outputs for several steps ("training-time test"), its output
state is fed back in place of the target's fused feature.

Both read the target's embedding and score a fixed draft vocabulary (the frequent tokens,
``draft_vocab``) with the rows of the target's LM head; neither has weights of its own there.
Parameter names follow Hugging Face's Llama, so the layer exports as it is (``export``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from quickdraft.models.base import Model
from quickdraft.models.ops import rotate


class EagleVariant(StrEnum):
    EAGLE1 = "eagle1"
    EAGLE3 = "eagle3"


@dataclass(frozen=True, slots=True)
class EagleConfig:
    """The draft layer's shape (the target's, by default) and what it reads.

    feature_layers: EAGLE-3 only, the three target decoder layers whose *inputs* (the residual
    stream before them, the output of the layer below) are fused, low, middle and high: the
    numbering of vLLM's ``eagle_aux_hidden_state_layer_ids``; EAGLE-1 reads the final normed
    state.
    draft_vocab_size: how many of the most frequent tokens the draft scores.
    own_head: the network has an LM head of its own over its draft vocabulary (EAGLE-3
        checkpoints trained elsewhere, imported); False: it scores the target's own rows.
    fc_bias: EAGLE-1's fc has a bias (the original checkpoints' and SGLang's layout).
    """

    variant: EagleVariant
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    feature_layers: tuple[int, ...] = field(default=())
    own_head: bool = False
    fc_bias: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "variant", EagleVariant(self.variant))
        except ValueError:
            raise ValueError(f"variant must be eagle1 or eagle3, got {self.variant!r}") from None
        if not isinstance(self.feature_layers, list | tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in self.feature_layers
        ):
            raise ValueError(f"feature_layers must be layer numbers, got {self.feature_layers!r}")
        object.__setattr__(self, "feature_layers", tuple(self.feature_layers))
        for name in ("own_head", "fc_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if not (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value > 0
            ):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        for name in (
            "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
            "vocab_size", "draft_vocab_size",
        ):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(
                f"draft_vocab_size ({self.draft_vocab_size}) exceeds vocab_size ({self.vocab_size})"
            )
        expected = 3 if self.variant is EagleVariant.EAGLE3 else 0
        if len(self.feature_layers) != expected:
            raise ValueError(
                f"feature_layers: {self.variant} reads {expected} target layers, got "
                f"{list(self.feature_layers)}"
            )

    @classmethod
    def for_target(
        cls,
        target_config: Any,
        variant: EagleVariant | str,
        draft_vocab_size: int,
        feature_layers: tuple[int, ...] | None = None,
        intermediate_size: int | None = None,
    ) -> EagleConfig:
        """The target's layer shape (a ``LlamaConfig``); EAGLE-3's default layers are 2,
        L/2 and L-3 of L, the choice of the paper's code and of vLLM and SGLang.
        ``intermediate_size``: the layer's MLP width when not the target's (a narrower one
        costs less per draft step and on disk; vLLM and SGLang read it from the exported
        config like any other)."""
        if variant not in set(EagleVariant):
            raise ValueError(f"variant must be eagle1 or eagle3, got {variant!r}")
        variant = EagleVariant(variant)
        layers = target_config.num_layers
        if feature_layers is None:
            chosen = (2, layers // 2, layers - 3) if variant is EagleVariant.EAGLE3 else ()
            # Shallow models (tests): the same layers, kept inside 1..L-1.
            feature_layers = tuple(min(max(layer, 1), layers - 1) for layer in chosen)
        for layer in feature_layers:
            if not 1 <= layer < layers:  # the input of layer 0 is the embedding
                raise ValueError(f"feature_layers: {layer} is not in 1..{layers - 1}")
        return cls(
            variant=variant,
            hidden_size=target_config.hidden_size,
            intermediate_size=intermediate_size or target_config.intermediate_size,
            num_heads=target_config.num_heads,
            num_kv_heads=target_config.num_kv_heads,
            head_dim=target_config.head_dim,
            vocab_size=target_config.vocab_size,
            draft_vocab_size=draft_vocab_size,
            rms_norm_eps=target_config.rms_norm_eps,
            rope_theta=target_config.rope_theta,
            feature_layers=tuple(feature_layers),
        )

    def to_dict(self) -> dict:
        record = asdict(self)
        record["variant"] = str(self.variant)
        record["feature_layers"] = list(self.feature_layers)
        return record


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, config: EagleConfig, input_size: int):
        super().__init__()
        heads, kv, dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_proj = nn.Linear(input_size, heads * dim, bias=False)
        self.k_proj = nn.Linear(input_size, kv * dim, bias=False)
        self.v_proj = nn.Linear(input_size, kv * dim, bias=False)
        self.o_proj = nn.Linear(heads * dim, config.hidden_size, bias=False)


class MLP(nn.Module):
    def __init__(self, config: EagleConfig):
        super().__init__()
        size, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(size, inner, bias=False)
        self.up_proj = nn.Linear(size, inner, bias=False)
        self.down_proj = nn.Linear(inner, size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: EagleConfig):
        super().__init__()
        size = config.hidden_size
        eagle3 = config.variant is EagleVariant.EAGLE3
        self.self_attn = Attention(config, 2 * size if eagle3 else size)
        self.mlp = MLP(config)
        self.post_attention_layernorm = RMSNorm(size, config.rms_norm_eps)
        if eagle3:  # the embedding and the fused feature are normed apart, then concatenated
            self.input_layernorm = RMSNorm(size, config.rms_norm_eps)
            self.hidden_norm = RMSNorm(size, config.rms_norm_eps)


def rotary(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [B, 1, T, D] of the rotary embedding at ``positions`` [B, T], computed once
    for the queries and the keys of a pass."""
    angles = positions.unsqueeze(-1).float() * inv_freq  # [B, T, D/2]
    angles = torch.cat([angles, angles], dim=-1).unsqueeze(1)
    return angles.cos(), angles.sin()


class EagleNet(nn.Module):
    """fc + one decoder layer (+ a final norm for EAGLE-3). The drafter runs it step by step
    against a cache (``project``, ``qkv``, ``finish``); training runs several steps over whole
    sequences at once (``unroll``)."""

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config
        size = config.hidden_size
        if config.variant is EagleVariant.EAGLE3:
            self.fc = nn.Linear(3 * size, size, bias=False)
            self.norm = RMSNorm(size, config.rms_norm_eps)
        else:
            # No bias in quickdraft's training (the layout vLLM loads); imported EAGLE-1
            # checkpoints may have one.
            self.fc = nn.Linear(2 * size, size, bias=config.fc_bias)
        self.layers = nn.ModuleList([DecoderLayer(config)])
        if config.own_head:  # rows in the order of ``draft_vocab``
            self.lm_head = nn.Linear(size, config.draft_vocab_size, bias=False)
        # The frequent tokens the draft scores, in the target's ids (set by training).
        self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size))
        dim = config.head_dim
        inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2).float() / dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # derived, not saved

    @property
    def eagle3(self) -> bool:
        return self.config.variant is EagleVariant.EAGLE3

    def fuse(self, hidden: torch.Tensor, taps: list[torch.Tensor]) -> torch.Tensor:
        """The feature of real target positions [.., d]: EAGLE-3 fuses the tapped layers
        (low, middle, high), EAGLE-1 takes the final state as it is."""
        if self.eagle3:
            return self.fc(torch.cat(taps, dim=-1))
        return hidden

    def project(
        self, embeds: torch.Tensor, feature: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention input, residual) of a position from e_{t+1} and f_t, both [.., d]."""
        layer = self.layers[0]
        if self.eagle3:
            joined = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(feature)], -1)
            return joined, feature
        x = self.fc(torch.cat([embeds, feature], dim=-1))
        return x, x

    def qkv(
        self, attn_input: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """attn_input [B, T, *] -> q [B, heads, T, D], k, v [B, kv_heads, T, D], rotated."""
        config, attn = self.config, self.layers[0].self_attn
        batch, length = attn_input.shape[:2]
        dim = config.head_dim

        def heads(x: torch.Tensor, count: int) -> torch.Tensor:
            return x.view(batch, length, count, dim).transpose(1, 2)

        cos, sin = rotary(positions, self.inv_freq)
        q = rotate(heads(attn.q_proj(attn_input), config.num_heads), cos, sin)
        k = rotate(heads(attn.k_proj(attn_input), config.num_kv_heads), cos, sin)
        return q, k, heads(attn.v_proj(attn_input), config.num_kv_heads)

    def finish(self, attended: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """attended [B, heads, T, D] -> the layer's output [B, T, d] (the next feature)."""
        layer = self.layers[0]
        batch, _, length, _ = attended.shape
        h = residual + layer.self_attn.o_proj(attended.transpose(1, 2).reshape(batch, length, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def head_input(self, output: torch.Tensor) -> torch.Tensor:
        """What the LM head reads: EAGLE-3's final norm of the output, EAGLE-1's output."""
        return self.norm(output) if self.eagle3 else output

    def unroll(
        self,
        embeds: torch.Tensor,
        features: torch.Tensor,
        steps: int,
        pad: torch.Tensor,
        first: int = 0,
    ) -> list[torch.Tensor]:
        """Training-time test over whole sequences. embeds [B, T + steps - 1, d]: e_{t+1} for
        anchor t, then the later tokens; features [B, T, d]: f_t (fused); pad [B, T] bool, True
        at padding. Step j (0-based) drafts token t + 2 + j at every anchor t: its query sits
        at position t + j, attends to the real positions 0..t (step 0's keys) and to its own
        anchor's keys of steps 1..j, exactly what it sees when drafting. Returns every step's
        output [B, T - first, d] at anchors ``first``..T-1; step j's input feature is step
        j-1's output.

        Anchors before ``first`` (a prompt nothing is scored in) only give step 0's keys and
        values: their queries, attention and MLP are skipped, at every step, since no later
        anchor reads them. The outputs kept are the same as with ``first=0``."""
        config = self.config
        batch, length = features.shape[:2]
        if not 0 <= first < length:
            raise ValueError(f"first must be in [0, {length}), got {first}")
        group = config.num_heads // config.num_kv_heads
        base = torch.arange(length, device=features.device).expand(batch, -1)
        causal = torch.ones(length, length, dtype=torch.bool, device=features.device).tril()
        visible = (causal & ~pad.unsqueeze(1))[:, first:]  # [B, T - first, T]
        scale = 1.0 / math.sqrt(config.head_dim)
        outputs, diagonal = [], []
        feature = features
        for step in range(steps):
            lo = 0 if step == 0 else first  # step 0 gives every anchor's keys
            attn_input, residual = self.project(embeds[:, step + lo : step + length], feature)
            q, k, v = self.qkv(attn_input, base[:, lo:] + step)
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            if step == 0:
                keys, values = k, v
                q, residual = q[:, :, first:], residual[:, first:]
            else:
                diagonal.append((k, v))
            scores = (q @ keys.transpose(-1, -2)) * scale  # [B, H, T - first, T]
            scores = scores.masked_fill(~visible.unsqueeze(1), float("-inf"))
            own = [(q * dk).sum(-1, keepdim=True) * scale for dk, _ in diagonal]  # [B, H, ., 1]
            weights = torch.cat([scores, *own], dim=-1).softmax(-1)
            attended = weights[..., :length] @ values
            for i, (_, dv) in enumerate(diagonal):
                attended = attended + weights[..., length + i : length + i + 1] * dv
            feature = self.finish(attended, residual)
            outputs.append(feature)
        return outputs


def check_fits(net: EagleNet, target: Model) -> None:
    """ValueError unless the drafter was made for a target of this shape: the native runner
    (embedding and LM head), the same hidden size and vocabulary, and the tapped layers."""
    config = net.config
    for name in ("embed", "head_weight", "config"):
        if not hasattr(target, name):
            raise ValueError(
                f"target: EAGLE reads the native runner's embedding and LM head, got "
                f"{type(target).__name__}"
            )
    target_config = target.config  # type: ignore[attr-defined]
    if target_config.hidden_size != config.hidden_size:
        raise ValueError(
            f"eagle_dir: a drafter of hidden size {config.hidden_size} does not fit the "
            f"target's {target_config.hidden_size}"
        )
    if target.vocab_size != config.vocab_size:
        raise ValueError(
            f"eagle_dir: drafter trained for a vocabulary of {config.vocab_size}, the "
            f"target has {target.vocab_size}"
        )
    beyond = [n for n in config.feature_layers if not 1 <= n <= target_config.num_layers]
    if beyond:
        raise ValueError(
            f"eagle_dir: the drafter reads layers {beyond}, the target has "
            f"{target_config.num_layers}"
        )
