"""Choose how to speculate for a workload: method, k or tree, shortlist, draft temperature and
the batch threshold, among every method in the registry (``drafters.registry``).

The picker's table of methods (``pick.candidates``, keyed by name) says what each can offer
here (``PickSupport.candidates``: k values, tree shapes, shortlists, given the drafters and
artifacts the deployment has) and what one step of each costs and yields before measuring
(``prior``, measured here: ``pick/priors.py``); ``interop.launch`` says how other engines take
it. A method registered later shows up with a generic candidate and no change here.
``quickdraft.pick.calibrate`` replaces the priors with measurements on the user's prompts.

The model of a step: with E expected tokens per target forward, a draft costing c and a verify
pass costing v (both in target decode steps), speculation runs E / (c + v) times as fast as
plain decoding. The priors are float SmolLM2 figures; the deployed target's measured step and
verify costs (``pick.costs``) carry them to its size and weights (a q4 1.5B verifies 16 tokens
for 2.1 of its steps, SmolLM2 for 2.5). Temperature lowers E; concurrent requests make each
extra verified token cost more. The tutorial's three rules come first: outputs of 1-5 tokens,
very high temperature, and no memory for a drafter.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quickdraft.bench.tasks import SESSION_KINDS, TASK_KINDS
from quickdraft.config import MAX_BATCH, Method, SpecConfig
from quickdraft.drafters import registry
from quickdraft.drafters.draft_model.options import DraftModelOptions
from quickdraft.interop.launch import NAMES, LaunchConfig, launch_configs
from quickdraft.pick import costs
from quickdraft.pick.candidates import support
from quickdraft.pick.context import PickContext, StepPrior

MIN_GAIN = 1.05  # below this modelled speedup, speculation is not worth its complexity
SHORT_OUTPUT = 5  # tokens: drafting overhead dominates outputs this short
HIGH_TEMPERATURE = 1.5
TEMPERATURE_PENALTY = 0.25  # share of the extra tokens lost at temperature 1
CONCURRENCY_SLOPE = 0.02  # extra verify cost per verified token and per extra request
GPU_VERIFY_SLOPE = 0.01  # a GPU verifies a few more tokens almost for free
MODELLED_BATCH = 256  # the batch threshold is searched up to this many requests
# Workloads the picker knows: the bench's task kinds, agent sessions, and anything else.
PICK_TASKS = (*TASK_KINDS, *SESSION_KINDS, "other")


@dataclass(frozen=True, slots=True)
class Workload:
    """task: a task kind or "other"; temperature: the target's; output_tokens: typical output
    length; concurrency: requests decoded together; memory_gb: memory free for a drafter
    (None: plenty); draft_gb: the draft model's size; methods: the registered methods to
    consider (None: all; plain decoding always is); device: cpu or gpu; weights: the target's
    (float, or quantized on CPU: int8, q4)."""

    task: str = "other"
    temperature: float = 0.0
    output_tokens: int = 256
    concurrency: int = 1
    memory_gb: float | None = None
    draft_gb: float = 1.0
    methods: tuple[str, ...] | None = None
    device: str = "cpu"
    weights: str = "float"

    def __post_init__(self) -> None:
        if self.task not in PICK_TASKS:
            raise ValueError(f"task must be one of {', '.join(PICK_TASKS)}; got {self.task!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {self.output_tokens}")
        if not 1 <= self.concurrency <= MAX_BATCH:
            raise ValueError(f"concurrency must be in 1..{MAX_BATCH}, got {self.concurrency}")
        if self.memory_gb is not None and not (
            math.isfinite(self.memory_gb) and self.memory_gb >= 0
        ):
            raise ValueError(f"memory_gb must be a finite number >= 0, got {self.memory_gb}")
        if not (math.isfinite(self.draft_gb) and self.draft_gb >= 0):
            raise ValueError(f"draft_gb must be a finite number >= 0, got {self.draft_gb}")
        if self.methods is not None:
            registered = registry.names()
            unknown = [m for m in self.methods if m not in registered]
            if unknown:
                raise ValueError(f"methods: unknown {unknown}; registered: {', '.join(registered)}")
        if self.device not in ("cpu", "gpu"):
            raise ValueError(f"device must be cpu or gpu, got {self.device!r}")
        if self.weights not in costs.WEIGHTS:
            raise ValueError(
                f"weights must be one of {', '.join(costs.WEIGHTS)}, got {self.weights!r}"
            )
        if self.weights != "float" and self.device != "cpu":
            raise ValueError(f"weights: {self.weights} targets run on CPU kernels, not on a GPU")


@dataclass(frozen=True, slots=True)
class Option:
    """One candidate configuration with what the picker expects of it."""

    label: str
    spec: SpecConfig
    prior: StepPrior
    speedup: float


def at_temperature(tokens: float, temperature: float) -> float:
    """Expected tokens per step at a sampling temperature: sampling makes agreement harder,
    a quarter of the extra tokens lost at temperature 1 (and beyond)."""
    return 1.0 + (tokens - 1.0) * (1.0 - TEMPERATURE_PENALTY * min(temperature, 1.0))


def modelled_speedup(
    prior: StepPrior, workload: Workload, concurrency: int | None = None, target: str | None = None
) -> float:
    """E / (draft + verify) for one step of ``prior`` under ``workload`` on ``target`` (an
    alias; its measured step and verify costs, ``pick.costs``)."""
    if prior.verified_tokens <= 1 and prior.draft_cost == 0:
        return 1.0  # plain decoding
    requests = workload.concurrency if concurrency is None else concurrency
    extra = prior.verified_tokens - 1
    if workload.device == "gpu":
        verify, draft = 1.0 + GPU_VERIFY_SLOPE * extra, prior.draft_cost
    else:
        draft, verify = deployed_costs(prior, target, workload.weights)
    verify += CONCURRENCY_SLOPE * (requests - 1) * extra
    tokens = prior.expected_tokens
    if prior.temperature != workload.temperature:  # priors are greedy figures
        tokens = at_temperature(tokens, workload.temperature)
    return tokens / (draft + verify)


def deployed_costs(prior: StepPrior, target: str | None, weights: str) -> tuple[float, float]:
    """A prior's draft and verify costs in decode steps of ``target`` in ``weights`` on CPU."""
    measured_on = (prior.target, prior.weights)
    return (
        costs.draft_cost(prior.draft_cost, target, weights, measured_on),
        costs.verify_cost(prior.verify_cost, prior.verified_tokens, target, weights, measured_on),
    )


