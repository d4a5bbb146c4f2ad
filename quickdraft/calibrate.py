"""`quickdraft pick --calibrate`: measure acceptance and costs on the user's prompts, then pick.

1. Forward costs on this machine: the target's forward of T tokens (T = 1 .. k_max + 1) after a
   context as long as the prompts, and the drafter's time per proposed token.
2. Acceptance: each method drafts k_max tokens per step on the prompts; the pooled per-position
   acceptance a_i and the share of steps that proposed at least i tokens p_i give, for any
   k <= k_max, E[tokens](k) = 1 + sum_{i<=k} p_i * a_1 * .. * a_i.
3. Predicted speedup(k) = E[tokens](k) * v(1) / (drafter time(k) + v(k + 1)); the best method
   and k win, and are then run beside plain decoding on the same prompts to compare.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from quickdraft.config import Method, SamplingParams, SpecConfig
from quickdraft.engine import generate
from quickdraft.models.base import Model
from quickdraft.picker import Recommendation
from quickdraft.stats import Stats


def forward_costs(
    model: Model, context: int, sizes: list[int], repeats: int = 5
) -> dict[int, float]:
    """Median seconds of a forward over T new tokens after ``context`` tokens, for each T;
    the cache is rolled back after each call, so every call sees the same context."""
    cache = model.new_cache(1, context + max(sizes) + 1)
    prefix = torch.randint(
        0, min(model.vocab_size, 1000), (1, context), generator=torch.Generator().manual_seed(0)
    )
    model.forward(prefix, torch.arange(context).unsqueeze(0), cache)
    cache.commit(context)
    times: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(repeats + 1):  # the first round warms up
        for size in sizes:
            tokens = torch.randint(0, min(model.vocab_size, 1000), (1, size))
            positions = torch.arange(context, context + size).unsqueeze(0)
            start = time.perf_counter()
            model.forward(tokens, positions, cache)
            times[size].append(time.perf_counter() - start)
    return {size: statistics.median(values[1:]) for size, values in times.items()}


@dataclass(slots=True)
class MethodProfile:
    method: Method
    acceptance: list[float]  # a_i, i = 1..k_max (0 where never reached)
    proposed: list[float]  # p_i: share of steps proposing at least i tokens
    draft_seconds_per_token: float  # a draft model's forward; 0 for lookup drafters
    draft_seconds_per_step: float  # a lookup drafter's search; 0 for draft models
    predicted: dict[int, float] = field(default_factory=dict)  # k -> predicted speedup

    def draft_seconds(self, k: int) -> float:
        return k * self.draft_seconds_per_token + self.draft_seconds_per_step

    def expected_tokens(self, k: int) -> float:
        total, chain = 1.0, 1.0
        for i in range(k):
            chain *= self.acceptance[i]
            total += self.proposed[i] * chain
        return total


@dataclass(slots=True)
class Calibration:
    verify_seconds: dict[int, float]
    profiles: list[MethodProfile]
    choice: Recommendation
    measured_speedup: float | None = None

    def table(self) -> list[tuple[str, int, float]]:
        return [(p.method.value, k, s) for p in self.profiles for k, s in p.predicted.items()]


def calibrate(
    target: Model,
    prompts: list[list[int]],
    *,
    draft: Model | None = None,
    methods: tuple[Method, ...] = (Method.DRAFT_MODEL, Method.NGRAM),
    k_max: int = 8,
    max_new_tokens: int = 48,
    temperature: float = 0.0,
    stop_token_ids: tuple[int, ...] = (),
    verify: bool = True,
) -> Calibration:
    if not prompts:
        raise ValueError("calibrate: no prompts")
    if Method.DRAFT_MODEL in methods and draft is None:
        methods = tuple(m for m in methods if m is not Method.DRAFT_MODEL)
    context = int(statistics.median(len(p) for p in prompts)) + max_new_tokens // 2
    verify_seconds = forward_costs(target, context, list(range(1, k_max + 2)))
    sampling = SamplingParams(
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        seed=0,
        stop_token_ids=stop_token_ids,
    )
    draft_forward = forward_costs(draft, context, [1])[1] if draft is not None else 0.0
    profiles = []
    for method in methods:
        spec = SpecConfig(method=method, num_speculative_tokens=k_max)
        pooled, lookup_time = Stats(k=k_max), 0.0
        for prompt in prompts:
            out = generate(
                target,
                prompt,
                sampling=sampling,
                spec=spec,
                draft=draft if method is Method.DRAFT_MODEL else None,
            )
            pooled.accepted_drafts.extend(out.stats.accepted_drafts)
            pooled.drafted.extend(out.stats.drafted)
            lookup_time += out.stats.time_draft
        steps = max(len(pooled.drafted), 1)
        uses_model = method is Method.DRAFT_MODEL
        profile = MethodProfile(
            method,
            acceptance=[0.0 if r != r else r for r in pooled.acceptance_by_position],
            proposed=[sum(d >= i for d in pooled.drafted) / steps for i in range(1, k_max + 1)],
            draft_seconds_per_token=draft_forward if uses_model else 0.0,
            draft_seconds_per_step=0.0 if uses_model else lookup_time / steps,
        )
        for k in range(1, k_max + 1):
            step = profile.draft_seconds(k) + verify_seconds[k + 1]
            profile.predicted[k] = profile.expected_tokens(k) * verify_seconds[1] / step
        profiles.append(profile)
    choice = _choose(profiles)
    calibration = Calibration(verify_seconds, profiles, choice)
    if verify and choice.speculate:
        calibration.measured_speedup = measure_speedup(
            target, prompts, choice.spec, sampling, draft
        )
    return calibration


def _choose(profiles: list[MethodProfile]) -> Recommendation:
    best = max(
        ((s, p, k) for p in profiles for k, s in p.predicted.items()),
        key=lambda item: item[0],
        default=None,
    )
    if best is None or best[0] < 1.0:
        return Recommendation(
            SpecConfig(method=Method.AR),
            1.0,
            ["no method is predicted to beat plain decoding here"],
        )
    gain, profile, k = best
    reasons = [
        f"{profile.method.value} at k = {k}: measured acceptance by position "
        + ", ".join(f"{a:.2f}" for a in profile.acceptance[:k])
        + f"; predicted {profile.expected_tokens(k):.2f} tokens per step",
        f"drafting costs {1000 * profile.draft_seconds(k):.1f} ms per step of {k} here",
    ]
    return Recommendation(
        SpecConfig(method=profile.method, num_speculative_tokens=k), gain, reasons
    )


def measure_speedup(
    target: Model,
    prompts: list[list[int]],
    spec: SpecConfig,
    sampling: SamplingParams,
    draft: Model | None,
) -> float:
    """Median over prompts of the decoding-speed ratio (after prefill, as the prediction
    models it) of spec to plain decoding, run back to back."""
    ratios = []
    for prompt in prompts:
        rates = []
        for run_spec in (SpecConfig(method=Method.AR), spec):
            uses_draft = run_spec.method is Method.DRAFT_MODEL
            out = generate(
                target,
                prompt,
                sampling=sampling,
                spec=run_spec,
                draft=draft if uses_draft else None,
            )
            rates.append(out.stats.decode_tokens_per_second)
        ratios.append(rates[1] / rates[0])
    return statistics.median(ratios)


def describe(calibration: Calibration, draft_name: str | None) -> dict[str, Any]:
    choice = calibration.choice
    return {
        "verify_ms": {t: 1000 * s for t, s in calibration.verify_seconds.items()},
        "profiles": [
            {
                "method": p.method.value,
                "acceptance_by_position": p.acceptance,
                "proposed_share": p.proposed,
                "draft_ms_per_token": 1000 * p.draft_seconds_per_token,
                "lookup_ms_per_step": 1000 * p.draft_seconds_per_step,
                "predicted_speedup": p.predicted,
            }
            for p in calibration.profiles
        ],
        "choice": choice.quickdraft_json(),
        "vllm": choice.vllm_json(draft_name),
        "predicted_speedup": choice.predicted_speedup,
        "measured_speedup": calibration.measured_speedup,
    }
