"""A quantized target's step and verify cost against its float self: the load check (top-1
agreement and relative logit error on the fixed probe), then a one-token step and 4-, 8- and
16-token verify passes after a 200-token prefix, each weight format in turn within every
repeat, medians printed.

    python benchmarks/quant_targets.py smollm2-135m --quants float,int8,q4 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from quickdraft import kernels
from quickdraft.bench.machine import describe_machine
from quickdraft.models.loading import load_model

PREFIX = 200
SIZES = (1, 4, 8, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="smollm2-135m")
    parser.add_argument("--quants", default="float,int8,q4", help="float, int8, q4")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {}
    for quant in args.quants.split(","):
        start = time.perf_counter()
        model, tokenizer = load_model(args.model, quant=None if quant == "float" else quant)
        check = model.quant_check.describe() if model.quant_check else "-"
        print(f"{quant}: loaded in {time.perf_counter() - start:.1f} s; {check}", flush=True)
        models[quant] = model
    prompt = torch.tensor([tokenizer.encode("def fibonacci(n):\n    " * 60)])[:, :PREFIX]
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for quant, model in models.items():
            for size in SIZES:
                cache = model.new_cache(1, PREFIX + max(SIZES))
                model.forward(prompt, torch.arange(PREFIX).unsqueeze(0), cache)
                cache.lengths += PREFIX
                tokens = torch.randint(0, 1000, (1, size))
                positions = (PREFIX + torch.arange(size)).unsqueeze(0)
                start = time.perf_counter()
                model.forward(tokens, positions, cache)
                times.setdefault((quant, size), []).append(time.perf_counter() - start)
    print(f"{args.model}; {describe_machine()}; {args.threads} threads; medians of {args.repeats}")
    for quant in models:
        one = statistics.median(times[quant, 1])
        cells = [
            f"{size} tokens {1000 * statistics.median(times[quant, size]):.1f} ms "
            f"({statistics.median(times[quant, size]) / one:.2f} steps)"
            for size in SIZES
        ]
        weights = kernels.describe_weights(None if quant == "float" else quant)
        print(f"{weights}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
