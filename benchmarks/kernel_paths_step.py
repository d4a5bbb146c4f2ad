"""Which compiled path should a q4 target's steps run? The same model loaded once per path
(``kernels.runnable_paths``; the paths give the same bits, so only time differs), then a
decode step (1 token) and a tree verify (16 nodes) after a 256-token prompt, alternating path
by path, medians of ``--repeats``. Where ``quant_kernels.py`` times the projections alone (the
small ones stay in cache there), this streams the whole model from memory as generation does.

    python benchmarks/kernel_paths_step.py --model qwen2.5-coder-1.5b --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from quickdraft import kernels
from quickdraft.bench.machine import describe_machine
from quickdraft.models.loading import load_model

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    from step_profile import tree_mask  # beside this script

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--verify", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=RESULTS / "kernel_paths_step.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    paths = [path for path in kernels.runnable_paths() if path != kernels.REFERENCE]
    best = kernels.best_path
    models = {}
    for path in paths:
        kernels.best_path = lambda path=path: path  # what the load packs for and names
        models[path], tokenizer = load_model(args.model, quant="q4")
    kernels.best_path = best
    text = Path(torch.__file__).read_text()  # any long text; the content does not matter
    prompt = tokenizer.encode(text)[: args.context]
    passes = {"decode 1": (1, None)} | {f"verify {n}": (n, tree_mask(n)) for n in args.verify}
    runs = {}
    for path, model in models.items():
        cache = model.new_cache(1, args.context + max(args.verify) + 8)
        model.forward(torch.tensor([prompt]), torch.arange(len(prompt)).unsqueeze(0), cache, None)
        cache.commit(len(prompt))
        for name, (count, mask) in passes.items():
            depth = mask.sum(-1) - 1 if mask is not None else torch.zeros(1, dtype=torch.long)
            runs[path, name] = (model, cache, torch.tensor([prompt[:count]]),
                                (len(prompt) + depth).unsqueeze(0), mask)  # fmt: skip
    times: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(args.repeats + 2):
        for name in passes:
            for path in paths:
                model, cache, tokens, positions, mask = runs[path, name]
                start = time.perf_counter()
                model.forward(tokens, positions, cache, mask)
                times[path, name].append(time.perf_counter() - start)
    table = {
        path: {name: round(1000 * statistics.median(times[path, name][2:]), 2) for name in passes}
        for path in paths
    }
    report = {"model": args.model, "machine": describe_machine(), "threads": args.threads,
              "context": args.context, "repeats": args.repeats, "ms": table}  # fmt: skip
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# q4 steps by kernel path: {args.model}",
        "",
        f"{report['machine']}; {args.threads} threads; after {args.context} prompt tokens; "
        f"medians of {args.repeats} passes, paths alternating. Milliseconds a pass.",
        "",
        "| path | " + " | ".join(passes) + " | " + " | ".join(
            f"{name} / decode" for name in passes if name != "decode 1") + " |",
        "|---|" + "---|" * (2 * len(passes) - 1),
    ]  # fmt: skip
    for path, row in table.items():
        ratios = [f"{row[name] / row['decode 1']:.2f}x" for name in passes if name != "decode 1"]
        lines.append(f"| {path} | " + " | ".join(f"{v:.1f}" for v in row.values()) + " | "
                     + " | ".join(ratios) + " |")  # fmt: skip
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
