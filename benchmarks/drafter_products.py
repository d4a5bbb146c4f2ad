"""What a drafter's products cost on CPU: its layers and its rows of the target's head, at the
row counts a draft level runs (1, 4, 10), on the int8 kernels (``models.int8``) against the
compiled kernels' 8- and 4-bit codes (``ops.draft_linear``), interleaved, medians. Random
weights shaped like the shipped drafters' products.

    python benchmarks/drafter_products.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from quickdraft import kernels
from quickdraft.bench.machine import describe_machine
from quickdraft.models.ops import LAYOUTS, Linear

SHAPES = {  # name: (out, in)
    "0.5B drafter q/k/v (1792 -> 1152)": (1152, 1792),
    "0.5B drafter gate/up (896 -> 9728)": (9728, 896),
    "0.5B drafter down (4864 -> 896)": (896, 4864),
    "0.5B FR-Spec head rows (38818 x 896)": (38818, 896),
    "1.5B drafter gate/up, MLP 3072 (1536 -> 6144)": (6144, 1536),
    "1.5B draft vocabulary rows (16384 x 1536)": (16384, 1536),
    "SmolLM2 head (49152 x 576)": (49152, 576),
    "SmolLM2 drafter gate/up (576 -> 3072)": (3072, 576),
}
KINDS = ("int8", "8-bit codes", "4-bit codes")


def build(weight: torch.Tensor, kind: str) -> Linear:
    if kind == "int8":
        return Linear(weight.clone(), int8=True)
    linear = Linear(weight.clone(), prepack=False)
    layout = LAYOUTS[0] if weight.shape[1] % 256 == 0 else LAYOUTS[1]
    linear.quantize_q4(bits=int(kind[0]), layout=layout)
    linear.release_dense()
    return linear


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"{describe_machine()}, {args.threads} threads, kernel path {kernels.best_path()}")
    print("| product | rows | " + " | ".join(f"{k} ms" for k in KINDS) + " |")
    print("|---|---|" + "---|" * len(KINDS))
    for name, (rows_out, width) in SHAPES.items():
        weight = torch.randn(rows_out, width) * 0.02
        linears = {kind: build(weight, kind) for kind in KINDS}
        for rows in (1, 4, 10):
            x = torch.randn(rows, width)
            times: dict[str, list[float]] = {kind: [] for kind in KINDS}
            for _ in range(args.repeats):
                for kind in KINDS:
                    start = time.perf_counter()
                    linears[kind](x)
                    times[kind].append(time.perf_counter() - start)
            cells = " | ".join(f"{statistics.median(times[k]) * 1e3:.2f}" for k in KINDS)
            print(f"| {name} | {rows} | {cells} |")


if __name__ == "__main__":
    main()
