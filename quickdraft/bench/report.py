"""results.json, report.md and the two plots of a bench run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def write_report(
    summary: dict[str, Any], meta: dict[str, Any], out_dir: Path, *, partial: bool = False
) -> list[Path]:
    """results.json and report.md, then the plots. ``partial``: a run still going or
    interrupted; both files say so (``meta.partial``) and no plots are drawn."""
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {**meta, "partial": partial}
    paths = [out_dir / "results.json", out_dir / "report.md"]
    _write_atomic(paths[0], json.dumps({"meta": meta, "results": summary}, indent=2) + "\n")
    _write_atomic(paths[1], markdown(summary, meta) if summary else "# partial: no run yet\n")
    if partial:
        return paths
    paths.append(_plot_speedup(summary, out_dir / "speedup_by_task.png"))
    paths.append(_plot_acceptance(summary, out_dir / "acceptance_by_position.png"))
    return paths


def _write_atomic(path: Path, text: str) -> None:
    """Write beside and rename, so an interrupt never leaves half a file."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    methods = list(summary["all"])
    tasks = [task for task in summary if task != "all"]
    lines = [f"# quickdraft bench: {meta['target']}", ""]
    if meta.get("partial"):
        lines += [
            f"**Partial results** ({meta.get('completed', '?')} runs): rerun the same "
            "command to complete them.",
            "",
        ]
    lines += [f"- {key}: {value}" for key, value in meta.items() if key != "target"]
    for key, title in (
        (
            "decode_speedup_over_ar",
            "Decoding speedup over autoregressive (after prefill, which "
            "speculation does not change; median of per-prompt ratios)",
        ),
        ("speedup_over_ar", "End-to-end speedup over autoregressive (prefill included)"),
    ):
        lines += [
            "",
            f"## {title}",
            "",
            "| task | " + " | ".join(methods) + " |",
            "|---" * (len(methods) + 1) + "|",
        ]
        for task in [*tasks, "all"]:
            cells = [_fmt(summary[task][m][key], "{:.2f}x") for m in methods]
            lines.append(f"| {task} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Mean accepted length (tokens per verify step)",
        "",
        "| task | " + " | ".join(methods) + " |",
        "|---" * (len(methods) + 1) + "|",
    ]
    for task in [*tasks, "all"]:
        cells = [_fmt(summary[task][m]["mean_accepted_length"], "{:.2f}") for m in methods]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## All tasks, per method",
        "",
        "| method | decode tok/s | decode speedup | end-to-end tok/s | end-to-end speedup "
        "| accepted length | acceptance by position | prefill / draft / verify / other s "
        "per run | drafter vocab | identical to ar |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method in methods:
        row = summary["all"][method]
        positions = ", ".join(_fmt(x, "{:.2f}") for x in row["acceptance_by_position"]) or "-"
        split = row["time_per_run_s"]
        identical = {True: "yes", False: "NO", None: "not checked"}[row["identical_to_ar"]]
        lines.append(
            f"| {method} | {_fmt(row['decode_tokens_per_s_median'], '{:.2f}')} | "
            f"{_fmt(row['decode_speedup_over_ar'], '{:.2f}x')} | "
            f"{_fmt(row['tokens_per_s_median'], '{:.2f}')} | "
            f"{_fmt(row['speedup_over_ar'], '{:.2f}x')} | "
            f"{_fmt(row['mean_accepted_length'], '{:.2f}')} | {positions} | "
            f"{split['prefill']:.2f} / {split['draft']:.2f} / {split['verify']:.2f} / "
            f"{split['other']:.2f} | {_fmt(row['drafter_vocab_size'], '{:,}')} | {identical} |"
        )
    checked = [m for m in methods if summary["all"][m].get("invalid") is not None]
    if checked:
        lines += [
            "",
            "## Structured outputs (items with a JSON schema)",
            "",
            "| method | invalid replies | tokens the grammar forced |",
            "|---|---|---|",
        ]
        for method in checked:
            row = summary["all"][method]
            lines.append(f"| {method} | {row['invalid']} | {_fmt(row['forced_share'], '{:.0%}')} |")
    lines += [
        "",
        "![speedup by task](speedup_by_task.png)",
        "![acceptance by position](acceptance_by_position.png)",
        "",
    ]
    return "\n".join(lines)


def _plot_speedup(summary: dict[str, Any], path: Path) -> Path:
    methods = [m for m in summary["all"] if m != "ar"]
    tasks = [task for task in summary if task != "all"] + ["all"]
    fig, axis = plt.subplots(figsize=(max(6.0, 1.2 * len(tasks) + 2), 4.2))
    width = 0.8 / max(len(methods), 1)
    for index, method in enumerate(methods):
        values = [summary[task][method]["decode_speedup_over_ar"] or 0.0 for task in tasks]
        offsets = [t + (index - (len(methods) - 1) / 2) * width for t in range(len(tasks))]
        axis.bar(offsets, values, width=width, label=method)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xticks(range(len(tasks)), tasks, rotation=20)
    axis.set(
        ylabel="decoding speedup over autoregressive",
        title="Decoding speedup by task and method (after prefill)",
    )
    axis.legend(fontsize=8)
    axis.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_acceptance(summary: dict[str, Any], path: Path) -> Path:
    fig, axis = plt.subplots(figsize=(6.5, 4.2))
    for method, row in summary["all"].items():
        rates = row["acceptance_by_position"]
        if rates:
            points = [(i + 1, r) for i, r in enumerate(rates) if r is not None]
            if not points:
                continue
            axis.plot(*zip(*points, strict=True), marker="o", label=method)
    axis.set(
        xlabel="draft position",
        ylabel="P(accepted | reached)",
        ylim=(0, 1.05),
        title="Acceptance by draft position, all tasks",
    )
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
