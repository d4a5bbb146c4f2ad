"""`quickdraft theory`: the tutorial's exercise 2 and step 4 as plots, tables and JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from quickdraft.theory import (
    AcceptancePoint,
    CostModel,
    acceptance_experiment,
    expected_tokens_per_step,
    is_monotone_decreasing,
    optimal_num_draft,
    speedup,
)

ALPHAS = (0.5, 0.7, 0.85)
DISTANCES = [0.0, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0]
MAX_PLOTTED_N = 16
TOLERANCE = 0.01


@dataclass(frozen=True, slots=True)
class OptimalRow:
    alpha: float
    optimal_n: int
    speedup: float
    tokens_per_step: float


@dataclass(frozen=True, slots=True)
class TheoryReport:
    costs: CostModel
    optimal: list[OptimalRow]
    acceptance: list[AcceptancePoint]
    monotone: bool
    max_gap: float  # max |measured - (1 - TV)|

    @property
    def passed(self) -> bool:
        return self.monotone and self.max_gap <= TOLERANCE


def build_report(costs: CostModel, steps: int = 10_000, seed: int = 0) -> TheoryReport:
    optimal = []
    for alpha in ALPHAS:
        n = optimal_num_draft(alpha, costs)
        optimal.append(
            OptimalRow(alpha, n, speedup(alpha, n, costs), expected_tokens_per_step(alpha, n))
        )
    points = acceptance_experiment(DISTANCES, steps=steps, seed=seed)
    gap = max(abs(point.measured - point.expected) for point in points)
    return TheoryReport(costs, optimal, points, is_monotone_decreasing(points), gap)


def write_report(report: TheoryReport, out_dir: Path) -> list[Path]:
    """Writes speedup_vs_n.png, acceptance_vs_kl.png and theory.json; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [
        _plot_speedup(report, out_dir / "speedup_vs_n.png"),
        _plot_acceptance(report, out_dir / "acceptance_vs_kl.png"),
    ]
    data = {
        "costs": asdict(report.costs),
        "optimal_n": [asdict(row) for row in report.optimal],
        "acceptance": [asdict(point) for point in report.acceptance],
        "monotone_decreasing": report.monotone,
        "max_gap_to_1_minus_tv": report.max_gap,
        "tolerance": TOLERANCE,
    }
    paths.append(out_dir / "theory.json")
    paths[-1].write_text(json.dumps(data, indent=2) + "\n")
    return paths


def _plot_speedup(report: TheoryReport, path: Path) -> Path:
    ns = list(range(MAX_PLOTTED_N + 1))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for alpha, row in zip(ALPHAS, report.optimal, strict=True):
        tokens = [expected_tokens_per_step(alpha, n) for n in ns]
        (line,) = left.plot(ns, tokens, marker="o", markersize=3, label=f"a = {alpha}")
        left.axhline(1 / (1 - alpha), color=line.get_color(), linestyle=":", linewidth=0.8)
        gains = [speedup(alpha, n, report.costs) for n in ns]
        right.plot(
            ns,
            gains,
            marker="o",
            markersize=3,
            color=line.get_color(),
            label=f"a = {alpha}: best N = {row.optimal_n} ({row.speedup:.2f}x)",
        )
        if row.optimal_n <= MAX_PLOTTED_N:
            right.plot(
                [row.optimal_n], [row.speedup], marker="*", markersize=14, color=line.get_color()
            )
    left.set(
        title="Tokens per target call, (1 - a^(N+1)) / (1 - a)",
        xlabel="draft tokens per step N",
        ylabel="tokens per target call",
    )
    left.text(
        0.98, 0.04, "dotted: limit 1 / (1 - a)", transform=left.transAxes, ha="right", fontsize=8
    )
    costs = report.costs
    right.set(
        title=f"Wall-clock speedup (draft cost {costs.draft_cost:g}, "
        f"verify slope {costs.verify_slope:g})",
        xlabel="draft tokens per step N",
        ylabel="speedup over autoregressive",
    )
    right.axhline(1.0, color="grey", linewidth=0.8)
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_acceptance(report: TheoryReport, path: Path) -> Path:
    points = sorted(report.acceptance, key=lambda point: point.kl)
    kls = [point.kl for point in points]
    fig, axis = plt.subplots(figsize=(6.5, 4.2))
    axis.plot(
        kls,
        [point.expected for point in points],
        color="black",
        linewidth=1,
        label="exact: 1 - TV(target, draft)",
    )
    axis.plot(
        kls,
        [point.measured for point in points],
        "o",
        color="tab:red",
        label=f"measured, >= {min(p.trials for p in points):,} trials each",
    )
    for point in points:
        axis.annotate(
            f"d={point.distance:g}",
            (point.kl, point.measured),
            fontsize=7,
            textcoords="offset points",
            xytext=(4, 4),
        )
    axis.set(
        title="Acceptance rate against KL(target || draft)",
        xlabel="KL (nats)",
        ylabel="acceptance rate per draft token",
        ylim=(0, 1.05),
    )
    axis.grid(alpha=0.3)
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
