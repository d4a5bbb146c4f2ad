"""Does the calibrated picker choose well on prompts it did not calibrate on?

Calibrates on one prompt per task kind (set A), then on a disjoint prompt per task kind (set B)
measures plain decoding and every candidate (method, k), interleaved prompt by prompt, and
compares the picker's choice with the fastest measured candidate.

    python benchmarks/picker_holdout.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch

from quickdraft.bench.tasks import TASK_KINDS, load_tasks
from quickdraft.calibrate import calibrate, describe
from quickdraft.config import Method, SamplingParams, SpecConfig
from quickdraft.engine import generate
from quickdraft.models.loading import load_model

RESULTS = Path(__file__).parent / "results"
CANDIDATES = [(Method.DRAFT_MODEL, k) for k in (2, 3, 4, 5, 6, 8)] + [
    (Method.NGRAM, k) for k in (3, 5)
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=RESULTS / "picker_holdout.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    target, tokenizer = load_model(args.target)
    draft, _ = load_model(args.draft, int8=True)
    tasks = load_tasks(TASK_KINDS)
    # The bench report used items 1-2 of each task; A and B are items 3 and 4.
    set_a = [tokenizer.apply_chat(list(tasks[kind][2].messages)) for kind in TASK_KINDS]
    set_b = [tokenizer.apply_chat(list(tasks[kind][3].messages)) for kind in TASK_KINDS]

    result = calibrate(
        target,
        set_a,
        draft=draft,
        k_max=8,
        max_new_tokens=args.max_new_tokens,
        stop_token_ids=tokenizer.eos_token_ids,
        verify=False,
    )
    choice = result.choice.spec
    print("picker chose", choice.method.value, choice.k, flush=True)

    sampling = SamplingParams(
        temperature=0, max_new_tokens=args.max_new_tokens, stop_token_ids=tokenizer.eos_token_ids
    )
    configs = [("ar", SpecConfig(method=Method.AR))] + [
        (f"{m.value} k={k}", SpecConfig(method=m, num_speculative_tokens=k)) for m, k in CANDIDATES
    ]
    ratios: dict[str, list[float]] = {label: [] for label, _ in configs}
    for index, prompt in enumerate(set_b):
        rates = {}
        order = configs[index % len(configs) :] + configs[: index % len(configs)]
        for label, spec in order:
            uses_draft = spec.method is Method.DRAFT_MODEL
            out = generate(
                target, prompt, sampling=sampling, spec=spec, draft=draft if uses_draft else None
            )
            rates[label] = out.stats.decode_tokens_per_second  # after prefill, as predicted
        for label in rates:
            ratios[label].append(rates[label] / rates["ar"])
        print(f"prompt {index} ({TASK_KINDS[index]}) done", flush=True)
    measured = {label: statistics.median(values) for label, values in ratios.items()}
    best_label = max(measured, key=measured.get)
    chosen_label = "ar" if choice.method is Method.AR else f"{choice.method.value} k={choice.k}"
    chosen = measured.get(chosen_label)
    if chosen is None:  # the picker chose a k outside the measured grid: measure it too
        chosen = statistics.median(
            generate(
                target, p, sampling=sampling, spec=choice, draft=draft
            ).stats.decode_tokens_per_second
            / generate(target, p, sampling=sampling).stats.decode_tokens_per_second
            for p in set_b
        )
    report = {
        "target": args.target,
        "draft": f"{args.draft} (int8)",
        "threads": args.threads,
        "machine": f"{platform.machine()}, torch {torch.__version__}",
        "max_new_tokens": args.max_new_tokens,
        "calibration": describe(result, args.draft),
        "holdout_speedup_over_ar": measured,
        "best": best_label,
        "chosen": chosen_label,
        "chosen_speedup": chosen,
        "best_speedup": measured[best_label],
        "within_10_percent": chosen >= 0.9 * measured[best_label],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# Calibrated picker on held-out prompts",
        "",
        f"{args.target} with {args.draft} (int8 draft), greedy, {args.max_new_tokens} "
        f"tokens, {args.threads} threads. Calibrated on item 3 of each of the seven task "
        "kinds, measured on item 4 of each: median of per-prompt decoding speedups over ar "
        "(after prefill, which speculation does not change).",
        "",
        "| config | predicted (calibration) | measured on held-out |",
        "|---|---|---|",
    ]
    predicted = {
        f"{p['method']} k={k}": s
        for p in report["calibration"]["profiles"]
        for k, s in p["predicted_speedup"].items()
    }
    for label, value in measured.items():
        mark = " (picker)" if label == chosen_label else ""
        lines.append(f"| {label}{mark} | {predicted.get(label, 1.0):.2f}x | {value:.2f}x |")
    lines += [
        "",
        f"Picker: {chosen_label}, {chosen:.2f}x; fastest measured: {best_label}, "
        f"{measured[best_label]:.2f}x; within 10%: {report['within_10_percent']}.",
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
