"""How fast each CPU kernel for quantized weights streams weights that are not in cache: the
floor under a quantized target's decode step, which reads every weight once.

A stack of distinct Qwen-1.5B-sized gate/up projections (1536 -> 17920, 40 of them: 1.1 GB in
int8, more than any cache) goes through each kernel in turn, at 1, 6 and 16 rows (a decode
step, a chain verify, a tree verify; ``--rows`` sets them); medians of 9 passes, the kernels
in turn within each:

- quickdraft's 4-bit kernel (``kernels.superblock``: 4-bit weights in superblocks of 256 with
  integer sub-scales and minimums, int8 activations per superblock), on each compiled path
  this CPU runs;
- quickdraft's int8 product (``models.int8``, on fbgemm's ``quantized.linear_dynamic``);
- oneDNN's int8 product (``onednn.qlinear_pointwise``, u8 activations, float32 out);
- PyTorch's int4 weight-only product with bf16 activations (``_weight_int4pack_mm_for_cpu``,
  groups of 64), the only 4-bit kernel PyTorch has on CPU;
- a plain float32 read of the same int8 bytes (``Tensor.sum``), the memory's own rate.

Also whether each integer kernel gives a row the same result alone and in a batch (what a
quantized target's verify pass needs).

    python benchmarks/weight_stream.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import timeit
import warnings
from pathlib import Path

import torch

from quickdraft import kernels as compiled
from quickdraft.bench.machine import describe_machine
from quickdraft.kernels import superblock
from quickdraft.models import int8

RESULTS = Path(__file__).parent / "results"
N, K, GROUP = 17920, 1536, 64


def fbgemm(weights: list[torch.Tensor]):
    """quickdraft's own int8 product (``models.int8``: per-row activation scales, anchor
    channels, 7-bit weights), without outlier channels."""
    packed = [int8.pack(w, None, None) for w in weights]

    def run(x: torch.Tensor) -> list[torch.Tensor]:
        return [int8.linear(x, p) for p in packed]

    return run


def onednn(weights: list[torch.Tensor]):
    packed = []
    for w in weights:
        scale = w.abs().amax(1) / 63
        q = (w / scale[:, None]).round().clamp(-63, 63).to(torch.int8)
        packed.append((torch.ops.onednn.qlinear_prepack(q, None), scale.float()))
    zeros = torch.zeros(N, dtype=torch.long)

    def run(x: torch.Tensor) -> list[torch.Tensor]:
        codes = (x * 127).round().add(128).clamp(0, 255).to(torch.uint8)
        return [
            torch.ops.onednn.qlinear_pointwise(
                codes, 1 / 127, 128, p, s, zeros, None, 1.0, 0, torch.float32, "none", [], ""
            )
            for p, s in packed
        ]

    return run


def quickdraft_q4(codes: list[superblock.SuperCodes], path: str):
    """quickdraft's 4-bit superblock kernel on one compiled path."""
    layers = [superblock.SuperWeights.build(c, None, path) for c in codes]

    def run(x: torch.Tensor) -> list[torch.Tensor]:
        return [superblock.linear(x, layer) for layer in layers]

    return run


