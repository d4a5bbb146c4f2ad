"""int8 draft models against their float originals: accuracy on the load-time probe and the
cost of one decode step.

For each model: the probe check ``load_model(..., int8=True)`` runs (top-1 agreement and
relative logit error over the probe text, ``models.int8.PROBE_TEXT``), and the median time of
a one-token forward after a 128-token prefix, float32 (prepacked) and int8, interleaved.

    python benchmarks/int8_accuracy.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from quickdraft.bench.machine import describe_machine
from quickdraft.models.loading import load_model

RESULTS = Path(__file__).parent / "results"


def step_ms(model, repeats: int) -> list[float]:
    """One-token forwards after a 128-token prefix: every sample in ms."""
    prefix = 128
    cache = model.new_cache(1, prefix + 1)
    ids = torch.arange(prefix).remainder(model.vocab_size).unsqueeze(0)
    model.forward(ids, torch.arange(prefix).unsqueeze(0), cache)
    cache.commit(prefix)
    token, position = ids[:, -1:], torch.tensor([[prefix]])
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.forward(token, position, cache)
        samples.append(1000.0 * (time.perf_counter() - start))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, default=RESULTS / "int8_accuracy.json")
    args = parser.parse_args()
    if args.repeats < 3:
        parser.error("--repeats must be at least 3 (three interleaved rounds)")
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models.split(","):
        started = time.perf_counter()
        quantized, _ = load_model(name, int8=True, int8_fallback=False)
        load_seconds = time.perf_counter() - started
        original, _ = load_model(name)
        check = quantized.quant_check
        timings: dict[str, list[float]] = {"float32": [], "int8": []}
        for _ in range(3):  # interleaved rounds: both see the same machine drift
            timings["float32"] += step_ms(original, args.repeats // 3)
            timings["int8"] += step_ms(quantized, args.repeats // 3)
        medians = {kind: statistics.median(samples) for kind, samples in timings.items()}
        rows.append(
            {
                "model": name,
                "top1_agreement": check.top1_agreement,
                "relative_logit_error": check.relative_error,
                "probe_positions": check.positions,
                "int8_load_seconds": load_seconds,
                "decode_step_ms": medians,
                "int8_step_over_float": medians["int8"] / medians["float32"],
            }
        )
        print(rows[-1], flush=True)
        del quantized, original
    report = {"machine": f"{describe_machine()}, {args.threads} threads", "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# int8 draft models against float",
        "",
        f"{report['machine']}. Probe: `quickdraft.models.int8.PROBE_TEXT` (calibration on a "
        "different text). Decode step: one token after a 128-token prefix, median.",
        "",
        "| model | top-1 agreement | relative logit error | float32 step ms | int8 step ms "
        "| int8 / float | int8 load s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        steps = row["decode_step_ms"]
        lines.append(
            f"| {row['model']} | {row['top1_agreement']:.1%} | "
            f"{row['relative_logit_error']:.3f} | {steps['float32']:.1f} | {steps['int8']:.1f} | "
            f"{row['int8_step_over_float']:.2f} | {row['int8_load_seconds']:.1f} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
