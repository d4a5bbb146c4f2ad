"""Closed-form models of speculative decoding, and the experiments that check them.

With per-token acceptance rate a and N draft tokens per step, a verify step yields
E[tokens] = (1 - a^(N+1)) / (1 - a) tokens (Leviathan et al., 2023, eq. 1). What that buys in
wall-clock time depends on two cost ratios, both relative to one 1-token target decode step:

- draft_cost c: one draft forward. N of them per step.
- verify cost v(T): a target forward over T tokens. 1 on a GPU for small T; on a CPU it grows,
  modelled here as v(T) = 1 + verify_slope * (T - 1) (measure the slope; OFFLINE.md has figures).

speedup(a, N) = E[tokens] / (N c + v(N + 1)).

For a draft distribution p and target q, the acceptance of one draft token is exactly
sum_x min(p(x), q(x)) = 1 - TV(p, q); :func:`acceptance_experiment` measures it with the real
acceptance rule and compares.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from quickdraft.accept import rejection_sampling
from quickdraft.config import SamplingParams
from quickdraft.models.toy import NGramLM
from quickdraft.sampling import make_generator, probs_from_logits, sample


def expected_tokens_per_step(alpha: float, num_draft: int) -> float:
    """E[tokens per target call] = (1 - a^(N+1)) / (1 - a); N + 1 when a = 1."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if num_draft < 0:
        raise ValueError(f"num_draft must be >= 0, got {num_draft}")
    if alpha == 1.0:
        return float(num_draft + 1)
    return (1.0 - alpha ** (num_draft + 1)) / (1.0 - alpha)


@dataclass(frozen=True, slots=True)
class CostModel:
    """Costs relative to one 1-token target decode step.

    draft_cost: one draft forward (c). verify_slope: extra cost of each token in a verify pass.
    """

    draft_cost: float = 0.1
    verify_slope: float = 0.0

    def __post_init__(self) -> None:
        for name in ("draft_cost", "verify_slope"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def verify(self, num_tokens: int) -> float:
        return 1.0 + self.verify_slope * (num_tokens - 1)

    def step(self, num_draft: int) -> float:
        """Time of one speculative step with N draft tokens."""
        return num_draft * self.draft_cost + self.verify(num_draft + 1)


def speedup(alpha: float, num_draft: int, costs: CostModel) -> float:
    """Wall-clock speedup over autoregressive decoding; 1.0 at N = 0."""
    return expected_tokens_per_step(alpha, num_draft) / costs.step(num_draft)


def optimal_num_draft(alpha: float, costs: CostModel, max_draft: int = 64) -> int:
    """The N in 0..max_draft with the highest modelled speedup (0: do not speculate)."""
    return max(range(max_draft + 1), key=lambda n: speedup(alpha, n, costs))


def kl_divergence(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(p || q) in nats for distributions [V]."""
    p, q = p.double(), q.double()
    support = p > 0
    return float((p[support] * (p[support] / q[support]).log()).sum())


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * float((p.double() - q.double()).abs().sum())


@dataclass(frozen=True, slots=True)
class AcceptancePoint:
    distance: float
    kl: float  # KL(target || draft)
    expected: float  # 1 - TV(target, draft)
    measured: float  # accepted drafts / draft positions reached
    trials: int


def acceptance_experiment(
    distances: list[float],
    *,
    steps: int = 10_000,
    num_draft: int = 4,
    vocab_size: int = 32,
    seed: int = 0,
) -> list[AcceptancePoint]:
    """Run ``steps`` speculative steps at each draft distance with the real rejection rule.

    Target and drafts are unigram toy models (one distribution at every position), so every
    draft position reached is a Bernoulli trial with success probability exactly 1 - TV.
    """
    target = NGramLM.random(vocab_size, order=1, seed=seed)
    params = SamplingParams(temperature=1.0)
    q = probs_from_logits(target.table[0], params)
    generator = make_generator(seed)
    points = []
    for distance in distances:
        p = probs_from_logits(target.perturbed(distance).table[0], params)
        draft_probs = p.expand(steps, num_draft, -1)
        draft_tokens = sample(draft_probs, generator)
        target_probs = q.expand(steps, num_draft + 1, -1)
        accepted = rejection_sampling(
            draft_tokens, draft_probs, target_probs, generator
        ).num_accepted
        reached = (accepted + 1).clamp_max(num_draft)
        points.append(
            AcceptancePoint(
                distance=distance,
                kl=kl_divergence(q, p),
                expected=1.0 - total_variation(q, p),
                measured=float(accepted.sum()) / float(reached.sum()),
                trials=int(reached.sum()),
            )
        )
    return points


def is_monotone_decreasing(points: list[AcceptancePoint]) -> bool:
    """Measured acceptance strictly falls as KL(target || draft) grows."""
    ordered = sorted(points, key=lambda point: point.kl)
    return all(a.measured > b.measured for a, b in itertools.pairwise(ordered))
