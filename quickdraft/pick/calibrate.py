"""``quickdraft pick --calibrate``: measure every candidate on the user's prompts, then pick.

1. Forward costs on this machine: the target's forward of T tokens (T = 1 .. the most any
   chain verifies) after a context as long as the prompts; v(1) is a plain decoding step.
2. Candidates: every registered method's (``picker.options``). Chains (``PickSupport.chain``:
   draft_model, ngram) run once at their largest k per configuration; the acceptance by
   position a_i and the share of steps proposing at least i tokens p_i predict every smaller
   k: E(k) = 1 + sum_{i<=k} p_i a_1..a_i, with the draft's time per token (a draft model, as
   measured in that run: a shortlisted head's saving counts) or per step (a lookup) and
   v(k + 1). Other candidates (trees, lookahead) are run each: their
   mean accepted length E, draft and verify seconds per step.
3. Predicted speedup = E * v(1) / (draft + verify per step). The best and the runner-up (the
   best of another method) then run beside plain decoding on the same prompts, interleaved
   prompt by prompt, and the faster one measured is the choice.

Everything fits ``budget_seconds``: the prompts each candidate runs on are cut to what the
budget allows, from a plain-decoding estimate of a run's cost, keeping a third of it for the
confirmation.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from quickdraft.config import Method, SamplingParams, SpecConfig
from quickdraft.drafters import registry
from quickdraft.engine import generate
from quickdraft.models.base import Model, Tokenizer
from quickdraft.pick.candidates import support
from quickdraft.pick.context import PickContext, StepPrior
from quickdraft.pick.picker import Option, Recommendation, Workload, choose, finish, options
from quickdraft.stats import Stats

Progress = Callable[[str, int, int], None]
CONFIRM_SHARE = 1 / 3  # of the budget, for the interleaved run against plain decoding


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
class ChainProfile:
    """A chain measured at its largest k: acceptance by position and cost per token/step."""

    acceptance: list[float]  # a_i, i = 1..k (0 where never reached)
    proposed: list[float]  # p_i: share of steps proposing at least i tokens
    draft_seconds_per_token: float  # a draft model's forward; 0 for lookup drafters
    draft_seconds_per_step: float  # a lookup drafter's search; 0 for draft models

    def draft_seconds(self, k: int) -> float:
        return k * self.draft_seconds_per_token + self.draft_seconds_per_step

    def expected_tokens(self, k: int) -> float:
        total, chain = 1.0, 1.0
        for i in range(min(k, len(self.acceptance))):
            chain *= self.acceptance[i]
            total += self.proposed[i] * chain
        return total


@dataclass(slots=True)
class Measured:
    """A candidate's measured step: expected tokens, draft and verify seconds."""

    label: str
    spec: SpecConfig
    expected_tokens: float
    draft_seconds: float
    verify_seconds: float
    predicted: float
    verified_tokens: int


@dataclass(slots=True)
class Calibration:
    verify_seconds: dict[int, float]
    measured: list[Measured]
    choice: Recommendation
    prompts_used: int
    confirmed: dict[str, float] = field(default_factory=dict)  # label -> measured speedup
    seconds: float = 0.0

    @property
    def measured_speedup(self) -> float | None:
        return self.confirmed.get(self.choice.label)


def _sampling(workload: Workload, max_new_tokens: int, stop: tuple[int, ...]) -> SamplingParams:
    return SamplingParams(
        temperature=workload.temperature, max_new_tokens=max_new_tokens, seed=0,
        stop_token_ids=stop,
    )  # fmt: skip


def _run(target, prompts, sampling, spec, draft, tokenizers) -> Stats:
    """One spec over the prompts, pooled stats (times and acceptance). ``tokenizers``: the
    target's and the draft's, which ``generate`` checks a draft's vocabulary against."""
    uses_draft = registry.get(spec.method).draft_model
    pooled = Stats(k=0)
    for prompt in prompts:
        out = _generate(target, prompt, sampling, spec, draft if uses_draft else None, tokenizers)
        stats = out.stats
        pooled.k = max(pooled.k, stats.k)
        pooled.accepted_drafts.extend(stats.accepted_drafts)
        pooled.drafted.extend(stats.drafted)
        pooled.new_tokens += stats.new_tokens
        pooled.target_forwards += stats.target_forwards
        pooled.time_draft += stats.time_draft
        pooled.time_verify += stats.time_verify
        pooled.time_prefill += stats.time_prefill
        pooled.time_total += stats.time_total
    return pooled


def _generate(target, prompt, sampling, spec, draft, tokenizers):
    tokenizer, draft_tokenizer = tokenizers
    if draft is None:
        draft_tokenizer = None
    return generate(target, prompt, sampling=sampling, spec=spec, draft=draft,
                    tokenizer=tokenizer, draft_tokenizer=draft_tokenizer)  # fmt: skip


