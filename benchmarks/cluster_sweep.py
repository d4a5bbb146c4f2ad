"""How many clusters M for DynaSpec on an EAGLE drafter: held-out coverage per M.

Reads the ``metrics.json`` of routers trained with ``quickdraft train router --core 0`` (the
paper's setting: every head row clustered) at several M on the same features, and tabulates,
at equal shares of the vocabulary, how often the routed clusters hold the target's next token
(interpolated between cluster budgets), beside the frequency list at the same share. The
metrics files are copied into ``OUT/M<m>.json`` so the table can be rebuilt from the repository.

    for M in 8 16 32 64 128 256; do quickdraft train router --draft qwen2.5-coder-0.5b \\
        --eagle-dir DRAFTER --core 0 --clusters $M --frequency FREQ --data ... --out r$M; done
    python benchmarks/cluster_sweep.py r8 r16 r32 r64 r128 r256
    python benchmarks/cluster_sweep.py --render
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results" / "dynaspec_eagle" / "sweep"
SHARES = (0.05, 0.10, 0.18, 0.26, 0.40)


def render(folder: Path) -> str:
    rows = sorted(
        (json.loads(path.read_text()) for path in folder.glob("M*.json")),
        key=lambda m: len(m["cluster_sizes"]),
    )
    first = rows[0]
    lines = [
        "# DynaSpec clusters on the EAGLE drafter: how many?",
        "",
        f"Router features: {first['features']['rows']:,} positions of "
        f"{first['features']['sequences']:,} sequences (`{first['settings']['eagle_dir']}`), "
        f"{first['training']['epochs']} epochs, width {first['training']['width']}; coverage on "
        "held-out sequences: how often the routed clusters hold the target's next token, at "
        "equal shares of the 151,936-token vocabulary (interpolated between cluster budgets).",
        "",
        "| M | held-out loss | " + " | ".join(f"{s:.0%}" for s in SHARES) + " | top-1 cluster |",
        "|---|---|" + "---|" * (len(SHARES) + 1),
    ]
    for metrics in rows:
        coverage = metrics["router_coverage"]
        share = np.array([row["vocab_share"] for row in coverage])
        recall = [row["target_recall"] for row in coverage]
        loss = min(h["held_loss"] for h in metrics["log"]["history"])
        cells = " | ".join(f"{float(np.interp(s, share, recall)):.3f}" for s in SHARES)
        top = coverage[0]
        lines.append(
            f"| {len(metrics['cluster_sizes'])} | {loss:.3f} | {cells} | "
            f"{top['vocab_share']:.2%} of the vocabulary, {top['target_recall']:.3f} |"
        )
    frequency = first["frequency_coverage"]
    share = np.array([row["vocab_share"] for row in frequency])
    recall = [row["target_recall"] for row in frequency]
    cells = " | ".join(f"{float(np.interp(s, share, recall)):.3f}" for s in SHARES)
    lines += [f"| frequency list | | {cells} | |", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", type=Path, help="train router outputs")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--render", action="store_true", help="only rebuild OUT/report.md")
    args = parser.parse_args()
    if not args.render:
        args.out.mkdir(parents=True, exist_ok=True)
        for folder in args.folders:
            metrics = json.loads((folder / "metrics.json").read_text())
            shutil.copyfile(
                folder / "metrics.json", args.out / f"M{len(metrics['cluster_sizes'])}.json"
            )
    report = render(args.out)
    (args.out / "report.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
