"""What a verify pass and a decode step cost on the deployment's target, against the target the
priors were measured on.

The priors (``pick.priors``) are float SmolLM2-135M figures: a verify pass of T tokens in its
decode steps, the drafter's time in its decode steps. Another target or weight format moves
both: a quantized step is cheaper, so a drafter costs more of it, and with the weights
streamed at the memory rate the extra rows of a verify pass are most of its cost. The model
keeps what a prior says of its own configuration (tree building, attention over the tree,
bookkeeping: its verify cost above the reference curve at the same T) and replaces the
reference's curve with the deployment's.

Measured in one run after a 200-token prefix, 2 threads, Intel Xeon with AVX-512 VNNI (AMX
listed, unused), the q4 and int8 targets on the superblock kernel's VNNI path
(``python benchmarks/quant_targets.py MODEL --quants float,int8,q4``;
``benchmarks/results/quant_targets/``): a decode step's time against the float step of the same
target, and a verify pass of 4, 8 and 16 tokens in the same target's decode steps.
"""

from __future__ import annotations

from itertools import pairwise

REFERENCE = "smollm2-135m"  # the priors' target
# Targets with no figures of their own take the 1.5B's: on larger models the weights' stream
# dominates a step as it does there, SmolLM2's per-layer overhead does not.
STAND_IN = "qwen2.5-coder-1.5b"

Curve = dict[int, float]
# target -> weights -> (decode step against the float step, verify cost of T tokens in steps)
MEASURED: dict[str, dict[str, tuple[float, Curve]]] = {
    "smollm2-135m": {
        "float": (1.0, {1: 1.0, 4: 1.27, 8: 1.36, 16: 1.55}),  # 41.7 ms a step
        "int8": (0.20, {1: 1.0, 4: 1.42, 8: 1.80, 16: 2.43}),  # 8.4 ms
        "q4": (0.20, {1: 1.0, 4: 1.44, 8: 1.81, 16: 2.48}),  # 8.2 ms
    },
    "qwen2.5-coder-0.5b": {
        "float": (1.0, {1: 1.0, 4: 1.30, 8: 1.43, 16: 1.74}),  # 91.5 ms
        "int8": (0.26, {1: 1.0, 4: 1.20, 8: 1.43, 16: 1.81}),  # 23.8 ms
        "q4": (0.26, {1: 1.0, 4: 1.39, 8: 1.65, 16: 2.25}),  # 23.7 ms
    },
    "qwen2.5-coder-1.5b": {
        "float": (1.0, {1: 1.0, 4: 1.30, 8: 1.48, 16: 1.74}),  # 237.7 ms
        "int8": (0.32, {1: 1.0, 4: 1.28, 8: 1.45, 16: 1.79}),  # 75.1 ms
        "q4": (0.20, {1: 1.0, 4: 1.18, 8: 1.43, 16: 2.10}),  # 47.5 ms
    },
}
WEIGHTS = tuple(MEASURED[REFERENCE])


def at(curve: Curve, tokens: int) -> float:
    """The curve at ``tokens``: linear between measured sizes, and past the largest along the
    slope of its last segment (a verify pass grows about linearly once its rows are the
    cost)."""
    sizes = sorted(curve)
    tokens = max(tokens, sizes[0])
    for low, high in pairwise(sizes):
        if tokens <= high:
            return curve[low] + (curve[high] - curve[low]) * (tokens - low) / (high - low)
    low, high = sizes[-2], sizes[-1]
    return curve[high] + (curve[high] - curve[low]) * (tokens - high) / (high - low)


def _figures(target: str | None, weights: str) -> tuple[float, Curve]:
    if target in MEASURED:
        return MEASURED[target][weights]
    if weights == "float":  # an unmeasured float target: the priors as they are
        return MEASURED[REFERENCE]["float"]
    return MEASURED[STAND_IN][weights]


def step_ratio(target: str | None, weights: str) -> float:
    """The target's decode step in ``weights`` against its float step."""
    return _figures(target, weights)[0]


def verify_cost(
    cost: float,
    tokens: int,
    target: str | None,
    weights: str,
    measured_on: tuple[str | None, str] = (REFERENCE, "float"),
) -> float:
    """A verify cost of ``tokens`` tokens measured on ``measured_on`` (target, weights; in its
    decode steps), carried to ``target`` in ``weights`` (in that one's decode steps)."""
    source = _figures(*measured_on)[1]
    return cost - at(source, tokens) + at(_figures(target, weights)[1], tokens)


def draft_cost(
    cost: float,
    target: str | None,
    weights: str,
    measured_on: tuple[str | None, str] = (REFERENCE, "float"),
) -> float:
    """A drafter's time measured in ``measured_on``'s decode steps, in ``target``'s steps in
    ``weights``: a drafter costs more of a quantized step. Across targets the drafter is
    taken to scale with its target (each target's drafter is sized for it)."""
    return cost * step_ratio(*measured_on) / step_ratio(target, weights)
