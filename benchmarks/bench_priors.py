"""A seven-task bench's runs as the picker's priors (``quickdraft/pick/priors.py``): per
method label, the mean accepted length per task kind, the drafter's and the verify pass's
time per step in the target's decode steps (plain decoding's time a token on the same kind in
the same run), per task kind too (a dynamic tree verifies more tokens where its drafter is
sure: the 0.5B's code steps cost 2.03 decode steps against 1.23 on conversation, and one mean
cost for every kind modelled its code speedup at 2.30x where it measured 1.73x), and the most
tokens a step verified (the priors' convention: a configuration's budget; for a tree, whose
runs count the longest path drafted, set its budget by hand: nodes, grafted lookup tokens and
the bonus token).

    python benchmarks/bench_priors.py benchmarks/results/qwen1.5b_methods

``--write FOLDER`` stores the EAGLE labels' figures as a shipped drafter's ``bench.json``,
which ``quickdraft pick`` reads for that drafter's target (``pick/priors.py``), with each
label's budget given by ``--budget``:

    python benchmarks/bench_priors.py benchmarks/results/qwen0.5b_q4_methods \\
        --budget eagle:14 --budget "eagle lookup=0:9" \\
        --write quickdraft/drafters/eagle/artifacts/qwen2.5-coder-0.5b

It refuses a bench of another target or of fewer than the seven task kinds, and an EAGLE
label without its budget (or a budget of no label).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from quickdraft.bench.tasks import TASK_KINDS

Costs = dict[str, float]


def priors(folder: Path) -> dict[str, tuple[dict[str, float], Costs, Costs, int]]:
    results = json.loads((folder / "results.json").read_text())["results"]
    runs = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines()[1:]]
    by_method: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        by_method[run["method"]][run["task"]].append(run["stats"])
    plain = by_method.pop("ar")
    step = {task: sum(s["time_verify"] for s in stats) / sum(s["target_forwards"] for s in stats)
            for task, stats in plain.items()}  # fmt: skip
    table = {}
    for label, tasks in by_method.items():
        drafted = [d for stats in tasks.values() for s in stats for d in s["drafted"]]
        lengths = {task: round(results[task][label]["mean_accepted_length"], 2)
                   for task in tasks}  # fmt: skip
        table[label] = (
            lengths,
            _per_step(tasks, "time_draft", step),
            _per_step(tasks, "time_verify", step),
            1 + max(drafted),
        )
    return table


def _per_step(tasks: dict[str, list[dict]], field: str, step: dict[str, float]) -> Costs:
    """Per task kind, ``field``'s time a step in that kind's plain decode steps."""
    costs = {}
    for task, stats in tasks.items():
        steps = sum(len(s["drafted"]) for s in stats)
        costs[task] = round(sum(s[field] for s in stats) / steps / step[task], 3)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a quickdraft bench --out folder")
    parser.add_argument("--write", type=Path, help="a shipped EAGLE drafter's folder")
    parser.add_argument(
        "--budget", action="append", default=[], metavar="LABEL:TOKENS",
        help="a tree's tokens a step: nodes, grafted lookup tokens and the bonus token",
    )  # fmt: skip
    args = parser.parse_args()
    table = priors(args.folder)
    for label, row in table.items():
        print(f"{label!r}: {row},")
    if args.write is None:
        return
    meta = json.loads((args.folder / "results.json").read_text())["meta"]
    if meta["target"] != args.write.name:
        parser.error(f"--write: the bench ran {meta['target']}, not {args.write.name}")
    if set(meta["tasks"]) != set(TASK_KINDS):
        parser.error(f"folder: the bench ran {', '.join(meta['tasks'])}, not the seven kinds")
    budgets = dict(_budget(parser, text) for text in args.budget)
    eagle = [label for label in table if label.split()[0] == "eagle"]
    if unknown := set(budgets) - set(eagle):
        parser.error(f"--budget: no EAGLE label {', '.join(map(repr, sorted(unknown)))}")
    if missing := [label for label in eagle if label not in budgets]:
        parser.error(f"--budget: give the budget of {', '.join(map(repr, missing))}")
    labels = {}
    for label in eagle:
        lengths, draft, verify, _ = table[label]
        labels[label] = {"lengths": lengths, "draft": draft, "verify": verify,
                         "tokens": budgets[label]}  # fmt: skip
    weights = meta["target_weights"].split()[0]
    weights = "float" if weights.startswith("float") else weights
    record = {"bench": str(args.folder), "weights": weights, "labels": labels}
    (args.write / "bench.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.write / 'bench.json'}")


def _budget(parser: argparse.ArgumentParser, text: str) -> tuple[str, int]:
    label, _, tokens = text.rpartition(":")
    if not label or not tokens.isdecimal():
        parser.error(f"--budget: expected LABEL:TOKENS, got {text!r}")
    return label, int(tokens)


if __name__ == "__main__":
    main()
