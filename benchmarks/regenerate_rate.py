"""How fast ``quickdraft data regenerate`` writes training replies, by batch size: tokens per
second of the whole run (prefill included) for the same prompts, one batch size after another
in rotating order within every round, medians over rounds.

Prompts: ``data code-prompts`` and ``data doc-prompts`` records (standard library functions
and docstrings, man pages), alternately, never the bench's. Batch size 1 runs the first
``--single`` prompts only (its rate per token does not depend on how many).

    python benchmarks/regenerate_rate.py qwen2.5-coder-1.5b --quant q4 --batches 1,8,16,32
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from quickdraft import kernels
from quickdraft.bench.machine import describe_machine
from quickdraft.bench.tasks import TASK_DIR
from quickdraft.config import SamplingParams
from quickdraft.models.loading import load_model
from quickdraft.train.replies import regenerate
from quickdraft.train.sources import code_prompts, document_prompts

RESULTS = Path(__file__).parent / "results" / "regenerate_rate"


def prompt_records(count: int) -> list[dict]:
    code = code_prompts(count, task_dir=TASK_DIR, seed=7)
    docs = document_prompts(count, task_dir=TASK_DIR, seed=7)
    mixed = [r for pair in zip(code, docs, strict=False) for r in pair][:count]
    return [
        {"index": i, "line": i + 1, "kind": r["kind"],
         "messages": [{"role": "user", "content": r["prompt"]}]}
        for i, r in enumerate(mixed)
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="qwen2.5-coder-1.5b")
    parser.add_argument("--quant", default="q4", help="float, int8 or q4")
    parser.add_argument("--batches", default="1,8,16,32")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--single", type=int, default=6, help="prompts batch size 1 runs")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    quant = None if args.quant == "float" else args.quant
    model, tokenizer = load_model(args.model, quant=quant)
    prompts = prompt_records(args.prompts)
    sampling = SamplingParams(
        temperature=0.0, max_new_tokens=args.max_new_tokens, stop_token_ids=tokenizer.eos_token_ids
    )
    batches = [int(b) for b in args.batches.split(",")]
    runs: list[dict] = []
    for round_ in range(args.rounds):
        order = batches[round_ % len(batches) :] + batches[: round_ % len(batches)]
        for batch in order:
            chosen = prompts[: args.single] if batch == 1 else prompts
            with tempfile.TemporaryDirectory() as folder:
                start = time.perf_counter()
                counts = regenerate(
                    model, tokenizer, chosen, Path(folder) / "out.jsonl", sampling,
                    name=args.model, batch_size=batch,
                )  # fmt: skip
                wall = time.perf_counter() - start
            runs.append({"round": round_, "batch": batch, "prompts": len(chosen),
                         "tokens": counts["tokens"], "seconds": wall})  # fmt: skip
            print(json.dumps(runs[-1]), flush=True)
    result = {
        "meta": {
            "model": args.model, "quant": args.quant, "kernel": kernels.best_path(),
            "machine": describe_machine(), "threads": args.threads,
            "max_new_tokens": args.max_new_tokens, "prompts": args.prompts,
            "single": args.single, "rounds": args.rounds,
        },
        "runs": runs,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "report.md").write_text(render(result))
    print(render(result))


def render(result: dict) -> str:
    meta, runs = result["meta"], result["runs"]
    rates: dict[int, list[float]] = {}
    for run in runs:
        rates.setdefault(run["batch"], []).append(run["tokens"] / run["seconds"])
    one = statistics.median(rates[1]) if 1 in rates else None
    lines = [
        f"# `data regenerate` rate: {meta['model']} ({meta['quant']}, kernel {meta['kernel']})",
        "",
        f"{meta['machine']}; {meta['threads']} threads; up to {meta['max_new_tokens']} new "
        f"tokens a reply, greedy; {meta['prompts']} prompts (batch 1: the first "
        f"{meta['single']}); tokens/s of the whole run, prefill included; medians of "
        f"{meta['rounds']} rounds, batch sizes in rotating order.",
        "",
        "| batch | tokens/s | x batch 1 | tokens an hour |",
        "|---|---|---|---|",
    ]
    for batch in sorted(rates):
        rate = statistics.median(rates[batch])
        ratio = f"{rate / one:.2f}" if one else "-"
        lines.append(f"| {batch} | {rate:.1f} | {ratio} | {rate * 3600:,.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
