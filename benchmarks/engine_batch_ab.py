"""The serving engine before and after a change, in one interleaved run: ``engine_batch.py``
from two checkouts, one round each in turn (A, B, B, A, ...), then medians per checkout, mode
and concurrency, side by side.

    git worktree add /tmp/before <rev>
    python benchmarks/engine_batch_ab.py --before /tmp/before --rounds 3 --threads 2

Each round is ``engine_batch.py --repeats 1`` in a fresh process of the checkout's own code
(the same interpreter and packages); every round checks its outputs against plain decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def one_round(checkout: Path, args: argparse.Namespace, out: Path) -> dict:
    command = [
        sys.executable, str(checkout / "benchmarks" / "engine_batch.py"),
        "--threads", str(args.threads), "--concurrency", args.concurrency,
        "--requests", str(args.requests), "--max-new-tokens", str(args.max_new_tokens),
        "--repeats", "1", "--modes", args.modes, "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    subprocess.run(command, check=True, env=env, cwd=checkout, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout")
    parser.add_argument("--after", type=Path, default=HERE.parent)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--modes", default="ar,eagle,eagle+policy")
    parser.add_argument("--out", type=Path, default=RESULTS / "engine_batch_ab")
    args = parser.parse_args()
    checkouts = {"before": args.before.resolve(), "after": args.after.resolve()}
    rounds: dict[str, list[dict]] = {name: [] for name in checkouts}
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(args.rounds):
            order = list(checkouts) if index % 2 == 0 else list(reversed(checkouts))
            for name in order:
                out = Path(scratch) / f"{name}-{index}.json"
                rounds[name].append(one_round(checkouts[name], args, out))
                print(f"round {index} {name} done", flush=True)
            write(rounds, checkouts, args)  # the table so far, after every pair of rounds


def write(rounds: dict[str, list[dict]], checkouts: dict[str, Path], args) -> None:
    """Medians over the rounds run so far, as results.json and report.md in ``args.out``."""
    table = []
    for position, row in enumerate(rounds["after"][0]["table"]):
        concurrency = row["concurrency"]
        entry: dict = {"concurrency": concurrency}
        for name in checkouts:
            rates: dict[str, float] = {}
            for mode in row["tokens_per_second"]:
                seconds = [r["table"][position]["seconds"][mode][0] for r in rounds[name]]
                tokens = row["tokens_per_second"][mode] * row["seconds"][mode][0]
                rates[mode] = tokens / statistics.median(seconds)
            entry[name] = rates
        entry["after_over_before"] = {
            mode: entry["after"][mode] / entry["before"][mode] for mode in entry["after"]
        }
        table.append(entry)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"machine": rounds["after"][0]["machine"], "threads": args.threads,
              "requests": args.requests, "max_new_tokens": args.max_new_tokens,
              "rounds": len(rounds["after"]),
              "checkouts": {k: str(v) for k, v in checkouts.items()}, "table": table,
              "raw": rounds}  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    report = render(result)
    (args.out / "report.md").write_text(report)
    print(report)


def render(result: dict) -> str:
    """The report.md of a results.json: the medians side by side, with the run's settings."""
    table = result["table"]
    modes = list(table[0]["after"])
    lines = [
        "| concurrent requests | " + " | ".join(
            f"{mode} before | {mode} after | after / before" for mode in modes) + " |",
        "|---|" + "---|---|---|" * len(modes),
    ]  # fmt: skip
    for entry in table:
        before, after, ratio = entry["before"], entry["after"], entry["after_over_before"]
        cells = [f"{before[m]:.1f} | {after[m]:.1f} | {ratio[m]:.3f}" for m in modes]
        lines.append(f"| {entry['concurrency']} | " + " | ".join(cells) + " |")
    header = (
        f"Aggregate tokens/s, median of {result['rounds']} interleaved rounds per checkout "
        f"({result['requests']} requests x {result['max_new_tokens']} tokens, greedy, "
        f"{result['threads']} threads; {result['machine']}).\n\n"
    )
    return header + "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
