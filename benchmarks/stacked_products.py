"""What a q4 target's fused products in runs of rows (``ops.StackedWeights``) save against the
8-bit codes they had as one tensor: the same model loaded once, each stacked product given a
second form (its weights, read back through the kernel, in 8-bit groups, as the load gave them
before), then a decode step (1 token) and a tree verify (16 nodes) after a 256-token prompt,
the two forms swapped pass by pass, medians of ``--repeats``. The outputs differ only by the
8-bit rounding of those products; the time is what is compared.

    python benchmarks/stacked_products.py --model qwen2.5-coder-1.5b --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from quickdraft.bench.machine import describe_machine
from quickdraft.kernels import groups
from quickdraft.models.loading import load_model
from quickdraft.models.ops import StackedWeights, quantized_linear

RESULTS = Path(__file__).parent / "results"


def whole_form(weights: StackedWeights) -> groups.GroupWeights:
    """The product's weights as one tensor in 8-bit groups: its dense weight read back through
    the kernel (an identity input's rows quantize exactly), then quantized again."""
    eye = torch.eye(weights.in_features)
    dense = quantized_linear(eye, weights).T.contiguous()
    bias = None
    if weights.parts[0].bias is not None:
        bias = torch.cat([part.bias for part in weights.parts])
        dense -= bias.unsqueeze(1)
    return groups.GroupWeights.build(groups.quantize(dense, 8), bias)


def main() -> None:
    from step_profile import tree_mask  # beside this script

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--verify", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--out", type=Path, default=RESULTS / "stacked_products.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, quant="q4")
    linears = [linear for linear in model._projections()
               if isinstance(linear.quantized_weights, StackedWeights)]  # fmt: skip
    if not linears:
        raise SystemExit(f"{args.model}: no product of its q4 load is stacked; nothing to compare")
    forms = {"runs": [linear.quantized_weights for linear in linears],
             "8-bit": [whole_form(linear.quantized_weights) for linear in linears]}  # fmt: skip
    total = sum(linear.quantized_weights.nbytes for linear in model._projections())
    sizes = {name: total - sum(w.nbytes for w in forms["runs"]) + sum(w.nbytes for w in ws)
             for name, ws in forms.items()}  # fmt: skip

    def use(name: str) -> None:
        for linear, weights in zip(linears, forms[name], strict=True):
            linear.use_quantized(weights)
        model._stacks.clear()

    text = Path(torch.__file__).read_text()  # any long text; the content does not matter
    prompt = tokenizer.encode(text)[: args.context]
    cache = model.new_cache(1, args.context + args.verify + 8)
    model.forward(torch.tensor([prompt]), torch.arange(len(prompt)).unsqueeze(0), cache, None)
    cache.commit(len(prompt))
    mask = tree_mask(args.verify)
    passes = {
        "decode 1": (torch.tensor([prompt[:1]]), torch.tensor([[len(prompt)]]), None),
        f"verify {args.verify}": (torch.tensor([prompt[: args.verify]]),
                                  (len(prompt) + mask.sum(-1) - 1).unsqueeze(0), mask),
    }  # fmt: skip
    times = {(name, p): [] for name in forms for p in passes}
    for _ in range(args.repeats + 2):
        for p, (tokens, positions, tree) in passes.items():
            for name in forms:
                use(name)
                start = time.perf_counter()
                model.forward(tokens, positions, cache, tree)
                times[name, p].append(time.perf_counter() - start)
    table = {name: {p: round(1000 * statistics.median(times[name, p][2:]), 2) for p in passes}
             for name in forms}  # fmt: skip
    report = {"model": args.model, "machine": describe_machine(), "threads": args.threads,
              "context": args.context, "repeats": args.repeats, "stacked": len(linears),
              "MiB a token": {k: round(v / 2**20, 1) for k, v in sizes.items()},
              "ms": table}  # fmt: skip
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    for p in passes:
        print(f"{p}: 8-bit / runs = {table['8-bit'][p] / table['runs'][p]:.3f}x")


if __name__ == "__main__":
    main()