def calibrate(
    target: Model,
    prompts: list[list[int]],
    context: PickContext,
    workload: Workload | None = None,
    *,
    draft: Model | None = None,
    max_new_tokens: int = 48,
    stop_token_ids: tuple[int, ...] = (),
    budget_seconds: float = 300.0,
    confirm: bool = True,
    progress: Progress | None = None,
    tokenizer: Tokenizer | None = None,
    draft_tokenizer: Tokenizer | None = None,
) -> Calibration:
    """Measure the candidate configurations on ``prompts`` and choose. ``tokenizer`` and
    ``draft_tokenizer``: the target's and the draft's, for a draft model whose vocabulary is
    padded to another size (as ``generate`` and ``bench`` take it), and to refuse a draft of
    another tokenizer as they do."""
    if not prompts:
        raise ValueError("calibrate: no prompts")
    if budget_seconds <= 0:
        raise ValueError(f"budget_seconds must be > 0, got {budget_seconds}")
    started = time.perf_counter()
    workload = workload or Workload()
    ranked, reasons = options(workload, context, cooler_drafts=True)
    candidates = [o for o in ranked if o.spec.method is not Method.AR]
    chains = _chain_groups(candidates)
    singles = [o for o in candidates if not _is_chain(o)]
    k_max = max((s.num_speculative_tokens for s in chains), default=1)
    context_tokens = int(statistics.median(len(p) for p in prompts)) + max_new_tokens // 2
    verify_seconds = forward_costs(target, context_tokens, list(range(1, k_max + 2)))
    step = verify_seconds[1]
    runs = len(chains) + len(singles)
    # A run of n prompts costs about n * max_new_tokens plain steps (speculation is cheaper,
    # a slow drafter dearer); the budget's measuring share sets n.
    per_prompt = max_new_tokens * step
    affordable = (1 - CONFIRM_SHARE) * budget_seconds / max(runs * per_prompt, 1e-9)
    used = max(1, min(len(prompts), int(affordable)))
    chosen_prompts = prompts[:used]
    sampling = _sampling(workload, max_new_tokens, stop_token_ids)
    tokenizers = (tokenizer, draft_tokenizer)
    measured: list[Measured] = []
    done = 0
    for spec in chains:
        stats = _run(target, chosen_prompts, sampling, spec, draft, tokenizers)
        profile = _chain_profile(stats, spec)
        for option in candidates:
            if _is_chain(option) and _chain_key(option.spec) == _chain_key(spec):
                k = option.spec.num_speculative_tokens
                tokens = profile.expected_tokens(k)
                draft_s, verify_s = profile.draft_seconds(k), verify_seconds[k + 1]
                measured.append(Measured(option.label, option.spec, tokens, draft_s, verify_s,
                                         tokens * step / (draft_s + verify_s), k + 1))  # fmt: skip
        done += 1
        if progress is not None:
            progress("measuring", done, runs)
    for option in singles:
        stats = _run(target, chosen_prompts, sampling, option.spec, draft, tokenizers)
        steps = max(stats.target_forwards, 1)
        tokens = stats.new_tokens / steps
        draft_s, verify_s = stats.time_draft / steps, stats.time_verify / steps
        verified = 1 + round(sum(stats.drafted) / max(len(stats.drafted), 1))
        predicted = tokens * step / max(draft_s + verify_s, 1e-9)
        measured.append(Measured(option.label, option.spec, tokens, draft_s, verify_s,
                                 predicted, verified))  # fmt: skip
        done += 1
        if progress is not None:
            progress("measuring", done, runs)
    rescored = [_as_option(m, step, workload, context.target) for m in measured]
    rescored.append(next(o for o in ranked if o.spec.method is Method.AR))
    rescored.sort(key=lambda o: (-o.speedup, o.label))
    reasons = [f"measured on {used} of {len(prompts)} prompts, {max_new_tokens} tokens each",
               *reasons]  # fmt: skip
    choice = choose(rescored, reasons, workload, context)
    calibration = Calibration(verify_seconds, measured, choice, used)
    if confirm and choice.speculate:
        _confirm(calibration, target, chosen_prompts, sampling, draft, rescored, workload,
                 context, progress, tokenizers)  # fmt: skip
    calibration.seconds = time.perf_counter() - started
    return calibration