def batch_threshold(prior: StepPrior, workload: Workload, target: str | None = None) -> int | None:
    """The most concurrent requests at which drafting still pays (the engine's
    ``disable_by_batch_size``); None if it still pays at ``MODELLED_BATCH``."""
    for requests in range(1, MODELLED_BATCH + 1):
        if modelled_speedup(prior, workload, requests, target) < 1.0:
            return max(requests - 1, 1)
    return None


@dataclass(slots=True)
class Recommendation:
    """The choice, why, the alternatives, and its forms for quickdraft and other engines."""

    label: str
    spec: SpecConfig
    predicted_speedup: float
    reasons: list[str] = field(default_factory=list)
    options: list[Option] = field(default_factory=list)
    engines: list[LaunchConfig] = field(default_factory=list)
    target_path: str | None = None
    target_alias: str | None = None  # the alias ``target_path`` was converted from

    @property
    def speculate(self) -> bool:
        return self.spec.method is not Method.AR

    def quickdraft_json(self) -> dict[str, Any]:
        """The spec's fields that differ from the defaults: ``--speculative-config`` of
        ``quickdraft generate`` and ``quickdraft serve`` as it is."""
        return registry.spec_fields(self.spec)

    def engine(self, name: str) -> LaunchConfig | None:
        return next((e for e in self.engines if e.engine == name), None)

    def as_dict(self) -> dict[str, Any]:
        target = self.target_path or "<target>"
        return {
            "choice": self.label,
            "quickdraft": self.quickdraft_json(),
            "predicted_speedup": self.predicted_speedup,
            "reasons": self.reasons,
            "options": [
                {"label": o.label, "speedup": o.speedup, "source": o.prior.source}
                for o in self.options
            ],
            "engines": {e.engine: e.as_dict(target) for e in self.engines},
        }

    def as_text(self) -> str:
        lines = [
            f"recommendation: {self.label} (modelled speedup {self.predicted_speedup:.2f}x)",
            "because:",
        ]
        lines += [f"  - {reason}" for reason in self.reasons]
        if self.options:
            shown = ", ".join(f"{o.label} {o.speedup:.2f}x" for o in self.options[:8])
            lines.append(f"candidates (best first): {shown}")
        lines.append("quickdraft: " + json.dumps(self.quickdraft_json()))
        target = self.target_path or "<target>"
        converted = self.target_path is not None and self.target_path != self.target_alias
        if converted and not Path(str(self.target_path)).exists():
            lines.append(
                f"the target's folder is written by its first load: quickdraft generate "
                f"--target {self.target_alias} --max-new-tokens 1"
            )
        for config in self.engines:
            name = NAMES.get(config.engine, config.engine)
            command = config.command(target)
            if command is None:
                lines.append(f"{name}: not available ({config.note})")
                continue
            for step in config.prepare:
                lines.append(f"{name}: first: {step}")
            if config.engine == "vllm" and config.speculative:
                lines.append(f"{name}: speculative_config {json.dumps(config.speculative)}")
            lines.append(f"{name}: {command}")
            if config.note:
                lines.append(f"{name}: note: {config.note}")
        return "\n".join(lines)


