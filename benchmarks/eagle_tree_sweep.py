"""Which dynamic tree (and how many prompt-lookup tokens grafted onto it) an EAGLE drafter
should ship with, chosen on prompts the bench never uses.

On a CPU a verify forward's cost grows with every token it carries (Qwen2.5-Coder-0.5B int8,
2 threads: about 27 ms for one token, 55 for 11, 72 for 16), so the tree that accepts the
most tokens a step is not the fastest; the GPU's default of 60 tokens is far off. Every
configuration runs interleaved prompt by prompt against plain decoding on the held-out prompts
of ``dynaspec_eagle.py --held-out`` (the seven task kinds, past every prompt the drafter's
training replies answer), greedy, so every output is also checked against plain decoding.
The winner goes into the drafter's ``eagle.json`` as ``"tree"`` and ``"lookup"``; the bench's
own prompts then measure it, held out from this choice.

    python benchmarks/eagle_tree_sweep.py --held-out build/prompts \\
        --methods "eagle@6.4.10p0.1+5+dyna-pa:4,eagle@4.2.6p0.1+3+dyna-pa:4" --out DIR

``--calibration`` takes the prompts instead from ``eagle_held_out.py``'s calibration set (per
kind, the prompts after those it evaluates: neither the bench's own nor any training reply's),
for a drafter whose training data is not the 0.5B's (the 1.5B's):

    python benchmarks/eagle_tree_sweep.py --calibration --target qwen2.5-coder-1.5b \\
        --quant q4 --methods "eagle@6.4.10p0.1+5,eagle@8.4.16p0.05+5" --out DIR

``--evaluated`` takes ``eagle_held_out.py``'s evaluated prompts, to confirm on prompts the
choice never saw, paired prompt by prompt, what the calibration prompts chose (never to
choose).

The report pairs every configuration, prompt by prompt, with ``--reference`` (by default the
first method past ``ar``: plain ``eagle`` is the drafter's own tree, or the device's default
where it names none): the geometric mean of their decode-rate ratios with a 95% interval
(Student's t on the log ratios), which resolves a few percent where medians of ratios to plain
decoding move with the host's memory rate.

Runs are logged to ``OUT/runs.jsonl`` so an interrupted sweep resumes; ``--render`` rebuilds
``report.md`` from ``results.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from quickdraft.bench.harness import BenchSettings, parse_methods
from quickdraft.bench.machine import describe_machine
from quickdraft.bench.summary import paired_speed, summarise
from quickdraft.bench.tasks import TaskItem
from quickdraft.models.loading import load_model

TARGET = "qwen2.5-coder-0.5b"
PROMPT_NAMES = {"calibration": "calibration", "evaluated": "evaluated (held-out)"}


def run(args: argparse.Namespace) -> dict:
    from dynaspec_eagle import held_out_tasks, logged_bench  # beside this script

    runs = parse_methods(args.methods)
    reference = _reference(args.reference, runs)
    torch.set_num_threads(args.threads)
    target, tokenizer = load_model(args.target, quant=args.quant)
    if args.calibration or args.evaluated:
        tasks = calibration_tasks(args.prompts_per_task, calibration=args.calibration)
    else:
        tasks = held_out_tasks(args.held_out, args.prompts_per_task)
    settings = BenchSettings(max_new_tokens=args.max_new_tokens, temperature=0.0, seed=0)
    meta = {
        "target": args.target,
        "target_weights": args.quant or "float",
        "eagle_dir": str(args.eagle_dir) if args.eagle_dir else "shipped",
        "prompts": _prompts(args),
        "prompts_per_task": args.prompts_per_task,
        "max_new_tokens": args.max_new_tokens,
        "methods": [run.label for run in runs],
        "threads": torch.get_num_threads(),
    }
    # The machine stays out of the log's header: a resume may run on another host.
    bench = logged_bench(
        args.out, meta, "", target, tokenizer, runs, tasks, settings,
        target_name=args.target, eagle_dir=None if args.eagle_dir is None else str(args.eagle_dir),
    )  # fmt: skip
    overall = summarise(bench)["all"]
    rows = {}
    for method in runs:
        mine = [r for r in bench.records if r.method == method.label]
        steps = sum(r.stats.verify_steps for r in mine)
        summary = overall[method.label]
        rows[method.label] = {
            "accepted_length": summary["mean_accepted_length"],
            "draft_ms_per_step": 1000 * sum(r.stats.time_draft for r in mine) / steps
            if steps else 0.0,
            "verify_ms_per_step": 1000 * sum(r.stats.time_verify for r in mine) / steps
            if steps else 0.0,
            "tokens_per_s": summary["tokens_per_s_median"],
            "decode_tokens_per_s": summary["decode_tokens_per_s_median"],
            "speedup_over_ar": summary["speedup_over_ar"],
            "decode_speedup_over_ar": summary["decode_speedup_over_ar"],
            "identical_to_ar": summary["identical_to_ar"],
        }  # fmt: skip
    paired = {
        run.label: paired_speed(bench.records, run.label, reference)
        for run in runs
        if run.label != reference
    }
    result = {
        "meta": {**meta, "machine": describe_machine()},
        "rows": rows,
        "paired": {"reference": reference, "rows": paired},
    }
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _reference(text: str | None, runs: list) -> str:
    """The label the others pair with: ``text`` in either form (``eagle@5.3.8p0.1+5`` as
    ``--methods`` writes it, or its report label), one of ``runs``; by default the first run
    past ``ar``."""
    if text is None:
        label = next((run.label for run in runs if run.label != "ar"), None)
        if label is None:
            raise SystemExit("--methods: nothing to sweep past ar")
        return label
    try:
        label = parse_methods(text)[-1].label
    except ValueError:
        label = text  # a report label, with its spaces and '='
    if label not in {run.label for run in runs}:
        labels = ", ".join(run.label for run in runs)
        raise SystemExit(f"--reference: {text!r} is not one of --methods ({labels})")
    return label


def _prompts(args: argparse.Namespace) -> str:
    if args.calibration:
        return "calibration"
    return "evaluated" if args.evaluated else "held out"


def calibration_tasks(per_kind: int, calibration: bool = True) -> dict[str, list[TaskItem]]:
    """``eagle_held_out.held_out``'s calibration chats (or, not ``calibration``, the chats
    it evaluates) as the bench's task items."""
    from eagle_held_out import held_out  # beside this script

    name = "calibration" if calibration else "evaluated"
    return {
        kind: [
            TaskItem(f"{name}-{kind}-{n + 1:03d}", kind, chat[-1]["content"],
                     tuple(chat), "", "")
            for n, chat in enumerate(chats)
        ]
        for kind, chats in held_out(per_kind, calibration=calibration).items()
    }  # fmt: skip


