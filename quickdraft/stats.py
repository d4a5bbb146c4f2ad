"""What a generation run measured: acceptance, forward counts and where the time went."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(slots=True)
class Stats:
    """Filled in by the engine as it runs; read through the properties.

    k: draft tokens per verify step (0 for autoregressive decoding).
    accepted_drafts: per (row, verify step), the draft tokens accepted (0..k), in step order.
    drafted: per (row, verify step), the draft tokens proposed (a lookup drafter may propose
        fewer than k, or none).
    target_forwards: target decode/verify forward passes (the prompt prefill not counted), so
        that new tokens / target_forwards is the mean accepted length of a single row.
    new_tokens: tokens returned, summed over rows.
    cached_prompt_tokens: prompt tokens found cached (prefix caching) and not prefilled.
    cached_own_tokens: of those, the ones a request of the same tenant left in the cache
        (``SamplingParams.tenant``), else 0: what a server may tell a client without telling it
        what another client sent.
    time_*: seconds. prefill: the prompt passes of the target and the drafter; draft: the
        drafter's proposals; verify: target forward, probabilities and acceptance; other: the
        rest. Speculation changes decoding, not prefill: see ``decode_tokens_per_second``.
    """

    k: int
    batch_size: int = 1
    accepted_drafts: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    target_forwards: int = 0
    new_tokens: int = 0
    cached_prompt_tokens: int = 0
    cached_own_tokens: int = 0
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_total: float = 0.0

    def record(self, num_accepted: torch.Tensor, num_drafted: int) -> None:
        """num_accepted: [b] accepted drafts of the rows still generating, for one verify step
        that verified num_drafted draft tokens per row."""
        self.accepted_drafts.extend(num_accepted.tolist())
        self.drafted.extend([num_drafted] * num_accepted.numel())

    @property
    def verify_steps(self) -> int:
        return len(self.accepted_drafts)

    @property
    def accepted_lengths(self) -> list[int]:
        """Tokens each verify step added: accepted drafts plus the corrected or bonus token."""
        return [n + 1 for n in self.accepted_drafts]

    @property
    def mean_accepted_length(self) -> float:
        """Mean tokens per verify step (tau): 1.0 for autoregressive decoding."""
        if not self.accepted_drafts:
            return float("nan")
        return 1.0 + sum(self.accepted_drafts) / len(self.accepted_drafts)

    @property
    def acceptance_by_position(self) -> list[float]:
        """P(draft i accepted | draft i proposed and every draft before it accepted), for
        i = 1..k; NaN where position i was never reached."""
        accepted = torch.tensor(self.accepted_drafts, dtype=torch.long)
        drafted = torch.tensor(self.drafted, dtype=torch.long)
        rates = []
        for i in range(1, self.k + 1):
            reached = (accepted >= i - 1) & (drafted >= i)
            hits = int((accepted >= i).sum())
            rates.append(hits / int(reached.sum()) if bool(reached.any()) else float("nan"))
        return rates

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over proposed drafts, all positions together."""
        drafted = sum(self.drafted)
        return sum(self.accepted_drafts) / drafted if drafted else float("nan")

    @property
    def time_other(self) -> float:
        return max(0.0, self.time_total - self.time_prefill - self.time_draft - self.time_verify)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total > 0 else float("nan")

    @property
    def decode_tokens_per_second(self) -> float:
        """New tokens over the time after prefill: the rate speculation changes."""
        decode = self.time_total - self.time_prefill
        return self.new_tokens / decode if decode > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values; NaN (nothing measured) becomes None."""
        return _json_ready(
            {
                "k": self.k,
                "batch_size": self.batch_size,
                "new_tokens": self.new_tokens,
                "verify_steps": self.verify_steps,
                "target_forwards": self.target_forwards,
                "mean_accepted_length": self.mean_accepted_length,
                "acceptance_rate": self.acceptance_rate,
                "acceptance_by_position": self.acceptance_by_position,
                "accepted_lengths": self.accepted_lengths,
                "tokens_per_second": self.tokens_per_second,
                "decode_tokens_per_second": self.decode_tokens_per_second,
                "time_s": {
                    "prefill": self.time_prefill,
                    "draft": self.time_draft,
                    "verify": self.time_verify,
                    "other": self.time_other,
                    "total": self.time_total,
                },
            }
        )

    def summary(self) -> str:
        """One line for people."""
        return (
            f"{self.new_tokens} tokens, mean accepted length {self.mean_accepted_length:.2f}, "
            f"{self.tokens_per_second:.1f} tokens/s, {self.target_forwards} target forwards "
            f"(draft {self.time_draft:.2f}s, verify {self.time_verify:.2f}s, "
            f"other {self.time_other + self.time_prefill:.2f}s)"
        )


def _json_ready(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _json_ready(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_ready(item) for item in value]
    return value
