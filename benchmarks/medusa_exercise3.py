"""Exercise 3: Medusa heads on SmolLM2-135M against a draft model pruned from SmolLM2 itself.

The tutorial's exercise 3 (../shared/reference/speculative-decoding-tutorial.fa.txt): train
three Medusa heads on a small model and compare them with a classic draft model made by pruning
the same model (its first layers, then its final norm and head: ``LlamaRunner.truncated``, no
extra weights), as it is and with an exit adapter distilled briefly toward the full model's
choices (``models.pruned.PrunedModel``, ``train.medusa.train_exit``). One ``quickdraft bench``
run over held-out prompts of the seven task kinds (none
of them in the heads' training corpus), every method interleaved prompt by prompt, greedy, with
every output checked against plain decoding: per task the mean accepted length, per method the
acceptance by position (depth, for trees), drafting time and the speedup over autoregressive
decoding (median of per-prompt ratios).

    python benchmarks/medusa_exercise3.py --threads 2 --prompts-per-task 3
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from quickdraft.bench.harness import BenchSettings, MethodRun, run_bench
from quickdraft.bench.machine import describe_machine
from quickdraft.bench.summary import summarise
from quickdraft.bench.tasks import TASK_KINDS, load_tasks
from quickdraft.config import Method, SpecConfig
from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
from quickdraft.drafters.medusa.drafter import build_medusa
from quickdraft.drafters.medusa.net import heads_folder
from quickdraft.drafters.registry import make_spec
from quickdraft.models.loading import load_model
from quickdraft.models.pruned import PrunedModel
from quickdraft.train.corpus import balanced_sample, read_records, tokenize
from quickdraft.train.medusa import MedusaTraining, train_exit

RESULTS = Path(__file__).parent / "results" / "medusa"
CORPUS = Path(__file__).parent / "data" / "shortlist_corpus.jsonl"
TARGET = "smollm2-135m"
console = Console(width=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts-per-task", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--pruned-layers", type=int, nargs="+", default=[4, 8], help="layers kept (of 30)"
    )
    parser.add_argument("-k", type=int, default=3, help="draft tokens of the pruned drafts")
    parser.add_argument(
        "--trees", nargs="+", default=["default"], help="Medusa trees: default or widths 4,2,1"
    )
    parser.add_argument("--medusa-dir", default=None, help="default: the shipped heads")
    parser.add_argument(
        "--distill",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run each pruned draft with an exit adapter distilled toward the full model",
    )
    parser.add_argument("--distill-tokens", type=int, default=30_000)
    parser.add_argument("--distill-epochs", type=int, default=2)
    parser.add_argument("--data", default=str(CORPUS), help="distillation text")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache/quickdraft/train")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    target, tokenizer = load_model(TARGET)
    folder = heads_folder(TARGET, args.medusa_dir)
    methods = [MethodRun("ar", SpecConfig(method=Method.AR))]
    drafters = {}
    for tree in args.trees:
        drafter = build_medusa(target, folder, tree)
        label = f"medusa {tree} ({drafter.num_tokens} nodes)"
        methods.append(MethodRun(label, make_spec(method=Method.MEDUSA, tree=tree)))
        drafters[label] = drafter
    spec = SpecConfig(method=Method.DRAFT_MODEL, num_speculative_tokens=args.k)
    distilled = {}
    if args.distill:
        records = read_records([args.data])
        sequences = [tokenize(r, tokenizer, 512) for r in records]
        sample = balanced_sample(sequences, args.distill_tokens, 0)
        training = MedusaTraining(epochs=args.distill_epochs, batch_size=32, lr=1e-3)
        for layers in args.pruned_layers:
            console.print(f"distilling an exit adapter for {layers} layers ...")
            adapter, metrics = train_exit(target, layers, sample, training, args.cache)
            distilled[layers] = {"adapter": adapter, "held_out_top1": metrics["held_out"][0]}
    for layers in args.pruned_layers:
        label = f"pruned {layers}/{target.config.num_layers} layers k={args.k}"
        methods.append(MethodRun(label, spec))
        drafters[label] = DraftModelDrafter(PrunedModel(target, layers), args.k)
        if layers in distilled:
            label = f"pruned {layers}/{target.config.num_layers} + exit k={args.k}"
            methods.append(MethodRun(label, spec))
            model = PrunedModel(target, layers, distilled[layers]["adapter"])
            drafters[label] = DraftModelDrafter(model, args.k)

    tasks = load_tasks(TASK_KINDS, args.prompts_per_task)
    settings = BenchSettings(max_new_tokens=args.max_new_tokens, temperature=0.0)
    total = sum(len(v) for v in tasks.values()) * len(methods)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("bench", total=total)
        bench = run_bench(
            target, tokenizer, methods, tasks, settings, drafters=drafters,
            on_run=lambda r, _: progress.update(bar, advance=1, description=f"{r.task} {r.method}"),
        )  # fmt: skip
    summary = summarise(bench)
    result = {
        "meta": {
            "target": TARGET,
            "medusa_dir": str(folder),
            "heads": json.loads((folder / "medusa.json").read_text())["config"],
            "pruned_layers": args.pruned_layers,
            "distilled": {
                str(layers): {
                    "tokens": args.distill_tokens,
                    "epochs": args.distill_epochs,
                    "data": args.data,
                    "held_out_agreement": d["held_out_top1"],
                }
                for layers, d in distilled.items()
            },
            "k": args.k,
            "prompts_per_task": args.prompts_per_task,
            "max_new_tokens": args.max_new_tokens,
            "threads": torch.get_num_threads(),
            "machine": describe_machine(),
        },
        "methods": [m.label for m in methods],
        "summary": summary,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    report = render(result, list(tasks))
    (args.out / "report.md").write_text(report)
    console.print(report)


def render(result: dict, tasks: list[str]) -> str:
    meta, summary = result["meta"], result["summary"]
    methods = [m for m in result["methods"] if m != "ar"]
    heads = meta["heads"]
    lines = [
        f"# Exercise 3: Medusa heads against a pruned draft model, {meta['target']}",
        "",
        f"Machine: {meta['machine']}; {meta['threads']} threads. Greedy, "
        f"{meta['prompts_per_task']} prompts per task kind, {meta['max_new_tokens']} new "
        f"tokens, chat template. Medusa: {heads['num_heads']} heads of {heads['num_layers']} "
        f"residual block(s) on the target's LM head ({meta['medusa_dir']}). Pruned drafts: "
        f"the target's first layers, final norm and head, k = {meta['k']}; '+ exit' adds a "
        "residual block before the head, distilled toward the full model's own next tokens "
        "(held-out agreement: "
        + ", ".join(
            f"{layers} layers {d['held_out_agreement']['top1']:.1%}"
            for layers, d in meta["distilled"].items()
        )
        + ").",
        "",
        "Mean accepted length (tokens per target forward, bonus included):",
        "",
        "| method | " + " | ".join(tasks) + " | mean over tasks | pooled |",
        "|---|" + "---|" * (len(tasks) + 2),
    ]
    for label in methods:
        values = [summary[t][label]["mean_accepted_length"] or 0 for t in tasks]
        lines.append(
            f"| {label} | "
            + " | ".join(f"{v:.2f}" for v in values)
            + f" | {statistics.fmean(values):.2f} | "
            f"{summary['all'][label]['mean_accepted_length']:.2f} |"
        )
    lines += [
        "",
        "Overall (speedups: median over prompts of the ratio to plain decoding in the same run):",
        "",
        "| method | acceptance by position (depth) | drafting ms per drafted position | "
        "decode speedup | end-to-end speedup | identical to ar |",
        "|---|---|---|---|---|---|",
    ]
    for label in methods:
        row = summary["all"][label]
        rates = ", ".join(f"{x:.2f}" for x in row["acceptance_by_position"] if x is not None)
        lines.append(
            f"| {label} | {rates} | {row['draft_step_ms']:.2f} | "
            f"{row['decode_speedup_over_ar']:.2f}x | {row['speedup_over_ar']:.2f}x | "
            f"{row['identical_to_ar']} |"
        )
    ar = summary["all"]["ar"]
    lines += [
        f"| ar | | | 1.00x ({ar['decode_tokens_per_s_median']:.1f} tok/s) | 1.00x "
        f"({ar['tokens_per_s_median']:.1f} tok/s) | |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
