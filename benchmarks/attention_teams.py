"""The compiled attention kernel of two builds, side by side: the time of one layer's attention
for 1, 2, 4 and 8 queries of one cache row (a decode step, then a draft's tokens) over 300 and
600 committed keys, in the shapes of SmolLM2-135M (9 heads, 3 KV heads, dimension 64, 30
layers) and Qwen2.5-Coder-1.5B (12, 2, 128; 28 layers), times the layers. Each build runs in
its own process (both register the same operator), alternating round by round; medians of
each round's medians, and the ratio of the two within each round.

    # the baseline's kernels, built from another revision into a cache of its own
    git worktree add /tmp/base <revision>
    (cd /tmp/base && QUICKDRAFT_CACHE=/tmp/base-cache python -c \\
        "from quickdraft import kernels; kernels.native()")
    python benchmarks/attention_teams.py --path avx2 --threads 1 --rounds 5 \\
        --baseline /tmp/base-cache/kernels/*/quickdraft_kernels.so
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
SHAPES = {"smollm2-135m": (9, 3, 64, 30), "qwen2.5-coder-1.5b": (12, 2, 128, 28)}
KEYS = (300, 600)
QUERIES = (1, 2, 4, 8)


def measure(library: str, path: int, threads: int, repeats: int) -> dict[str, float]:
    """In this process: ms a pass's attention takes with ``library``'s kernel, per case."""
    import torch

    torch.ops.load_library(library)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    found = {}
    for model, (heads, kv_heads, dim, layers) in SHAPES.items():
        keys, values = torch.randn(2, 1, 1024, kv_heads, dim)
        for count in KEYS:
            for queries in QUERIES:
                q = torch.randn(queries, heads, dim)
                rows = torch.zeros(queries, dtype=torch.long)
                slots = torch.arange(count + queries).expand(queries, -1).contiguous()
                counts = torch.arange(count + 1, count + queries + 1)  # a causal chain
                times = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    torch.ops.quickdraft_kernels.attend(
                        q, keys, values, rows, slots, counts, dim**-0.5, path
                    )
                    times.append(time.perf_counter() - start)
                median = statistics.median(times[repeats // 10 :])
                found[f"{model} keys={count} queries={queries}"] = median * layers * 1e3
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the other build's library (.so)")
    parser.add_argument("--library", help="this build's library (default: build it here)")
    parser.add_argument("--path", default="avx2", choices=["avx2", "avx512-vnni"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=400)
    parser.add_argument("--out", type=Path, default=RESULTS / "attention_teams.json")
    # A child process: the library to time and the path's code (it loads no other library).
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        library, code = args.measure
        print(json.dumps(measure(library, int(code), args.threads, args.repeats)))
        return
    from quickdraft import kernels

    if not Path(args.baseline).is_file():
        sys.exit(f"--baseline: no library at {args.baseline}")
    if args.library is None and not kernels.native():
        sys.exit("the kernels could not be built here: pass --library")
    library = args.library or str(kernels.cache_dir() / "quickdraft_kernels.so")
    code = str(kernels.PATHS[args.path])
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "this": []}
    for round_ in range(args.rounds):
        order = [("baseline", args.baseline), ("this", library)]
        for name, lib in order if round_ % 2 == 0 else order[::-1]:
            command = [sys.executable, __file__, "--baseline", args.baseline, "--path", args.path,
                       "--threads", str(args.threads), "--repeats", str(args.repeats),
                       "--measure", lib, code]  # fmt: skip
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            runs[name].append(json.loads(output.splitlines()[-1]))
        print(f"round {round_ + 1} of {args.rounds}", file=sys.stderr)
    from quickdraft.bench.machine import describe_machine

    rows = []
    for case in runs["this"][0]:
        before = [run[case] for run in runs["baseline"]]
        after = [run[case] for run in runs["this"]]
        ratio = statistics.median(a / b for a, b in zip(after, before, strict=True))
        rows.append({"case": case, "baseline_ms": statistics.median(before),
                     "this_ms": statistics.median(after), "ratio": ratio})  # fmt: skip
    machine = describe_machine()
    args.out.write_text(json.dumps({"machine": machine, "path": args.path,
                                    "threads": args.threads, "rounds": args.rounds,
                                    "rows": rows}, indent=1))  # fmt: skip
    print(f"{machine}; {args.path}, {args.threads} thread(s), {args.rounds} rounds\n")
    print("| case | baseline ms | this ms | this / baseline (median of rounds) |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['case']} | {row['baseline_ms']:.3f} | {row['this_ms']:.3f} | "
              f"{row['ratio']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
