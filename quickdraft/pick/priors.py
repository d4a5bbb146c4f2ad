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
  ``--tasks agentic`` (``benchmarks/results/agentic_smollm2``, three sessions), SmolLM2-135M;
* a shipped EAGLE drafter's seven-task bench on its own target, in its ``bench.json``.

They are priors: another model, machine or text moves them, which ``pick --calibrate``
measures. A temperature above 0 lowers acceptance (``picker.at_temperature``).
"""

from __future__ import annotations

import functools
from pathlib import Path

from quickdraft.artifacts import ArtifactError, brief, read_json
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


# A shipped EAGLE drafter measured with its own target keeps its figures beside its weights,
# in ``bench.json`` (``benchmarks/bench_priors.py --write``): the target's weights in that
# run and, per bench label, as _MEASURED, the costs in that target's decode steps and per task
# kind (a dynamic tree verifies more where its drafter is sure: on the 0.5B a code step costs
# 2.03 decode steps and a conversation step 1.23, and one mean cost modelled its code speedup
# at 2.30x against 1.73x measured); tokens: the tree's budget, grafted lookup and bonus token.
BENCH_FILE = "bench.json"


def _prior(row: Row, task: str, source: str, **measured_on: str | None) -> StepPrior:
    """A table row's prior on ``task``; a kind it lacks ("other") takes the mean over the
    seven task kinds."""
    lengths, draft, verify, tokens = row
    return StepPrior(_on(lengths, task), _on(draft, task), _on(verify, task), tokens, source,
                     **measured_on)  # fmt: skip


def _on(figure: Cost, task: str) -> float:
    """``figure`` on ``task``: itself, or its task kind's value, or the mean over the seven
    kinds it has."""
    if not isinstance(figure, dict):
        return float(figure)
    if task in figure:
        return float(figure[task])
    classic = [figure[kind] for kind in TASK_KINDS if kind in figure]
    return sum(classic) / len(classic)


def measured(label: str, task: str) -> StepPrior:
    """The prior of a configuration the SmolLM2 bench ran (its bench label)."""
    return _prior(_MEASURED[label], task, SMOLLM2)


def eagle(label: str, task: str, drafter: Path | None = None) -> StepPrior:
    """An EAGLE configuration's prior: the shipped drafter's (its folder ``drafter``, named
    for its target) own figures where its target's bench measured that label, else SmolLM2's
    drafter's (the label, else the default's)."""
    weights, table = own_bench(drafter) if drafter is not None else ("float", {})
    if label not in table:
        return measured(label if label in _MEASURED else "eagle", task)
    target = drafter.name
    source = f"{target}'s drafter, seven-task bench ({weights} target, CPU)"
    return _prior(table[label], task, source, target=target, weights=weights)


@functools.cache
def own_bench(drafter: Path) -> tuple[str, dict[str, Row]]:
    """A shipped drafter's ``bench.json``: its target's weights and its rows by label (none
    where it has no file)."""
    path = drafter / BENCH_FILE
    if not path.is_file():
        return "float", {}
    remedy = "reinstall quickdraft, or write it again with benchmarks/bench_priors.py --write"
    record = read_json(path, remedy, required=("weights", "labels"))
    try:
        rows = {label: (row["lengths"], row["draft"], row["verify"], int(row["tokens"]))
                for label, row in record["labels"].items()}  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ArtifactError(path, f"a label lacks its figures ({brief(error)})", remedy) from None
    return record["weights"], rows


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