def _confirm(calibration, target, prompts, sampling, draft, rescored, workload, context,
             progress, tokenizers) -> None:  # fmt: skip
    """Plain decoding, the choice and the runner-up (another method's best), interleaved
    prompt by prompt; the faster of the two measured becomes the choice."""
    choice = calibration.choice
    first = next(o for o in rescored if o.label == choice.label)
    runner = next(
        (o for o in rescored if o.spec.method not in (Method.AR, first.spec.method)), None
    )
    contenders = [("ar", SpecConfig(method=Method.AR)), (first.label, choice.spec)]
    if runner is not None:
        contenders.append((runner.label, dataclasses.replace(
            runner.spec, disable_by_batch_size=choice.spec.disable_by_batch_size)))  # fmt: skip
    rates: dict[str, list[float]] = {label: [] for label, _ in contenders}
    for index, prompt in enumerate(prompts):
        for label, spec in contenders:
            uses_draft = registry.get(spec.method).draft_model
            out = _generate(target, prompt, sampling, spec, draft if uses_draft else None,
                            tokenizers)  # fmt: skip
            rates[label].append(out.stats.decode_tokens_per_second)
        if progress is not None:
            progress("confirming", index + 1, len(prompts))
    for label, _ in contenders[1:]:
        ratios = [r / a for r, a in zip(rates[label], rates["ar"], strict=True) if a > 0]
        calibration.confirmed[label] = statistics.median(ratios) if ratios else float("nan")
    best_label = max(calibration.confirmed, key=lambda label: calibration.confirmed[label])
    if calibration.confirmed[best_label] < 1.0:
        why = "confirmed: no candidate beat plain decoding on these prompts"
        plain = Recommendation("ar", SpecConfig(method=Method.AR), 1.0,
                               [why, *choice.reasons], rescored)  # fmt: skip
        calibration.choice = finish(plain, context)
    elif best_label != choice.label and runner is not None:
        # The runner-up as measured, first among the rest: choose() keeps it.
        measured = dataclasses.replace(runner, speedup=calibration.confirmed[best_label])
        others = [o for o in rescored if o.label != runner.label]
        calibration.choice = choose([measured, *others], [], workload, context)
        calibration.choice.reasons.insert(
            0,
            f"confirmed: {runner.label} measured {calibration.confirmed[best_label]:.2f}x "
            f"against {calibration.confirmed[choice.label]:.2f}x for {choice.label}",
        )
    else:
        choice.reasons.insert(
            0, f"confirmed: {calibration.confirmed[choice.label]:.2f}x over plain decoding"
        )


def _is_chain(option: Option) -> bool:
    return support(str(option.spec.method)).chain


def _chain_key(spec: SpecConfig) -> SpecConfig:
    return dataclasses.replace(spec, num_speculative_tokens=1)


def _chain_groups(candidates: list[Option]) -> list[SpecConfig]:
    """One spec per chain configuration (a method with its shortlist and draft temperature)
    at the largest k among its candidates, keyed by its k = 1 form."""
    groups: dict[SpecConfig, int] = {}
    for option in candidates:
        if _is_chain(option):
            key = _chain_key(option.spec)
            groups[key] = max(groups.get(key, 0), option.spec.num_speculative_tokens)
    return [dataclasses.replace(key, num_speculative_tokens=k) for key, k in groups.items()]


def _chain_profile(stats: Stats, spec: SpecConfig) -> ChainProfile:
    """A draft model's time is per drafted token, measured in the run itself (so a shortlisted
    head's saving counts); a lookup's is per step."""
    k = spec.num_speculative_tokens
    steps = max(len(stats.drafted), 1)
    uses_model = registry.get(spec.method).draft_model
    draft_forward = stats.time_draft / max(sum(stats.drafted), 1)
    acceptance = [0.0 if a != a else a for a in stats.acceptance_by_position]
    acceptance += [0.0] * (k - len(acceptance))
    return ChainProfile(
        acceptance=acceptance[:k],
        proposed=[sum(d >= i for d in stats.drafted) / steps for i in range(1, k + 1)],
        draft_seconds_per_token=draft_forward if uses_model else 0.0,
        draft_seconds_per_step=0.0 if uses_model else stats.time_draft / steps,
    )


def _as_option(measured: Measured, step: float, workload: Workload, target: str) -> Option:
    prior = StepPrior(
        measured.expected_tokens, measured.draft_seconds / step, measured.verify_seconds / step,
        measured.verified_tokens, "measured on your prompts", workload.temperature,
        target, workload.weights,
    )  # fmt: skip
    return Option(measured.label, measured.spec, prior, measured.predicted)


def describe(calibration: Calibration) -> dict[str, Any]:
    return {
        "verify_ms": {t: 1000 * s for t, s in calibration.verify_seconds.items()},
        "measured": [
            {
                "label": m.label,
                "expected_tokens": m.expected_tokens,
                "draft_ms_per_step": 1000 * m.draft_seconds,
                "verify_ms_per_step": 1000 * m.verify_seconds,
                "predicted_speedup": m.predicted,
            }
            for m in sorted(calibration.measured, key=lambda m: -m.predicted)
        ],
        "prompts_used": calibration.prompts_used,
        "confirmed_speedup": calibration.confirmed,
        "seconds": calibration.seconds,
        **calibration.choice.as_dict(),
    }
