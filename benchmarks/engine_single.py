"""One request at a time: ``generate`` on the serving engine against ``generate`` of an earlier
revision (the static-batch loop), interleaved prompt by prompt on SmolLM2-135M, for plain
decoding and the default EAGLE drafter.

Each revision runs in a worker process of its own (its checkout on ``PYTHONPATH``); the parent
sends one prompt at a time to each in turn, so the two never run at once and both see the same
machine drift. The figure is the median over prompts of new time / old time, per method.

    python benchmarks/engine_single.py --before a3ab728 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent

WORKER = r"""
import json, sys, time, torch
from quickdraft import SamplingParams, SpecConfig, generate
from quickdraft.bench.tasks import TASK_KINDS, load_tasks
from quickdraft.models.loading import load_model
torch.set_num_threads(int(sys.argv[1]))
target, tokenizer = load_model("smollm2-135m")
tasks = load_tasks(TASK_KINDS, None)
items = [item for group in zip(*tasks.values()) for item in group]
sampling = SamplingParams(temperature=0, max_new_tokens=int(sys.argv[2]), ignore_eos=True)
specs = {"ar": SpecConfig(method="ar"), "eagle": SpecConfig(method="eagle")}
print("ready", flush=True)
for line in sys.stdin:
    index, method = line.split()
    prompt = tokenizer.apply_chat(list(items[int(index)].messages))
    start = time.perf_counter()
    out = generate(target, prompt, sampling=sampling, spec=specs[method], tokenizer=tokenizer)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "decode": seconds - out.stats.time_prefill,
                      "tokens": out.token_ids}), flush=True)
"""


def start(tree: Path, threads: int, tokens: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(threads), str(tokens)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tree,
    )  # fmt: skip
    assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
    return worker


def ask(worker: subprocess.Popen, index: int, method: str) -> dict:
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write(f"{index} {method}\n")
    worker.stdin.flush()
    return json.loads(worker.stdout.readline())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="a3ab728", help="the earlier revision")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=14)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=RESULTS / "engine_single.json")
    args = parser.parse_args()
    before = Path("/tmp") / f"quickdraft-{args.before}"
    if not before.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(before), args.before],
                       cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    workers = {"before": start(before, args.threads, args.max_new_tokens),
               "engine": start(ROOT, args.threads, args.max_new_tokens)}  # fmt: skip
    ratios: dict[str, list[float]] = {"ar": [], "eagle": []}
    seconds: dict[str, dict[str, list[float]]] = {w: {"ar": [], "eagle": []} for w in workers}
    order = list(workers)
    for index in range(-1, args.prompts):  # prompt -1: a warm-up of both, not counted
        for method in ratios:
            results = {name: ask(workers[name], max(index, 0), method) for name in order}
            order.reverse()
            if results["before"]["tokens"] != results["engine"]["tokens"]:
                raise SystemExit(f"prompt {index} {method}: the revisions' tokens differ")
            if index >= 0:
                for name in workers:
                    seconds[name][method].append(results[name]["decode"])
                ratios[method].append(results["engine"]["decode"] / results["before"]["decode"])
    for worker in workers.values():
        worker.terminate()
    from quickdraft.bench.machine import describe_machine

    summary = {m: statistics.median(r) for m, r in ratios.items()}
    result = {"machine": describe_machine(), "threads": args.threads, "before": args.before,
              "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
              "median_time_ratio": summary, "decode_seconds": seconds}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"median new/old decode time": summary}))


if __name__ == "__main__":
    main()
