"""Do 2 MB pages for a q4 target's packed weights make its decode step faster?

``load_model(..., quant="q4")`` gathers every packed weight into one region advised for
transparent huge pages (``models.quantized.gather``). This loads the target so, keeps a second
copy of the same weights in ordinary allocations (4 KB pages where transparent huge pages are
in "madvise" mode, as ``/sys/kernel/mm/transparent_hugepage/enabled`` says), and swaps the model
between the two run by run, alternating which goes first: greedy plain decoding of one prompt,
``--tokens`` tokens, the time between steps (the prefill left out). The same bytes, so both give
the same tokens (checked).

    python benchmarks/huge_pages.py --model qwen2.5-coder-1.5b --pairs 8
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from quickdraft import SamplingParams, generate
from quickdraft.bench.machine import describe_machine
from quickdraft.models.loading import load_model
from quickdraft.models.ops import StackedWeights, parts_of

RESULTS = Path(__file__).parent / "results"
PROMPT = "Write a Python function that parses an ISO 8601 date string and returns a datetime."


def small_pages(weights):
    """The same weights in ordinary allocations (a clone per part)."""
    parts = [dataclasses.replace(p, packed=p.packed.clone()) for p in parts_of(weights)]
    return StackedWeights(tuple(parts)) if isinstance(weights, StackedWeights) else parts[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS / "huge_pages")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, quant="q4")
    linears = [model.head] + [
        linear
        for layer in model.layers
        for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)
    ]
    forms = {
        "2 MB pages (gathered)": [linear.quantized_weights for linear in linears],
        "4 KB pages": [small_pages(linear.quantized_weights) for linear in linears],
    }
    anon = Path("/proc/meminfo").read_text().split("AnonHugePages:")[1].split("\n")[0].strip()
    ids = tokenizer.encode(PROMPT)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.tokens, ignore_eos=True)

    def run(name: str) -> tuple[float, list[int]]:
        for linear, weights in zip(linears, forms[name], strict=True):
            linear.use_quantized(weights)
        model._stacks.clear()
        stamps: list[float] = []
        out = generate(
            model, ids, sampling=sampling, on_step=lambda _: stamps.append(time.perf_counter())
        )
        return (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1000, out.token_ids

    names = list(forms)
    times: dict[str, list[float]] = {name: [] for name in names}
    tokens = {}
    run(names[0])  # warm up
    for pair in range(args.pairs):
        for name in names if pair % 2 == 0 else names[::-1]:
            ms, tokens[name] = run(name)
            times[name].append(ms)
        print(pair, {n: round(statistics.median(t), 2) for n, t in times.items()}, flush=True)
    big, small = (times[name] for name in names)
    ratios = [s / b for s, b in zip(small, big, strict=True)]
    report = {
        "model": args.model,
        "threads": args.threads,
        "machine": describe_machine(),
        "transparent_hugepage": Path("/sys/kernel/mm/transparent_hugepage/enabled")
        .read_text()
        .strip(),
        "anon_huge_pages": anon,
        "ms_per_token": times,
        "same_tokens": tokens[names[0]] == tokens[names[1]],
        "ratio_4k_over_2m": ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Huge pages for packed weights: {args.model}, q4, {args.threads} threads",
        "",
        f"Machine: {report['machine']}. Transparent huge pages: {report['transparent_hugepage']};"
        f" anonymous huge pages after the load: {anon}. Greedy, {args.tokens} tokens a run,"
        f" {args.pairs} pairs alternating which runs first; same tokens: {report['same_tokens']}.",
        "",
        "| weights | median ms/token | min | max |",
        "|---|---|---|---|",
    ]
    for name in names:
        t = times[name]
        lines.append(f"| {name} | {statistics.median(t):.2f} | {min(t):.2f} | {max(t):.2f} |")
    lines += [
        "",
        f"4 KB over 2 MB, pair by pair: median {statistics.median(ratios):.3f}"
        f" ({', '.join(f'{r:.3f}' for r in ratios)}).",
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