def render(result: dict) -> str:
    meta, rows = result["meta"], result["rows"]
    lines = [
        f"# EAGLE tree sweep: {meta['target']} ({meta['target_weights']} weights)",
        "",
        f"Machine: {meta['machine']}; {meta['threads']} threads. {meta['prompts_per_task']} "
        f"{PROMPT_NAMES.get(meta.get('prompts'), 'held-out')} prompts per "
        "task (seven kinds), "
        f"{meta['max_new_tokens']} new tokens, greedy, "
        f"chat template; drafter: {meta['eagle_dir']}. Method labels read "
        "`eagle@DEPTH.TOPK.TOKENS[pMIN_PROB]+LOOKUP+SHORTLIST`. Speeds are medians over "
        "prompts of the ratio to plain decoding on the same prompt.",
        "",
        "| method | accepted length | draft ms / step | "
        "verify ms / step | decode speedup | end-to-end speedup | identical to ar |",
        "|---|---|---|---|---|---|---|",
    ]
    ranked = sorted(rows.items(), key=lambda item: -item[1]["speedup_over_ar"])
    for label, row in ranked:
        lines.append(
            f"| {label} | {row['accepted_length']:.2f} | "
            f"{row['draft_ms_per_step']:.1f} | {row['verify_ms_per_step']:.1f} | "
            f"{row['decode_speedup_over_ar']:.2f}x | {row['speedup_over_ar']:.2f}x | "
            f"{row['identical_to_ar']} |"
        )
    if "paired" in result:  # sweeps before 2026-12-06 have it in a hand-written paired.md
        lines += _render_paired(result["paired"])
    return "\n".join(lines) + "\n"


def _render_paired(paired: dict) -> list[str]:
    lines = [
        "",
        f"Paired by prompt against `{paired['reference']}`: the geometric mean over prompts of "
        "the decode-rate ratio (above 1: faster than the reference), with a 95% interval "
        "(Student's t on the log ratios).",
        "",
        "| method | speed against the reference | prompts |",
        "|---|---|---|",
    ]
    ranked = sorted(paired["rows"].items(), key=lambda item: -(item[1] or {}).get("ratio", 0))
    for label, row in ranked:
        if row is None:
            lines.append(f"| {label} | (fewer than two prompts) | |")
        else:
            lines.append(
                f"| {label} | {row['ratio']:.3f} ({row['low']:.3f}-{row['high']:.3f}) | "
                f"{row['prompts']} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--held-out", type=Path, help="held-out prompt files (to measure)")
    source.add_argument(
        "--calibration", action="store_true", help="eagle_held_out.py's calibration prompts"
    )
    source.add_argument(
        "--evaluated",
        action="store_true",
        help="eagle_held_out.py's evaluated prompts: to confirm a choice, never to make one",
    )
    parser.add_argument("--methods", help="as quickdraft bench --methods (to measure)")
    parser.add_argument(
        "--reference",
        help="the method the others are paired with, as --methods writes it or as the report "
        "labels it (default: the first method past ar)",
    )
    parser.add_argument("--eagle-dir", type=Path, default=None)
    parser.add_argument("--target", default=TARGET, help="a target with a shipped drafter")
    parser.add_argument("--quant", choices=["int8", "q4"], default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts-per-task", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--render", action="store_true", help="only rebuild OUT/report.md")
    args = parser.parse_args()
    from dynaspec_eagle import measure_then_render  # beside this script

    needed = ("methods",) if args.calibration or args.evaluated else ("held_out", "methods")
    measure_then_render(parser, args, needed, run, render)


if __name__ == "__main__":
    main()
