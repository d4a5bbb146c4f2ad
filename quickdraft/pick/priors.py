"""What ``quickdraft pick`` assumes of each built-in method before it measures anything.

Every figure was measured here, on the two-core CPU of ``benchmarks/results`` (2 threads):

* SmolLM2-135M, every method but draft_model, ``quickdraft bench`` over the seven task kinds
  (``benchmarks/results/smollm2_methods``): mean accepted length per task kind, and the
  drafter's and the verify pass's time per step in decode steps of the target;
* the Qwen2.5-Coder 1.5B / 0.5B pair with an int8 draft (``benchmarks/results/qwen_pair*``,
  ``picker_holdout``): per-token acceptance of a draft model, its cost (a tenth of the
  target's step) and the verify pass's growth (9% of a step per extra token).

* suffix decoding, alone and in front of EAGLE (``benchmarks/results/suffix_hybrid_classic_
  smollm2``, two prompts of each kind), and every method on the agent sessions of
  ``--tasks agentic`` (``benchmarks/results/agentic_smollm2``, three sessions), SmolLM2-135M.

They are priors: another model, machine or text moves them, which ``pick --calibrate``
measures. A temperature above 0 lowers acceptance (``picker.at_temperature``).
"""

from __future__ import annotations

from quickdraft.bench.tasks import TASK_KINDS
from quickdraft.pick.context import StepPrior

SMOLLM2 = "smollm2_methods (SmolLM2-135M, CPU)"
QWEN_PAIR = "qwen_pair (Qwen2.5-Coder 1.5B / int8 0.5B, CPU)"

# Per-token acceptance of an int8 Qwen2.5-Coder-0.5B draft for the 1.5B target, greedy.
DRAFT_MODEL_ALPHA = {
    "code": 0.82, "math": 0.78, "rag": 0.72, "summarization": 0.72, "translation": 0.68,
    "qa": 0.62, "conversation": 0.62, "other": 0.65,
}  # fmt: skip
DRAFT_MODEL_COST = 0.10  # a draft forward, in target decode steps
CPU_VERIFY_SLOPE = 0.09  # each extra verified token, in target decode steps

# A configuration's accepted length per task kind; its drafter's and verify pass's time a
# step (target decode steps), one figure or one per task kind; its tokens verified a step.
Cost = float | dict[str, float]
Row = tuple[dict[str, float], Cost, Cost, int]

# Mean accepted length per task kind, drafter and verify time per step (target decode steps)
# and tokens verified per step, for the configurations the SmolLM2 bench ran.
_MEASURED: dict[str, Row] = {
    "ngram k=5": (
        {"translation": 2.29, "conversation": 1.24, "rag": 1.34, "math": 1.32, "qa": 1.25,
         "summarization": 1.58, "code": 1.46, "agentic": 2.84}, 0.005, 1.252, 6,
    ),
    "medusa": (
        {"translation": 1.08, "conversation": 1.86, "rag": 1.48, "math": 1.99, "qa": 1.21,
         "summarization": 1.45, "code": 1.87}, 0.028, 1.899, 15,
    ),
    "medusa tree=fit:8": (
        {"translation": 1.05, "conversation": 1.78, "rag": 1.44, "math": 1.88, "qa": 1.09,
         "summarization": 1.39, "code": 1.71}, 0.027, 1.520, 9,
    ),
    "eagle": (
        {"translation": 2.29, "conversation": 1.76, "rag": 1.87, "math": 1.92, "qa": 1.95,
         "summarization": 1.91, "code": 2.24, "agentic": 3.67}, 0.097, 1.379, 16,
    ),
    "eagle lookup=0": (
        {"translation": 1.07, "conversation": 1.58, "rag": 1.53, "math": 1.68, "qa": 1.54,
         "summarization": 1.35, "code": 1.66}, 0.087, 1.172, 11,
    ),
    "eagle tree=3,1,3 lookup=0": (
        {"translation": 1.08, "conversation": 1.50, "rag": 1.51, "math": 1.66, "qa": 1.48,
         "summarization": 1.33, "code": 1.60}, 0.114, 1.290, 4,
    ),
    "lookahead": (
        {"translation": 1.99, "conversation": 1.28, "rag": 1.50, "math": 1.56, "qa": 1.42,
         "summarization": 1.61, "code": 1.63, "agentic": 2.04}, 0.002, 1.538, 5,
    ),
    "suffix k=8": (
        {"translation": 2.39, "conversation": 1.30, "rag": 1.28, "math": 1.35, "qa": 1.35,
         "summarization": 1.32, "code": 1.50, "agentic": 3.04}, 0.024, 1.265, 9,
    ),
    "suffix+eagle": (
        {"translation": 2.58, "conversation": 1.41, "rag": 1.61, "math": 1.94, "qa": 2.36,
         "summarization": 1.72, "code": 2.08, "agentic": 4.37}, 0.154, 1.328, 16,
    ),
}  # fmt: skip


