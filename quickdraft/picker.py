"""Choose a speculative method, k and draft temperature for a workload.

From a description of the workload, with the tutorial's rules for when not to speculate and the
speedup model of ``theory.py`` fed with prior acceptance rates per task kind and method. The
priors are starting points (measured here on the Qwen2.5-Coder pair and SmolLM2, and in line
with the literature); ``quickdraft bench`` measures the real ones on a user's own prompts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from quickdraft import methods
from quickdraft.bench.tasks import TASK_KINDS
from quickdraft.config import Method, SpecConfig
from quickdraft.theory import CostModel, optimal_num_draft, speedup

# Prior per-token acceptance at temperature 0, by method and task kind. n-gram lookup only wins
# where the output copies the input (code edits, retrieval answers, summaries).
ALPHA_PRIORS: dict[Method, dict[str, float]] = {
    Method.DRAFT_MODEL: {
        "code": 0.82,
        "math": 0.78,
        "rag": 0.72,
        "summarization": 0.72,
        "translation": 0.68,
        "qa": 0.62,
        "conversation": 0.62,
        "other": 0.65,
    },
    Method.NGRAM: {
        "code": 0.30,
        "math": 0.20,
        "rag": 0.40,
        "summarization": 0.40,
        "translation": 0.10,
        "qa": 0.08,
        "conversation": 0.12,
        "other": 0.15,
    },
}
# Costs relative to one target decode step. CPU: a verify of T tokens costs 1 + 0.09 (T - 1)
# with the native runner, and an int8 draft model about 0.1 of the target (Qwen 1.5B / 0.5B,
# benchmarks/results/). GPU at batch 1: verifying a few tokens is nearly free.
COSTS = {
    ("cpu", Method.DRAFT_MODEL): CostModel(draft_cost=0.10, verify_slope=0.09),
    ("cpu", Method.NGRAM): CostModel(draft_cost=0.0, verify_slope=0.09),
    ("gpu", Method.DRAFT_MODEL): CostModel(draft_cost=0.05, verify_slope=0.01),
    ("gpu", Method.NGRAM): CostModel(draft_cost=0.0, verify_slope=0.01),
}
DRAFTERS = (Method.DRAFT_MODEL.value, Method.NGRAM.value)
MIN_GAIN = 1.05  # below this modelled speedup, speculation is not worth its complexity


@dataclass(frozen=True, slots=True)
class Workload:
    """task: a task kind or "other"; temperature: the target's; output_tokens: typical output
    length; concurrency: requests decoded together; memory_gb: memory free for a drafter (None:
    plenty); draft_gb: the draft model's size; drafters: which are available; device."""

    task: str = "other"
    temperature: float = 0.0
    output_tokens: int = 256
    concurrency: int = 1
    memory_gb: float | None = None
    draft_gb: float = 1.0
    drafters: tuple[str, ...] = DRAFTERS
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.task not in (*TASK_KINDS, "other"):
            raise ValueError(
                f"task must be one of {', '.join(TASK_KINDS)}, other; got {self.task!r}"
            )
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {self.output_tokens}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.memory_gb is not None and not self.memory_gb >= 0:
            raise ValueError(f"memory_gb must be >= 0, got {self.memory_gb}")
        registered = methods.names()
        unknown = [d for d in self.drafters if d not in registered]
        if unknown:
            raise ValueError(f"drafters: unknown {unknown}; methods: {', '.join(registered)}")
        if self.device not in ("cpu", "gpu"):
            raise ValueError(f"device must be cpu or gpu, got {self.device!r}")