def options(
    workload: Workload, context: PickContext, cooler_drafts: bool = False
) -> tuple[list[Option], list[str]]:
    """Every candidate of every registered method (or ``workload.methods``), ranked by the
    prior model, and the reasons some methods offer none. ``cooler_drafts``: at a temperature
    above 0, methods with a draft temperature also offer a draft at 0.7 of the target's (for
    calibration to measure; the prior has no figure that tells them apart)."""
    reasons: list[str] = []
    found: list[Option] = []
    for entry in registry.entries():
        chosen = workload.methods is None or entry.name in workload.methods
        if not chosen and entry.drafts:  # plain decoding is always the baseline
            continue
        method = support(entry.name)
        if (
            entry.draft_model
            and context.draft is not None
            and workload.memory_gb is not None
            and workload.draft_gb > workload.memory_gb
        ):
            reasons.append(
                f"{entry.name}: the draft model needs {workload.draft_gb:g} GB, "
                f"{workload.memory_gb:g} GB are free"
            )
            continue
        candidates = method.candidates(context)
        has_draft_temperature = "draft_temperature" in entry.option_names()
        if cooler_drafts and workload.temperature > 0 and has_draft_temperature:
            cooler = round(0.7 * workload.temperature, 3)
            candidates += [
                (f"{label} draft_temperature={cooler:g}",
                 registry.with_options(spec, draft_temperature=cooler))
                for label, spec in candidates
            ]  # fmt: skip
        for label, spec in candidates:
            prior = method.prior(spec, workload.task)
            speedup = modelled_speedup(prior, workload, target=context.target)
            found.append(Option(label, spec, prior, speedup))
        if entry.name in context.missing:
            reasons.append(f"{entry.name}: {context.missing[entry.name]}")
    found.sort(key=lambda o: (-o.speedup, o.label))
    return found, reasons


def pick(workload: Workload, context: PickContext) -> Recommendation:
    """The recommendation from priors alone."""
    plain = SpecConfig(method=Method.AR)
    if workload.output_tokens <= SHORT_OUTPUT:
        return finish(
            Recommendation("ar", plain, 1.0, [
                f"outputs of {workload.output_tokens} tokens: drafting and verification "
                f"overhead dominates outputs of 1-{SHORT_OUTPUT} tokens; decode plainly"
            ]),
            context,
        )  # fmt: skip
    if workload.temperature >= HIGH_TEMPERATURE:
        return finish(
            Recommendation("ar", plain, 1.0, [
                f"temperature {workload.temperature:g} is very high: draft tokens are rarely "
                "accepted, so speculation costs more than it saves"
            ]),
            context,
        )  # fmt: skip
    ranked, reasons = options(workload, context)
    return choose(ranked, reasons, workload, context)


