"""A seven-task bench's runs as the picker's priors (``quickdraft/pick/priors.py``): per
method label, the mean accepted length per task kind, the drafter's and the verify pass's
time per step in the target's decode steps (plain decoding's time a token in the same run),
and the most tokens a step verified (the priors' convention: a configuration's budget; for a
tree, whose runs count the longest path drafted, set its budget by hand: nodes, grafted
lookup tokens and the bonus token).

    python benchmarks/bench_priors.py benchmarks/results/qwen1.5b_methods
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def priors(folder: Path) -> dict[str, tuple[dict[str, float], float, float, int]]:
    results = json.loads((folder / "results.json").read_text())["results"]
    runs = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines()[1:]]
    by_method: dict[str, list[dict]] = defaultdict(list)
    for run in runs:
        by_method[run["method"]].append(run["stats"])
    plain = by_method.pop("ar")
    step = sum(s["time_verify"] for s in plain) / sum(s["target_forwards"] for s in plain)
    table = {}
    for label, stats in by_method.items():
        steps = sum(len(s["drafted"]) for s in stats)
        drafted = [d for s in stats for d in s["drafted"]]
        lengths = {task: round(results[task][label]["mean_accepted_length"], 2)
                   for task in results}  # fmt: skip
        table[label] = (
            lengths,
            round(sum(s["time_draft"] for s in stats) / steps / step, 3),
            round(sum(s["time_verify"] for s in stats) / steps / step, 3),
            1 + max(drafted),
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a quickdraft bench --out folder")
    args = parser.parse_args()
    for label, row in priors(args.folder).items():
        print(f"{label!r}: {row},")


if __name__ == "__main__":
    main()