# Shipped EAGLE drafters measured with their own targets: drafter (its target's alias) -> the
# target's weights in that run and, per bench label, as _MEASURED (costs in that target's
# decode steps, per task kind: a dynamic tree verifies more where its drafter is sure, so on
# the 0.5B a code step costs 2.03 decode steps and a conversation step 1.23, and one mean cost
# modelled its code speedup at 2.30x against 1.73x measured; tokens: the tree's budget plus
# the grafted lookup and the bonus token).
# Qwen2.5-Coder-1.5B: its seven-task bench, q4, 3 prompts a kind, 128 tokens, Intel Xeon, 2
# threads (benchmarks/results/qwen1.5b_methods; python benchmarks/bench_priors.py FOLDER).
# Qwen2.5-Coder-0.5B: the same bench of its drafter's version 11 and shipped tree (5,3,8,0.1),
# AMD EPYC (benchmarks/results/qwen0.5b_q4_methods).
OWN_EAGLE: dict[str, tuple[str, dict[str, Row]]] = {
    "qwen2.5-coder-0.5b": ("q4", {
        "eagle": (
            {"translation": 2.17, "conversation": 2.35, "rag": 3.72, "math": 2.85, "qa": 1.89,
             "summarization": 3.23, "code": 4.60},
            {"translation": 0.275, "conversation": 0.316, "rag": 0.384, "math": 0.319,
             "qa": 0.312, "summarization": 0.376, "code": 0.458},
            {"translation": 1.297, "conversation": 1.225, "rag": 1.419, "math": 1.617,
             "qa": 1.495, "summarization": 1.918, "code": 2.027}, 14,
        ),
        "eagle lookup=0": (
            {"translation": 2.07, "conversation": 2.26, "rag": 3.19, "math": 2.16, "qa": 1.83,
             "summarization": 2.35, "code": 2.84},
            {"translation": 0.257, "conversation": 0.320, "rag": 0.343, "math": 0.295,
             "qa": 0.302, "summarization": 0.347, "code": 0.389},
            {"translation": 1.134, "conversation": 1.145, "rag": 1.210, "math": 1.280,
             "qa": 1.242, "summarization": 1.370, "code": 1.490}, 9,
        ),
    }),
    "qwen2.5-coder-1.5b": ("q4", {
        "eagle": (
            {"translation": 2.08, "conversation": 2.55, "rag": 3.21, "math": 2.45, "qa": 1.76,
             "summarization": 2.61, "code": 4.74},
            {"translation": 0.186, "conversation": 0.243, "rag": 0.302, "math": 0.189,
             "qa": 0.171, "summarization": 0.193, "code": 0.214},
            {"translation": 1.374, "conversation": 1.417, "rag": 1.439, "math": 1.403,
             "qa": 1.294, "summarization": 1.457, "code": 1.507}, 16,
        ),
        "eagle lookup=0": (
            {"translation": 1.90, "conversation": 2.22, "rag": 2.19, "math": 1.85, "qa": 1.55,
             "summarization": 1.56, "code": 2.02},
            {"translation": 0.190, "conversation": 0.237, "rag": 0.260, "math": 0.182,
             "qa": 0.167, "summarization": 0.175, "code": 0.196},
            {"translation": 1.294, "conversation": 1.292, "rag": 1.285, "math": 1.278,
             "qa": 1.282, "summarization": 1.271, "code": 1.299}, 11,
        ),
    }),
}  # fmt: skip


def _prior(row: Row, task: str, source: str, **measured_on: str | None) -> StepPrior:
    """A table row's prior on ``task``; a kind it lacks ("other") takes the mean over the
    seven task kinds."""
    lengths, draft, verify, tokens = row
    return StepPrior(_on(lengths, task), _on(draft, task), _on(verify, task), tokens, source,
                     **measured_on)  # fmt: skip


def _on(figure: Cost, task: str) -> float:
    """``figure`` on ``task``: itself, or its task kind's value, or the seven kinds' mean."""
    if isinstance(figure, float):
        return figure
    classic = [figure[kind] for kind in TASK_KINDS]
    return figure.get(task, sum(classic) / len(classic))


def measured(label: str, task: str) -> StepPrior:
    """The prior of a configuration the SmolLM2 bench ran (its bench label)."""
    return _prior(_MEASURED[label], task, SMOLLM2)


def eagle(label: str, task: str, drafter: str | None = None) -> StepPrior:
    """An EAGLE configuration's prior: the shipped ``drafter``'s own figures where its
    target's bench measured that label, else SmolLM2's drafter's (the label, else the
    default's)."""
    weights, table = OWN_EAGLE.get(drafter or "", ("float", {}))
    if label not in table:
        return measured(label if label in _MEASURED else "eagle", task)
    source = f"{drafter}'s drafter, seven-task bench ({weights} target, CPU)"
    return _prior(table[label], task, source, target=drafter, weights=weights)


def chain_tokens(alpha: float, k: int) -> float:
    """Expected tokens per step of a k-token chain with per-token acceptance alpha:
    (1 - alpha^(k+1)) / (1 - alpha)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def chain_alpha(tokens: float, k: int) -> float:
    """The per-token acceptance whose k-token chain yields ``tokens`` per step (bisection)."""
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if chain_tokens(middle, k) < tokens else (low, middle)
    return (low + high) / 2


def draft_model(k: int, task: str) -> StepPrior:
    alpha = DRAFT_MODEL_ALPHA.get(task, DRAFT_MODEL_ALPHA["other"])
    verify = 1.0 + CPU_VERIFY_SLOPE * k
    return StepPrior(chain_tokens(alpha, k), DRAFT_MODEL_COST * k, verify, k + 1, QWEN_PAIR)


def ngram(k: int, task: str) -> StepPrior:
    """Prompt lookup at k: the acceptance that explains its measured k = 5 chain, carried to
    k; its search costs next to nothing, the verify pass grows as measured at k = 5."""
    base = measured("ngram k=5", task)
    alpha = chain_alpha(base.expected_tokens, 5)
    slope = (base.verify_cost - 1.0) / 5
    return StepPrior(chain_tokens(alpha, k), base.draft_cost, 1.0 + slope * k, k + 1, SMOLLM2)