def choose(
    ranked: list[Option], reasons: list[str], workload: Workload, context: PickContext
) -> Recommendation:
    """The best of ``ranked`` (by ``speedup``), with plain decoding when nothing gains enough,
    the batch threshold and a draft temperature."""
    speculative = [o for o in ranked if o.spec.method is not Method.AR]
    plain = SpecConfig(method=Method.AR)
    if not speculative:
        return finish(Recommendation("ar", plain, 1.0, [*reasons, "no drafter is available"],
                                     ranked), context)  # fmt: skip
    best = speculative[0]
    if best.speedup < MIN_GAIN:
        why = f"the best option, {best.label}, models only {best.speedup:.2f}x: decode plainly"
        return finish(Recommendation("ar", plain, 1.0, [*reasons, why], ranked), context)
    spec, notes = best.spec, []
    threshold = batch_threshold(best.prior, workload, context.target)
    spec = dataclasses.replace(spec, disable_by_batch_size=threshold)
    notes.append(
        f"batch policy: draft while at most {threshold} requests decode together "
        "(beyond that the modelled gain falls below 1)"
        if threshold is not None
        else "batch policy: drafting pays at every batch size modelled"
    )
    if threshold is not None and workload.concurrency > threshold:
        notes.append(
            f"at the stated concurrency ({workload.concurrency}) the engine would decode "
            "plainly most of the time"
        )
    own = registry.resolve(spec)[1]
    if isinstance(own, DraftModelOptions):
        chosen = own.draft_temperature
        notes.append(
            "draft temperature: the target's (any keeps the output exact; the same shape "
            "keeps acceptance high; pick --calibrate also measures a cooler draft)"
            if chosen is None
            else f"draft temperature {chosen:g}: measured faster than the target's"
        )
    head = [
        f"{best.label} on {workload.task} at temperature {workload.temperature:g}: "
        f"{_tokens_at(best.prior, workload):.2f} tokens per "
        f"target forward, draft {best.prior.draft_cost:.2f} and verify "
        f"{best.prior.verify_cost:.2f} target steps ({best.prior.source})",
    ]
    if workload.weights != "float" and workload.device == "cpu":
        weights = workload.weights
        draft, verify = deployed_costs(best.prior, context.target, weights)
        head.append(
            f"{weights} target: a step costs {costs.step_ratio(context.target, weights):.2f} "
            f"of a float one; here the drafter costs {draft:.2f} of its steps and verifying "
            f"{best.prior.verified_tokens} tokens {verify:.2f} (measured costs, pick/costs.py)"
        )
    runner = next((o for o in speculative[1:] if o.spec.method != best.spec.method), None)
    if runner is not None:
        head.append(f"runner-up: {runner.label}, {runner.speedup:.2f}x")
    recommendation = Recommendation(
        best.label, spec, best.speedup, [*head, *notes, *reasons], ranked
    )
    return finish(recommendation, context)


def _tokens_at(prior: StepPrior, workload: Workload) -> float:
    if prior.temperature == workload.temperature:
        return prior.expected_tokens
    return at_temperature(prior.expected_tokens, workload.temperature)


def finish(recommendation: Recommendation, context: PickContext) -> Recommendation:
    """The engine forms of the choice, with the target as other engines load it."""
    recommendation.engines = launch_configs(recommendation.spec, context)
    threshold = recommendation.spec.disable_by_batch_size
    for config in recommendation.engines:
        # vLLM's batch policy has the same meaning (and needs at least 2); SGLang has none.
        if config.engine == "vllm" and config.speculative and threshold and threshold >= 2:
            config.speculative["disable_by_batch_size"] = threshold
    from quickdraft.interop.launch import model_path

    # The folder's name only: the picker answers in a second, and the alias's conversion
    # (minutes for the 1.5B) happens at its first load (``as_text`` says how, if not yet).
    recommendation.target_path = model_path(context.target, convert=False)
    recommendation.target_alias = context.target
    return recommendation
