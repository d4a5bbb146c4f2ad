"""Forward cost against tokens per forward: quickdraft's native runner beside transformers.

Three backends on the same weights: the native runner as ``load_model`` builds it (fused,
prepacked), the native runner on a transformers model's own tensors (``from_transformers``,
shared: no copy), and transformers itself.

Speculation on a CPU pays only if a (k+1)-token verify costs little more than a 1-token decode
step. For each thread count, after a fixed-length context, this times forwards of T new tokens
(the cache is cropped back after each, so every call sees the same context), sizes interleaved
call by call after a warm-up round; it reports medians and the T-token / 1-token ratio.

    python benchmarks/native_runner.py --model smollm2-135m --threads 1 2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from quickdraft.bench.machine import describe_machine
from quickdraft.models.hf import HFModel
from quickdraft.models.loading import from_transformers, load_model
from quickdraft.models.sources import resolve
from quickdraft.pick.calibrate import forward_costs

RESULTS = Path(__file__).parent / "results"


def medians_ms(model, context: int, sizes: list[int], repeats: int) -> dict[int, float]:
    """Median milliseconds of a T-token forward after ``context`` tokens, for each T."""
    seconds = forward_costs(model, context, sizes, repeats=repeats)
    return {size: 1000.0 * value for size, value in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 5, 9, 16])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=RESULTS / "native_runner.json")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    native, _ = load_model(args.model)
    model = AutoModelForCausalLM.from_pretrained(str(resolve(args.model)), dtype=torch.float32)
    backends = (
        ("quickdraft native", native),
        ("quickdraft from_transformers (shared)", from_transformers(model)),
        ("transformers", HFModel(model)),
    )
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name, model in backends:
            medians = medians_ms(model, args.context, args.sizes, args.repeats)
            rows.append(
                {
                    "backend": name,
                    "threads": threads,
                    "median_ms": medians,
                    "ratio_to_1_token": {size: medians[size] / medians[1] for size in args.sizes},
                }
            )
    report = {
        "model": args.model,
        "context": args.context,
        "repeats": args.repeats,
        "machine": describe_machine(),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Forward cost against tokens per forward: {args.model}",
        "",
        f"Context {args.context} tokens; median of {args.repeats} interleaved calls; "
        f"{report['machine']}.",
        "",
        "| backend | threads | " + " | ".join(f"T={s} ms" for s in args.sizes) + " | T=5 / T=1 |",
        "|---|---|" + "---|" * (len(args.sizes) + 1),
    ]
    for row in rows:
        cells = " | ".join(f"{row['median_ms'][s]:.1f}" for s in args.sizes)
        ratio = row["ratio_to_1_token"].get(5, float("nan"))
        lines.append(f"| {row['backend']} | {row['threads']} | {cells} | {ratio:.2f} |")
    text = "\n".join(lines) + "\n"
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