def int4_bf16(weights: list[torch.Tensor]):
    packed = []
    for w in weights:
        grouped = w.view(N, K // GROUP, GROUP)
        low, high = grouped.amin(-1, keepdim=True), grouped.amax(-1, keepdim=True)
        scale = ((high - low) / 15).clamp_min(1e-8)
        q = ((grouped - low) / scale).round().clamp(0, 15).to(torch.int32).view(N, K)
        pairs = torch.stack([scale.squeeze(-1), (low + 8 * scale).squeeze(-1)], -1)
        packed.append(
            (
                torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1),
                pairs.transpose(0, 1).contiguous().bfloat16(),
            )
        )

    def run(x: torch.Tensor) -> list[torch.Tensor]:
        x = x.bfloat16()
        return [torch.ops.aten._weight_int4pack_mm_for_cpu(x, p, GROUP, s) for p, s in packed]

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=40, help="distinct weights in the stack")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--rows", default="1,6,16", help="row counts, comma-separated")
    parser.add_argument("--out", type=Path, default=RESULTS / "weight_stream.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")  # quantized tensor constructors warn of future removal
    torch.manual_seed(0)
    weights = [torch.randn(N, K) * 0.02 for _ in range(args.layers)]
    q4_bytes = 4.75 / 8  # codes, 8-bit sub-scales and minimums, two floats per 256
    compiled_paths = [path for path in compiled.runnable_paths() if path != compiled.REFERENCE]
    # Quantized once, for every path.
    codes = [superblock.quantize(w) for w in weights] if compiled_paths else []
    kernels = {
        **{
            f"quickdraft q4 ({path})": (quickdraft_q4(codes, path), q4_bytes)
            for path in compiled_paths
        },
        "quickdraft int8 (fbgemm)": (fbgemm(weights), 1.0),
        "oneDNN int8": (onednn(weights), 1.0),
        "int4, bf16 activations": (int4_bf16(weights), 0.5),
    }
    del weights, codes
    raw = torch.ones(N * K * args.layers // 4)  # the int8 stack's bytes, as float32
    rows = []
    for count in (int(n) for n in args.rows.split(",")):
        x = torch.rand(count, K) * 2 - 1
        times: dict[str, list[float]] = {name: [] for name in kernels}
        for rep in range(args.reps + 1):  # kernels in turn within each rep; rep 0 warms up
            for name, (run, _) in kernels.items():
                start = time.perf_counter()
                run(x)
                if rep:
                    times[name].append(time.perf_counter() - start)
        for name, (_, bytes_per_weight) in kernels.items():
            seconds = statistics.median(times[name])
            gigabytes = N * K * args.layers * bytes_per_weight / 1e9
            rows.append({"kernel": name, "rows": count, "ms": seconds * 1e3,
                         "gb": gigabytes, "gb_s": gigabytes / seconds})  # fmt: skip
            print(rows[-1], flush=True)
    memory = statistics.median(timeit.repeat(raw.sum, number=1, repeat=5))
    invariant = {}
    x = torch.rand(6, K) * 2 - 1
    for name, (run, _) in kernels.items():
        together = run(x)[0]
        alone = torch.cat([run(x[i : i + 1])[0] for i in range(6)])
        invariant[name] = bool(torch.equal(together.float(), alone.float()))
    report = {
        "machine": describe_machine(),
        "threads": args.threads,
        "reps": args.reps,
        "shape": [K, N, args.layers],
        "memory_gb_s": raw.numel() * 4 / memory / 1e9,
        "rows": rows,
        "batch_invariant": invariant,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    text = render(report)
    args.out.with_suffix(".md").write_text(text)
    print(text)


def render(report: dict) -> str:
    k, n, layers = report["shape"]
    lines = [
        "# Streaming quantized weights from memory",
        "",
        f"{report['machine']}; {report['threads']} threads; {layers} distinct {k} -> {n} "
        f"weights; medians of {report['reps']}, kernels interleaved. Memory read rate "
        f"(float32 sum): {report['memory_gb_s']:.1f} GB/s.",
        "",
        "| kernel | rows | ms | x its 1 row | GB read | GB/s | of memory rate | same alone as "
        "in a batch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    one_row = {row["kernel"]: row["ms"] for row in report["rows"] if row["rows"] == 1}
    for row in report["rows"]:
        same = "yes" if report["batch_invariant"][row["kernel"]] else "no"
        ratio = f"{row['ms'] / one_row[row['kernel']]:.2f}" if row["kernel"] in one_row else "-"
        share = row["gb_s"] / report["memory_gb_s"]
        lines.append(
            f"| {row['kernel']} | {row['rows']} | {row['ms']:.1f} | {ratio} | {row['gb']:.2f} | "
            f"{row['gb_s']:.1f} | {share:.0%} | {same} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
