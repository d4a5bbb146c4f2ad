"""Where does a quantized target's step go? A decode step (1 token) and a tree verify (16
tokens) of the native runner, profiled by operator, against the weight-read floor.

The target is loaded as ``quickdraft generate --quant`` loads it, a prompt of ``--context``
tokens is prefilled and committed, then decode steps and verify passes run alternately
(``--repeats`` each, never committed, so every pass sees the same context), each with the
decoder layers fused into one compiled call (``models.fused``, what a q4 target runs) and
layer by layer in PyTorch (``fuse = False``), alternating. Wall time is the
median of passes timed without the profiler; the operator table comes from one profiled run
of each kind (torch.profiler, self CPU time summed per operator), grouped into what the issue
asks about: projections (the quantized kernel), the head, attention, norms, rotary, the cache,
other elementwise work, and what no operator accounts for (Python, dispatch, the mask).

    python benchmarks/step_profile.py --model qwen2.5-coder-1.5b --quant q4 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from quickdraft.bench.machine import describe_machine
from quickdraft.models.llama import quant_layout
from quickdraft.models.loading import load_model

RESULTS = Path(__file__).parent / "results"

# operator name fragments -> group, first match wins (names as torch.profiler reports them)
GROUPS = (
    ("decoder_layers", "decoder layers (fused: all but the head)"),
    ("superblock_linear", "projections"),
    ("group_linear", "projections"),
    ("quickdraft_kernels::attend", "attention"),
    ("aten::linear", "projections (float)"),
    ("aten::addmm", "projections (float)"),
    ("mkldnn", "projections (float)"),
    ("aten::pow", "norms"),
    ("aten::mean", "norms"),
    ("aten::rsqrt", "norms"),
    ("aten::cat", "rotary"),
    ("aten::neg", "rotary"),
    ("aten::index_put", "cache"),
    ("aten::index", "cache / gathers"),
    ("aten::nonzero", "mask / slots"),
    ("aten::unique", "mask / slots"),
    ("aten::sum", "mask / slots"),
    ("aten::eq", "mask / slots"),
    ("aten::silu", "mlp elementwise"),
)


def group_of(name: str) -> str:
    for fragment, group in GROUPS:
        if fragment in name:
            return group
    return "other operators"


def tree_mask(size: int) -> torch.Tensor:
    """A binary-ish tree of ``size`` nodes in breadth-first order: node i's parent is
    (i - 1) // 2 (what a dynamic EAGLE tree of width 2 looks like)."""
    parents = [-1] + [(i - 1) // 2 for i in range(1, size)]
    mask = torch.zeros(size, size, dtype=torch.bool)
    for node in range(size):
        at = node
        while at >= 0:
            mask[node, at] = True
            at = parents[at]
    return mask


def run_pass(model, cache, tokens, positions, mask, fuse) -> None:
    model.fuse = fuse
    model.forward(tokens, positions, cache, mask)


def operator_table(
    model, cache, tokens, positions, mask, fuse, repeats: int
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """(ms a pass per group, {operator: (ms, calls) a pass}), self CPU time averaged over
    ``repeats`` profiled passes."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            run_pass(model, cache, tokens, positions, mask, fuse)
    totals: dict[str, float] = defaultdict(float)
    operators = {}
    for event in prof.key_averages():
        ms = event.self_cpu_time_total / 1000 / repeats
        totals[group_of(event.key)] += ms
        operators[event.key] = (ms, event.count / repeats)
    return dict(totals), operators


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--quant", default="q4", choices=["q4", "int8", "float32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--verify", type=int, default=16, help="tree nodes in a verify pass")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=RESULTS / "step_profile")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    quant = None if args.quant == "float32" else args.quant
    model, tokenizer = load_model(args.model, quant=quant)
    text = Path(torch.__file__).read_text()  # any long text; the content does not matter
    prompt = tokenizer.encode(text)[: args.context]
    cache = model.new_cache(1, args.context + args.verify + 8)
    model.forward(torch.tensor([prompt]), torch.arange(len(prompt)).unsqueeze(0), cache, None)
    cache.commit(len(prompt))
    passes = {
        "decode (1 token)": (1, None),
        f"verify ({args.verify}-node tree)": (args.verify, tree_mask(args.verify)),
    }
    kinds = {}
    for fuse in (True, False):
        for name, (count, mask) in passes.items():
            kinds[f"{name}, {'fused' if fuse else 'layer by layer'}"] = (count, mask, fuse)
    inputs = {}
    for name, (count, mask, fuse) in kinds.items():
        tokens = torch.tensor([prompt[:count]])
        depth = mask.sum(-1) - 1 if mask is not None else torch.zeros(1, dtype=torch.long)
        positions = (len(prompt) + depth).unsqueeze(0)
        inputs[name] = (tokens, positions, mask, fuse)

    for name in kinds:  # warm up
        run_pass(model, cache, *inputs[name])
    times: dict[str, list[float]] = {name: [] for name in kinds}
    for _ in range(args.repeats):
        for name in kinds:
            start = time.perf_counter()
            run_pass(model, cache, *inputs[name])
            times[name].append((time.perf_counter() - start) * 1000)
    walls = {name: statistics.median(values) for name, values in times.items()}
    profiled = {name: operator_table(model, cache, *inputs[name], 3) for name in kinds}
    tables = {name: found[0] for name, found in profiled.items()}
    operators = {name: found[1] for name, found in profiled.items()}

    linears = [
        linear
        for layer in model.layers
        for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)
    ] + [model.head]
    weight_bytes = sum(
        linear.quantized_weights.nbytes for linear in linears if linear.quantized_weights
    )
    machine = describe_machine()
    report = {
        "model": args.model,
        "quant": args.quant,
        "layout": quant_layout(model),
        "context": args.context,
        "threads": args.threads,
        "machine": machine,
        "weight_bytes": weight_bytes,
        "wall_ms": walls,
        "groups_ms": tables,
        "operators_ms_calls": operators,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    groups = sorted(
        {g for table in tables.values() for g in table},
        key=lambda g: -max(table.get(g, 0.0) for table in tables.values()),
    )
    lines = [
        f"# Step profile: {args.model}, {args.quant} ({quant_layout(model)}), "
        f"context {args.context}, {args.threads} threads",
        "",
        f"Machine: {machine}. Quantized weights read a token: {weight_bytes / 1e9:.3f} GB.",
        "",
        "| | " + " | ".join(kinds) + " |",
        "|---|" + "---|" * len(kinds),
        f"| wall (median of {args.repeats}) | "
        + " | ".join(f"{walls[k]:.1f} ms" for k in kinds)
        + " |",
    ]
    for group in groups:
        lines.append(
            f"| {group} | " + " | ".join(f"{tables[k].get(group, 0.0):.1f}" for k in kinds) + " |"
        )
    lines.append(
        "| not in any operator (Python, dispatch) | "
        + " | ".join(f"{walls[k] - sum(tables[k].values()):.1f}" for k in kinds)
        + " |"
    )
    for name in kinds:
        top = sorted(operators[name].items(), key=lambda item: -item[1][0])[:15]
        lines += ["", f"Operators of the {name} pass, self time (profiled):", ""]
        lines += ["| operator | ms | calls |", "|---|---|---|"]
        lines += [f"| {op} | {ms:.2f} | {calls:.0f} |" for op, (ms, calls) in top]
    lines += ["", "    " + " ".join(["python benchmarks/step_profile.py", *sys.argv[1:]]), ""]
    args.out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
