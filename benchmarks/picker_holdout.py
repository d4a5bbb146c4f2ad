"""Does the calibrated picker choose well on prompts it did not calibrate on?

For one model (SmolLM2-135M with every method it has, or the Qwen2.5-Coder pair): calibrates
``quickdraft pick --calibrate``'s way on prompts of each task kind (set A), then on disjoint
prompts of each task kind (set B) measures plain decoding and every candidate the picker
considered, interleaved prompt by prompt (the order rotating), and compares the picker's
choice with the fastest measured candidate. The pass mark: within 10% of the fastest.

    python benchmarks/picker_holdout.py --target smollm2-135m --threads 2
    python benchmarks/picker_holdout.py --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from quickdraft.bench.machine import describe_machine
from quickdraft.bench.tasks import TASK_KINDS, load_tasks
from quickdraft.config import Method, SamplingParams, SpecConfig
from quickdraft.drafters import registry
from quickdraft.engine import generate
from quickdraft.models.loading import load_model
from quickdraft.pick.calibrate import calibrate, describe
from quickdraft.pick.context import PickContext
from quickdraft.pick.picker import Workload, options

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--draft", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--calibration-items", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--holdout-items", type=int, nargs="+", default=[4, 5])
    parser.add_argument("--budget-seconds", type=int, default=900)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or RESULTS / f"picker_holdout_{args.target}.json"

    target, tokenizer = load_model(args.target)
    draft = load_model(args.draft, int8=True)[0] if args.draft else None
    tasks = load_tasks(TASK_KINDS)
    if set(args.calibration_items) & set(args.holdout_items):
        parser.error("calibration and hold-out items must differ")

    def prompts(items: list[int]) -> list[list[int]]:
        return [
            tokenizer.apply_chat(list(tasks[kind][i].messages))
            for i in items
            for kind in TASK_KINDS
        ]

    set_a, set_b = prompts(args.calibration_items), prompts(args.holdout_items)
    context = PickContext(target=args.target, draft=args.draft)
    workload = Workload()
    result = calibrate(
        target, set_a, context, workload, draft=draft, max_new_tokens=args.max_new_tokens,
        stop_token_ids=tokenizer.eos_token_ids, budget_seconds=args.budget_seconds,
    )  # fmt: skip
    choice = result.choice
    print(f"picker chose {choice.label} ({result.seconds:.0f} s)", flush=True)

    sampling = SamplingParams(
        temperature=0, max_new_tokens=args.max_new_tokens, stop_token_ids=tokenizer.eos_token_ids
    )
    ranked, _ = options(workload, context)
    configs = [(o.label, o.spec) for o in ranked]
    if choice.label not in dict(configs):
        configs.append((choice.label, choice.spec))
    configs = [("ar", SpecConfig(method=Method.AR))] + [c for c in configs if c[0] != "ar"]
    rates: dict[str, list[float]] = {label: [] for label, _ in configs}
    for index, prompt in enumerate(set_b):
        order = configs[index % len(configs) :] + configs[: index % len(configs)]
        for label, spec in order:
            uses_draft = registry.get(spec.method).draft_model
            run = generate(target, prompt, sampling=sampling, spec=spec,
                           draft=draft if uses_draft else None)  # fmt: skip
            rates[label].append(run.stats.decode_tokens_per_second)  # after prefill
        print(f"hold-out prompt {index + 1}/{len(set_b)} done", flush=True)
    measured = {
        label: statistics.median(r / a for r, a in zip(values, rates["ar"], strict=True))
        for label, values in rates.items()
    }
    best = max(measured, key=measured.get)
    chosen = measured[choice.label] if choice.speculate else 1.0
    report = {
        "target": args.target,
        "draft": None if args.draft is None else f"{args.draft} (int8)",
        "threads": torch.get_num_threads(),
        "machine": describe_machine(),
        "max_new_tokens": args.max_new_tokens,
        "calibration_items": args.calibration_items,
        "holdout_items": args.holdout_items,
        "calibration": describe(result),
        "holdout_speedup_over_ar": measured,
        "best": best,
        "chosen": choice.label,
        "chosen_speedup": chosen,
        "best_speedup": measured[best],
        "within_10_percent": chosen >= 0.9 * measured[best],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    report_md = render(report)
    out.with_suffix(".md").write_text(report_md)
    print(report_md)


def render(report: dict) -> str:
    calibration = report["calibration"]
    predicted = {row["label"]: row["predicted_speedup"] for row in calibration["measured"]}
    lines = [
        f"# Calibrated picker on held-out prompts: {report['target']}",
        "",
        f"{report['target']}" + (f" with {report['draft']}" if report["draft"] else "")
        + f", greedy, {report['max_new_tokens']} tokens, {report['threads']} threads, "
        f"{report['machine']}. Calibrated on items {report['calibration_items']} of each of "
        f"the seven task kinds ({calibration['prompts_used']} prompts within the budget, "
        f"{calibration['seconds']:.0f} s), measured on items {report['holdout_items']} of each: "
        "median of per-prompt decoding speedups over ar (after prefill, which speculation "
        "does not change), every configuration interleaved prompt by prompt.",
        "",
        "| configuration | predicted (calibration) | measured on held-out |",
        "|---|---|---|",
    ]  # fmt: skip
    ordered = sorted(report["holdout_speedup_over_ar"].items(), key=lambda item: -item[1])
    for label, value in ordered:
        mark = " (picker)" if label == report["chosen"] else ""
        shown = f"{predicted[label]:.2f}x" if label in predicted else "1.00x"
        lines.append(f"| {label}{mark} | {shown} | {value:.2f}x |")
    confirmed = calibration.get("confirmed_speedup") or {}
    lines += [
        "",
        f"Picker: {report['chosen']}, {report['chosen_speedup']:.2f}x; fastest measured: "
        f"{report['best']}, {report['best_speedup']:.2f}x; within 10%: "
        f"{report['within_10_percent']}. Confirmation on the calibration prompts: "
        + (", ".join(f"{k} {v:.2f}x" for k, v in confirmed.items()) or "none")
        + ".",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
