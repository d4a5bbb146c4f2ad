"""The serving engine under load: aggregate tokens/s for 1, 2, 4 and 8 concurrent requests,
plain decoding against EAGLE speculation (with and without the batch policy), in one
interleaved run on SmolLM2-135M with its shipped EAGLE drafter.

Each round serves ``--requests`` prompts of mixed lengths (chat-formatted items of the seven
task sets) through an engine of ``concurrency`` rows: requests wait for a row, join as others
finish, and leave when done, so the batch is as full as the load allows. Greedy decoding: every
request's tokens are checked against plain decoding's. Rounds rotate the mode order; the table
gives medians over ``--repeats`` rounds, end to end and for decoding alone (the steps' time
outside prefill, which speculation does not change).

    python benchmarks/engine_batch.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from quickdraft import Engine, SamplingParams, SpecConfig
from quickdraft.bench.machine import describe_machine
from quickdraft.bench.tasks import TASK_KINDS, load_tasks
from quickdraft.drafters.registry import build_drafter
from quickdraft.models.loading import load_model

RESULTS = Path(__file__).parent / "results"
TARGET = "smollm2-135m"


def prompts(tokenizer, count: int) -> list[list[int]]:
    """``count`` chat prompts, taking the task kinds in turn (their lengths differ: short
    questions, long RAG passages)."""
    tasks = load_tasks(TASK_KINDS, None)
    items = [item for group in zip(*tasks.values(), strict=False) for item in group]
    return [tokenizer.apply_chat(list(item.messages)) for item in items[:count]]


def serve(engine: Engine, rows: list[list[int]], sampling: SamplingParams) -> tuple[float, dict]:
    """All rows through the engine at once (it admits as many as it has rows); seconds, each
    request's tokens, and the seconds the steps spent outside prefill (``decode``)."""
    start = time.perf_counter()
    ids = [engine.add_request(row, sampling) for row in rows]
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    seconds = time.perf_counter() - start
    decode = engine.stats.time_total - engine.stats.time_prefill
    return seconds, {"tokens": [done[i] for i in ids], "decode": decode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="ar,eagle,eagle+policy", help="ar always runs")
    parser.add_argument("--out", type=Path, default=RESULTS / "engine_batch.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_model(TARGET)
    rows = prompts(tokenizer, args.requests)
    sampling = SamplingParams(temperature=0, max_new_tokens=args.max_new_tokens, ignore_eos=True)
    spec = SpecConfig(method="eagle")
    modes = {  # (drafter, the engine's batch policy)
        "ar": (None, {}),
        "eagle": (build_drafter(spec, target), {"disable_by_batch_size": None}),
        "eagle+policy": (build_drafter(spec, target), {}),
    }
    chosen = {"ar", *args.modes.split(",")}
    modes = {name: mode for name, mode in modes.items() if name in chosen}
    levels = [int(c) for c in args.concurrency.split(",")]
    seconds: dict[str, dict[int, list[float]]] = {m: {c: [] for c in levels} for m in modes}
    decode: dict[str, dict[int, list[float]]] = {m: {c: [] for c in levels} for m in modes}
    warm = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)
    max_len = max(len(row) for row in rows) + args.max_new_tokens
    for drafter, policy in modes.values():  # warm-up: every path once, not counted
        serve(Engine(target, drafter, **policy, tokenizer=tokenizer, max_batch=2), rows[:3], warm)
    new_tokens: dict[int, int] = {}
    outputs: dict[tuple[str, int], list[list[int]]] = {}
    order = list(modes)
    for repeat in range(args.repeats):
        for concurrency in levels:
            for mode in order:
                drafter, policy = modes[mode]
                engine = Engine(
                    target, drafter, **policy, tokenizer=tokenizer, max_batch=concurrency,
                    max_model_len=max_len,
                )  # fmt: skip
                took, out = serve(engine, rows, sampling)
                outputs[mode, concurrency] = out["tokens"]
                new_tokens[concurrency] = sum(len(t) for t in out["tokens"])
                seconds[mode][concurrency].append(took)
                decode[mode][concurrency].append(out["decode"])
                print(f"round {repeat} c={concurrency} {mode}: {took:.2f}s", flush=True)
            order = order[1:] + order[:1]
    for (mode, concurrency), tokens in outputs.items():
        if tokens != outputs["ar", concurrency]:
            raise SystemExit(f"{mode} at concurrency {concurrency} differs from plain decoding")
    table = []
    for concurrency in levels:
        count = new_tokens[concurrency]
        rates = {m: count / statistics.median(seconds[m][concurrency]) for m in modes}
        decoding = {m: count / statistics.median(decode[m][concurrency]) for m in modes}
        table.append(
            {
                "concurrency": concurrency,
                "tokens_per_second": rates,
                "speedup": {m: rates[m] / rates["ar"] for m in modes if m != "ar"},
                "decode_tokens_per_second": decoding,
                "decode_speedup": {m: decoding[m] / decoding["ar"] for m in modes if m != "ar"},
                "seconds": {m: seconds[m][concurrency] for m in modes},
                "decode_seconds": {m: decode[m][concurrency] for m in modes},
            }
        )
    result = {
        "machine": describe_machine(),
        "threads": args.threads,
        "target": TARGET,
        "requests": args.requests,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "disable_by_batch_size": spec.disable_by_batch_size,
        "table": table,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "| concurrent requests | AR tokens/s | EAGLE tokens/s | EAGLE + policy tokens/s | "
        "EAGLE / AR | EAGLE + policy / AR | decode only: EAGLE / AR | EAGLE + policy / AR |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in table:
        rate, speed, dec = row["tokens_per_second"], row["speedup"], row["decode_speedup"]

        def show(values: dict, mode: str, form: str) -> str:
            return form.format(values[mode]) if mode in values else "-"

        lines.append(
            f"| {row['concurrency']} | {rate['ar']:.1f} | {show(rate, 'eagle', '{:.1f}')} | "
            f"{show(rate, 'eagle+policy', '{:.1f}')} | {show(speed, 'eagle', '{:.2f}x')} | "
            f"{show(speed, 'eagle+policy', '{:.2f}x')} | {show(dec, 'eagle', '{:.2f}x')} | "
            f"{show(dec, 'eagle+policy', '{:.2f}x')} |"
        )
    text = "\n".join(lines)
    args.out.with_suffix(".md").write_text(
        f"# engine_batch\n\n{describe_machine()}, {args.threads} threads; {TARGET}, "
        f"{args.requests} requests of {args.max_new_tokens} tokens, greedy, median of "
        f"{args.repeats} rounds; batch policy disable_by_batch_size="
        f"{spec.disable_by_batch_size}.\n\n{text}\n"
    )
    print(text)


if __name__ == "__main__":
    main()
