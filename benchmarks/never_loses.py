"""Does speculation ever lose to plain decoding? Each method's default configuration against
the same target's plain decoding, run by run, with nothing else in between.

For every prompt of every round: plain, then each method in a rotating order, then plain
again; a method's run is compared with the mean rate of the two plain runs around it (a
shared host's speed drifts over seconds: ``vs_llama_cpp.py``'s rows of a prompt are spread over
half a minute, and its per-prompt ratios of identical work range 0.65-2.0x on this VM). Each
round builds every drafter afresh (what a drafter learns of the host starts over). Reported
per method and task (code, chat, held-out chat): the median ratio of decode rates (new tokens
after the first over the time after the prefill) with a bootstrap 90% interval, tokens a
forward, and whether every output equals plain decoding's. A control row runs plain decoding
as a method is run: its ratio is the harness's own bias.

    QUICKDRAFT_Q4_PATH=avx2 python benchmarks/never_loses.py --target smollm2-135m \\
        --rounds 5 --out benchmarks/results/never_loses/smollm2-135m-avx2.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from quickdraft import SamplingParams, SpecConfig, generate, kernels
from quickdraft.bench.machine import describe_machine
from quickdraft.bench.tasks import TASK_DIR, load_tasks
from quickdraft.drafters.eagle.io import ARTIFACTS as EAGLE_ARTIFACTS
from quickdraft.drafters.registry import build_drafter, make_spec
from quickdraft.models.loading import load_model
from quickdraft.train.sources import code_prompts

RESULTS = Path(__file__).parent / "results" / "never_loses"
CHAT_KINDS = ("translation", "qa", "conversation", "summarization")


def prompts(tokenizer, code: int, chat: int) -> list[tuple[str, list[int]]]:
    """Code completions, the bench's chat items from the 12th on (as ``vs_llama_cpp.py``),
    and as many chat items again from further on (held out: no run before looked at them)."""
    found = [("code", tokenizer.apply_chat(p["prompt"]))
             for p in code_prompts(code, task_dir=TASK_DIR, seed=11)]  # fmt: skip
    tasks = load_tasks(CHAT_KINDS, None)
    items = [item for group in zip(*tasks.values(), strict=False) for item in group]
    items = items[12 * len(CHAT_KINDS) :]
    for kind, part in (("chat", items[:chat]), ("held-out chat", items[chat : 2 * chat])):
        found += [(kind, tokenizer.apply_chat(list(item.messages))) for item in part]
    return found


def number(text: str) -> int | float | str:
    """A command-line value as the number it spells, else as given."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def interval(ratios: list[float], seed: int = 0) -> tuple[float, float]:
    """A bootstrap 90% interval of the median."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return medians[100], medians[1899]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--quant", default="q4")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--code", type=int, default=6)
    parser.add_argument("--chat", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--also", action="append", default=[], metavar="NAME=FIELD=VALUE,...",
        help="a further configuration to compare beside the defaults (an A/B of a setting), "
        "e.g. 'suffix f4=method=suffix,num_speculative_tokens=8,suffix_spec_factor=4'",
    )  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_model(args.target, quant=args.quant)
    specs: dict[str, SpecConfig | None] = {
        # The control: plain decoding run as a method is, the harness's own bias.
        "plain (control)": None,
        "prompt lookup k=5": SpecConfig(method="ngram", num_speculative_tokens=5),
        "suffix k=8": SpecConfig(method="suffix", num_speculative_tokens=8),
    }
    if (EAGLE_ARTIFACTS / args.target).is_dir():
        specs["EAGLE"] = SpecConfig(method="eagle")
        specs["EAGLE, network alone"] = make_spec(method="eagle", eagle_lookup=0)
    for also in args.also:
        name, _, fields = also.partition("=")
        pairs = dict(field.split("=", 1) for field in fields.split(","))
        specs[name] = make_spec(**{key: number(value) for key, value in pairs.items()})
    sampling = SamplingParams(temperature=0, max_new_tokens=args.max_new_tokens,
                              stop_token_ids=tokenizer.eos_token_ids)  # fmt: skip
    work = prompts(tokenizer, args.code, args.chat)

    def run(ids: list[int], spec, drafter) -> tuple[float, float, list[int]]:
        start = time.perf_counter()
        out = generate(target, ids, sampling=sampling, spec=spec, draft=drafter)
        decode = time.perf_counter() - start - out.stats.time_prefill
        rate = (len(out.token_ids) - 1) / decode if len(out.token_ids) > 1 else float("nan")
        return rate, out.stats.mean_accepted_length, list(out.token_ids)

    records = []
    names = list(specs)
    # Untimed: the first call's costs (the verify table's measuring at an engine's start,
    # lazy imports, the allocator's first pages) belong to no row.
    for spec in specs.values():
        drafter = build_drafter(spec, target, None, same_tokenizer=True) if spec else None
        run(work[0][1], spec, drafter)
    for round_ in range(args.rounds):
        drafters = {
            name: build_drafter(spec, target, None, same_tokenizer=True) if spec else None
            for name, spec in specs.items()
        }
        for index, (kind, ids) in enumerate(work):
            before, _, plain_tokens = run(ids, None, None)
            shift = (round_ + index) % len(names)
            order = names[shift:] + names[:shift]
            found = {n: run(ids, specs[n], drafters[n]) for n in order}
            after, _, _ = run(ids, None, None)
            plain = (before + after) / 2
            for name, (rate, per_forward, tokens) in found.items():
                records.append({"round": round_, "prompt": index, "kind": kind, "method": name,
                                "ratio": rate / plain, "tokens_per_forward": per_forward,
                                "same": tokens == plain_tokens})  # fmt: skip
        print(f"round {round_ + 1} of {args.rounds} done", file=sys.stderr)
    lines = [f"{describe_machine()}; {kernels.describe_weights(args.quant)}, {args.target}, "
             f"{args.threads} threads, {args.rounds} rounds, greedy, "
             f"{args.max_new_tokens} new tokens at most", "",
             "| method | task | runs | x plain (median) | 90% interval | tokens a forward | "
             "same as plain |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    summary = []
    for name in names:
        for kind in ("code", "chat", "held-out chat"):
            mine = [r for r in records if r["method"] == name and r["kind"] == kind]
            if not mine:
                continue
            ratios = [r["ratio"] for r in mine if r["ratio"] == r["ratio"]]  # a 1-token reply: NaN
            low, high = interval(ratios)
            row = {"method": name, "task": kind, "runs": len(mine),
                   "median": statistics.median(ratios), "low": low, "high": high,
                   "tokens_per_forward": statistics.mean(r["tokens_per_forward"] for r in mine),
                   "same": all(r["same"] for r in mine)}  # fmt: skip
            summary.append(row)
            lines.append(f"| {name} | {kind} | {row['runs']} | {row['median']:.3f} | "
                         f"{low:.3f}-{high:.3f} | {row['tokens_per_forward']:.2f} | "
                         f"{'100%' if row['same'] else 'NO'} |")  # fmt: skip
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"report": lines, "summary": summary,
                                        "records": records}, indent=1))  # fmt: skip
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
