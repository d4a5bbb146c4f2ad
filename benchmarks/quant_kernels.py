"""Which CPU kernel should a quantized target's projections use? Every candidate on the
projections of Qwen2.5-Coder-1.5B, at the row counts a decode step (1) and a verify pass
(6, 16) feed.

Candidates: quickdraft's superblock kernel (``kernels.superblock``) with 4-bit and 8-bit codes
on each compiled path this CPU runs;
float32 ``F.linear``; float32 prepacked for oneDNN (the native runner's default);
quickdraft's int8 (``models.int8``: fbgemm's dynamic int8 product with per-row activation
scales, anchor channels and no outlier columns here); PyTorch's weight-only int8
(``_weight_int8pack_mm``) and int4 (``_weight_int4pack_mm_for_cpu``, groups of 32) with
float32 and with bfloat16 activations (their AVX-512 paths are written for bfloat16). Random
weights of the real shapes; the kernels' cost does not depend on the values. Calls are
interleaved candidate by candidate and the median of ``--repeats`` is reported, with the
per-token total over the model's 28 layers and its head. A candidate whose median passes
``--slow-ms`` at one row count is not run at the larger ones (a dash in the tables).
Small projections stay in cache across repeated calls here; ``weight_stream.py`` measures
the rate at which weights stream from memory.

``--streamed`` times what a decode step and a verify pass of the real model do instead: the
4-bit kernel on every compiled path over 28 distinct layers of each projection and the head
(about 0.9 GB, far more than any cache), in model order, so every weight comes from memory
once a pass; with each row count's ratio to one row and the one-row weight read rate against
the memory's own (a float32 sum of 1 GB).

    python benchmarks/quant_kernels.py --threads 2
    python benchmarks/quant_kernels.py --kernels "quickdraft q4" --out results/quant_kernels_q4.json
    python benchmarks/quant_kernels.py --streamed --rows 1 8 16 \
        --out results/quant_kernels_streamed.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import timeit
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from quickdraft import kernels
from quickdraft.bench.machine import describe_machine
from quickdraft.kernels import superblock
from quickdraft.models.ops import Linear

RESULTS = Path(__file__).parent / "results"
LAYERS = 28
# (name, out, in, times per token): Qwen2.5-Coder-1.5B, q/k/v and gate/up fused as the
# native runner fuses them.
SHAPES = (
    ("qkv", 2048, 1536, LAYERS),
    ("o", 1536, 1536, LAYERS),
    ("gate_up", 17920, 1536, LAYERS),
    ("down", 1536, 8960, LAYERS),
    ("head", 151936, 1536, 1),
)
GROUP = 32


def int4_weights(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's packed int4 weight and its [in / group, out, 2] scales and zeros: asymmetric
    groups of 32, w = (q - 8) * scale + zero."""
    out, inner = weight.shape
    grouped = weight.view(out, inner // GROUP, GROUP)
    high, low = grouped.amax(-1, keepdim=True), grouped.amin(-1, keepdim=True)
    scale = ((high - low) / 15).clamp_min(1e-8)
    codes = ((grouped - low) / scale).round().clamp(0, 15).to(torch.int32).view(out, inner)
    zero = low + 8 * scale
    pairs = torch.stack([scale.view(out, -1).t(), zero.view(out, -1).t()], -1).contiguous()
    return torch._convert_weight_to_int4pack_for_cpu(codes, 1), pairs.to(dtype)


def candidates(weight: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    packed = Linear(weight.clone())
    int8 = Linear(weight.clone(), int8=True)
    scale8 = weight.abs().amax(1) / 127
    codes8 = (weight / scale8.unsqueeze(1)).round().to(torch.int8)
    int4_f, pairs_f = int4_weights(weight, torch.float32)
    int4_b, pairs_b = int4_weights(weight, torch.bfloat16)
    scale8_b = scale8.bfloat16()
    paths = [path for path in kernels.runnable_paths() if path != kernels.REFERENCE]
    layers = {}
    for bits in (4, 8):
        codes = superblock.quantize(weight, bits)
        for path in paths:
            name = f"quickdraft {'q4' if bits == 4 else '8-bit'} ({path})"
            layers[name] = superblock.SuperWeights.build(codes, None, path)
    return {
        **{name: partial(superblock.linear, weights=layer) for name, layer in layers.items()},
        "float32 F.linear": lambda x: F.linear(x, weight),
        "float32 prepacked": lambda x: packed(x),
        "quickdraft int8": lambda x: int8(x),
        "int8 weight-only (fp32)": lambda x: torch._weight_int8pack_mm(x, codes8, scale8),
        "int8 weight-only (bf16)": lambda x: torch._weight_int8pack_mm(
            x.bfloat16(), codes8, scale8_b
        ),
        "int4 weight-only (fp32)": lambda x: torch._weight_int4pack_mm_for_cpu(
            x, int4_f, GROUP, pairs_f
        ),
        "int4 weight-only (bf16)": lambda x: torch._weight_int4pack_mm_for_cpu(
            x.bfloat16(), int4_b, GROUP, pairs_b
        ),
    }


def streamed(args: argparse.Namespace) -> None:
    """The q4 kernel over a whole model's distinct projections, paths interleaved."""
    paths = [path for path in kernels.runnable_paths() if path != kernels.REFERENCE]
    if not paths:
        raise SystemExit("--streamed: no compiled 4-bit path runs on this host")
    # One quantization per shape, then a copy per layer: the cost does not depend on the
    # values, only on where they lie.
    codes = {name: superblock.quantize(torch.randn(out, inner) * 0.02, 4)
             for name, out, inner, _ in SHAPES}  # fmt: skip
    by_layer: dict[str, list[superblock.SuperWeights]] = {}
    for path in paths:
        built = {name: superblock.SuperWeights.build(c, None, path) for name, c in codes.items()}
        copies = {name: [built[name]] + [replace(built[name], packed=built[name].packed.clone())
                                         for _ in range(times - 1)]
                  for name, _, _, times in SHAPES}  # fmt: skip
        # In the order a pass reads them: layer by layer (the shapes used 28 times), the head.
        by_layer[path] = [copies[name][i] for i in range(LAYERS) for name, *_, times in SHAPES
                          if times == LAYERS] + copies["head"]  # fmt: skip
    weight_gb = sum(w.nbytes for w in by_layer[paths[0]]) / 1e9
    # The memory's own rate is read in turn with the passes: on a shared host it drifts by a
    # fifth within minutes, and a rate measured once would misstate the passes' share of it.
    raw = torch.ones(250_000_000)  # 1 GB
    memory: list[float] = []
    samples: dict[tuple[str, int], list[float]] = {}
    for n in args.rows:
        inputs = {inner: torch.randn(n, inner) for inner in {s[2] for s in SHAPES}}
        for rep in range(args.repeats + 1):  # one warm-up round, dropped below
            for path in paths:
                start = time.perf_counter()
                for layer in by_layer[path]:
                    superblock.linear(inputs[layer.in_features], layer)
                samples.setdefault((path, n), []).append(time.perf_counter() - start)
            if rep:
                memory.append(1.0 / min(timeit.repeat(raw.sum, number=1, repeat=2)))
    memory_gb_s = statistics.median(memory)
    report = {
        "model": "Qwen2.5-Coder-1.5B projections, 28 distinct layers and the head, streamed",
        "threads": args.threads,
        "repeats": args.repeats,
        "machine": describe_machine(),
        "weight_gb": round(weight_gb, 3),
        "memory_gb_s": round(memory_gb_s, 2),
        "per_pass_ms": {
            path: {
                str(n): round(1000 * statistics.median(samples[path, n][1:]), 2) for n in args.rows
            }
            for path in paths
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    text = render_streamed(report, args.rows)
    args.out.with_suffix(".md").write_text(text)
    print(text)


def render_streamed(report: dict, rows: list[int]) -> str:
    lines = [
        "# The 4-bit kernel streaming Qwen2.5-Coder-1.5B's projections",
        "",
        f"{report['machine']}; {report['threads']} threads; median of {report['repeats']} "
        f"passes, paths interleaved. A pass: every projection of 28 distinct layers and the "
        f"head once, {report['weight_gb']:.2f} GB of weights, in model order. Memory read rate "
        f"(float32 sum of 1 GB, median of one after each round of passes): "
        f"{report['memory_gb_s']:.1f} GB/s.",
        "",
        "| path | "
        + " | ".join(f"{n} row{'s' * (n > 1)} ms (x 1 row)" for n in rows)
        + " | 1 row: weights GB/s (of memory rate) |",
        "|---|" + "---|" * (len(rows) + 1),
    ]
    for path, by_rows in report["per_pass_ms"].items():
        one = by_rows[str(rows[0])] if rows[0] == 1 else None
        cells = [
            f"{by_rows[str(n)]:.1f}" + (f" ({by_rows[str(n)] / one:.2f})" if one else "")
            for n in rows
        ]
        rate = "-"
        if one:
            gb_s = report["weight_gb"] / (one / 1000)
            rate = f"{gb_s:.1f} ({gb_s / report['memory_gb_s']:.0%})"
        lines.append(f"| {path} | " + " | ".join(cells) + f" | {rate} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--slow-ms", type=float, default=500.0)
    parser.add_argument(
        "--kernels",
        nargs="+",
        default=None,
        help="only the candidates whose name contains one of these, e.g. 'quickdraft q4' for "
        "the 4-bit kernel on every path this CPU runs",
    )
    parser.add_argument(
        "--streamed",
        action="store_true",
        help="the 4-bit kernel over 28 distinct layers and the head, from memory (see above)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "quant_kernels.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.streamed:
        return streamed(args)
    per_token: dict[str, dict[int, float]] = {}
    rows = []
    for name, out, inner, _ in SHAPES:
        weight = torch.randn(out, inner) * 0.02
        calls = candidates(weight)
        if args.kernels:
            calls = {k: call for k, call in calls.items() if any(f in k for f in args.kernels)}
        inputs = {n: torch.randn(n, inner) for n in args.rows}
        samples: dict[tuple[str, int], list[float]] = {}
        slow: set[str] = set()
        for n in args.rows:
            running = [kernel for kernel in calls if kernel not in slow]
            for _ in range(args.repeats + 2):  # two warm-up rounds, dropped below
                for kernel in running:
                    start = time.perf_counter()
                    calls[kernel](inputs[n])
                    samples.setdefault((kernel, n), []).append(time.perf_counter() - start)
            for kernel in running:
                if 1000 * statistics.median(samples[kernel, n][2:]) > args.slow_ms:
                    slow.add(kernel)
        for (kernel, n), times in samples.items():
            ms = 1000 * statistics.median(times[2:])
            rows.append({"shape": name, "out": out, "in": inner, "kernel": kernel, "rows": n,
                         "median_ms": round(ms, 4)})  # fmt: skip
        del calls
    # Per token: the sum over every shape, where a kernel ran at that row count on all of them.
    for kernel in dict.fromkeys(r["kernel"] for r in rows):
        for n in args.rows:
            found = [r for r in rows if r["kernel"] == kernel and r["rows"] == n]
            if len(found) == len(SHAPES):
                by_shape = {shape[0]: shape[3] for shape in SHAPES}
                total = sum(r["median_ms"] * by_shape[r["shape"]] for r in found)
                per_token.setdefault(kernel, {})[n] = total
    report = {
        "model": "Qwen2.5-Coder-1.5B projections (random weights of the real shapes)",
        "threads": args.threads,
        "repeats": args.repeats,
        "machine": describe_machine(),
        "rows": rows,
        "per_token_ms": {
            kernel: {str(n): round(ms, 2) for n, ms in by_rows.items()}
            for kernel, by_rows in per_token.items()
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# Quantized kernels on CPU: Qwen2.5-Coder-1.5B's projections",
        "",
        f"{report['machine']}; {args.threads} threads; median of {args.repeats} interleaved "
        "calls. Per token: every projection of the 28 layers and the head, once.",
        "",
        "| kernel | " + " | ".join(f"{n} row{'s' * (n > 1)} ms" for n in args.rows) + " |",
        "|---|" + "---|" * len(args.rows),
    ]
    for kernel, by_rows in per_token.items():
        cells = [f"{by_rows[n]:.1f}" if n in by_rows else "-" for n in args.rows]
        lines.append(f"| {kernel} | " + " | ".join(cells) + " |")
    lines += ["", "Per shape:", "", "| shape | kernel | " + " | ".join(
        f"{n} ms" for n in args.rows) + " |", "|---|---|" + "---|" * len(args.rows)]  # fmt: skip
    median = {(r["shape"], r["kernel"], r["rows"]): r["median_ms"] for r in rows}
    for name, *_ in SHAPES:
        for kernel in per_token:
            cells = [median.get((name, kernel, n)) for n in args.rows]
            text_cells = ["-" if c is None else f"{c:.2f}" for c in cells]
            lines.append(f"| {name} | {kernel} | " + " | ".join(text_cells) + " |")
    text = "\n".join(lines) + "\n"
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