@dataclass(frozen=True, slots=True)
class Recommendation:
    spec: SpecConfig
    predicted_speedup: float
    reasons: list[str] = field(default_factory=list)

    @property
    def speculate(self) -> bool:
        return self.spec.method is not Method.AR

    def quickdraft_json(self) -> dict[str, Any]:
        spec = self.spec
        data: dict[str, Any] = {"method": str(spec.method)}
        if self.speculate:
            data["num_speculative_tokens"] = spec.num_speculative_tokens
            data["acceptance"] = spec.acceptance.value
        if spec.method is Method.DRAFT_MODEL:
            data["draft_temperature"] = spec.draft_temperature
        if spec.method is Method.NGRAM:
            data["prompt_lookup_min"] = spec.prompt_lookup_min
            data["prompt_lookup_max"] = spec.prompt_lookup_max
        return data

    def vllm_json(self, draft_model: str | None = None) -> dict[str, Any] | None:
        """vLLM's --speculative-config, or None for plain decoding."""
        spec = self.spec
        if spec.method is Method.DRAFT_MODEL:
            return {
                "method": "draft_model",
                "model": draft_model or "<draft model>",
                "num_speculative_tokens": spec.num_speculative_tokens,
            }
        if spec.method is Method.NGRAM:
            return {
                "method": "ngram",
                "num_speculative_tokens": spec.num_speculative_tokens,
                "prompt_lookup_min": spec.prompt_lookup_min,
                "prompt_lookup_max": spec.prompt_lookup_max,
            }
        return None

    def as_text(self, draft_model: str | None = None) -> str:
        lines = [
            f"recommendation: {self.spec.method!s}"
            + (f", k = {self.spec.num_speculative_tokens}" if self.speculate else "")
            + f" (modelled speedup {self.predicted_speedup:.2f}x)",
            "because:",
        ]
        lines += [f"  - {reason}" for reason in self.reasons]
        lines.append("quickdraft: " + json.dumps(self.quickdraft_json()))
        vllm = self.vllm_json(draft_model)
        if vllm is not None:
            lines.append(f"vLLM: --speculative-config '{json.dumps(vllm)}'")
        return "\n".join(lines)


def alpha_for(method: Method, workload: Workload) -> float:
    """Prior acceptance, lowered by temperature: sampling makes agreement harder."""
    base = ALPHA_PRIORS[method][workload.task]
    return base * (1.0 - 0.25 * min(workload.temperature, 1.0))


def pick(workload: Workload) -> Recommendation:
    plain = SpecConfig(method=Method.AR)
    if workload.output_tokens <= 5:
        return Recommendation(
            plain,
            1.0,
            [
                f"outputs of {workload.output_tokens} tokens: drafting and verification overhead "
                "dominates outputs of 1-5 tokens; decode plainly"
            ],
        )
    if workload.temperature >= 1.5:
        return Recommendation(
            plain,
            1.0,
            [
                f"temperature {workload.temperature:g} is very high: draft tokens are rarely "
                "accepted, so speculation costs more than it saves"
            ],
        )
    reasons = []
    candidates = []
    for name in workload.drafters:
        if name not in ALPHA_PRIORS:  # a registered method the model has no priors for
            reasons.append(f"{name}: no acceptance prior or cost model for it yet; not ranked")
            continue
        method = Method(name)
        if (
            method is Method.DRAFT_MODEL
            and workload.memory_gb is not None
            and workload.draft_gb > workload.memory_gb
        ):
            reasons.append(
                f"no draft model: it needs {workload.draft_gb:g} GB, "
                f"{workload.memory_gb:g} GB are free"
            )
            continue
        costs = COSTS[(workload.device, method)]
        if workload.concurrency > 1:
            # Batched decoding is less memory-bound, so each extra verified token costs more.
            slope = costs.verify_slope + 0.02 * (workload.concurrency - 1)
            costs = CostModel(costs.draft_cost, min(slope, 1.0))
        alpha = alpha_for(method, workload)
        k = max(optimal_num_draft(alpha, costs, max_draft=16), 1)
        candidates.append((speedup(alpha, k, costs), method, k, alpha, costs))
    if not candidates:
        return Recommendation(plain, 1.0, [*reasons, "no drafter is available"])
    gain, method, k, alpha, costs = max(candidates, key=lambda c: c[0])
    for other_gain, other, other_k, _, _ in candidates:
        if other is not method:
            reasons.append(f"{other.value} models {other_gain:.2f}x at its best k = {other_k}")
    if gain < MIN_GAIN:
        return Recommendation(
            plain,
            1.0,
            [*reasons, f"the best option, {method.value}, models only {gain:.2f}x: decode plainly"],
        )
    reasons.insert(
        0,
        f"{method.value} on {workload.task} at temperature "
        f"{workload.temperature:g}: prior acceptance {alpha:.2f} per token",
    )
    reasons.insert(
        1,
        f"k = {k} maximises (1 - a^(k+1)) / (1 - a) / (k c + v(k+1)) with draft "
        f"cost c = {costs.draft_cost:g} and verify slope {costs.verify_slope:g} "
        f"on {workload.device}, concurrency {workload.concurrency}",
    )
    reasons.append(
        "draft temperature: the target's (rejection sampling is exact for any; "
        "the same shape keeps acceptance high)"
    )
    return Recommendation(SpecConfig(method=method, num_speculative_tokens=k), gain, reasons)
