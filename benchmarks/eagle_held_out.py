"""An EAGLE drafter's acceptance on prompts no training or tuning touched: tokens per target
forward (the bonus token included) with the network alone (``eagle_lookup=0``) and with its
default prompt-lookup graft, per task kind, beside plain decoding's rate; greedy, every
output checked against plain decoding.

Prompts, ``--per-kind`` of each of the bench's seven kinds: code, summarization and passage
questions from the standard library and man pages (``data code-prompts``/``doc-prompts``)
that no training reply file in ``benchmarks/data`` answers (checked by text); translation,
conversation, math and QA from the bench's task sets from their 12th item on (the items
calibrations and the picker use come before it). Rows run interleaved prompt by prompt.

    python benchmarks/eagle_held_out.py --target qwen2.5-coder-1.5b --quant q4 \\
        --eagle-dir build/eagle/qwen2.5-coder-1.5b-v1 --per-kind 3 --out results/DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from dynaspec_eagle import answered_turns
from vs_llama_cpp import FIRST_CHAT_ITEM

from quickdraft import SamplingParams, generate
from quickdraft.bench.machine import describe_machine
from quickdraft.bench.tasks import TASK_DIR, TASK_KINDS, load_tasks
from quickdraft.drafters.registry import build_drafter, make_spec
from quickdraft.models.loading import load_model
from quickdraft.train.sources import code_prompts, document_prompts

GENERATED = {"code", "summarization", "rag"}
ROWS = ("network alone", "with the graft")  # beside plain decoding


# Per kind, the first EVALUATED prompts are this script's and the ones after them
# calibrations' (the tree sweep's): of the generated prompts no training reply answers, in
# order (data generation leaves out the first 16: benchmarks/data/README.md), and of the task
# sets' items from FIRST_CHAT_ITEM on (items before it are the bench's own).
EVALUATED = 8


def held_out(per_kind: int, calibration: bool = False) -> dict[str, list[list[dict]]]:
    """Per kind, ``per_kind`` chats (their turns before the reply). ``calibration``: the
    prompts tuning may use instead, none of them evaluated here nor the bench's own."""
    if not calibration and per_kind > EVALUATED:
        raise SystemExit(f"--per-kind: at most {EVALUATED} (the rest are calibration prompts)")
    answered = answered_turns()
    made = code_prompts(100_000, task_dir=TASK_DIR) + document_prompts(100_000, task_dir=TASK_DIR)
    unanswered: dict[str, list[list[dict]]] = {kind: [] for kind in TASK_KINDS}
    for record in made:
        if record["prompt"] not in answered:
            unanswered[record["kind"]].append([{"role": "user", "content": record["prompt"]}])
    skip = EVALUATED if calibration else 0
    chosen = {kind: chats[skip : skip + per_kind] for kind, chats in unanswered.items()}
    bench = load_tasks(tuple(k for k in TASK_KINDS if k not in GENERATED))
    for kind, items in bench.items():
        mine = items[FIRST_CHAT_ITEM + skip :][:per_kind]
        chosen[kind] = [list(item.messages) for item in mine]
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--quant", default="q4")
    parser.add_argument("--eagle-dir", default=None, help="default: the shipped drafter")
    parser.add_argument("--per-kind", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="folder for report.md, results.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_model(args.target, quant=args.quant)
    sampling = SamplingParams(
        temperature=0, max_new_tokens=args.max_new_tokens, stop_token_ids=tokenizer.eos_token_ids
    )
    rows = {"plain": None}
    for name, lookup in zip(ROWS, (0, None), strict=True):
        spec = make_spec(method="eagle", eagle_dir=args.eagle_dir, eagle_lookup=lookup)
        rows[name] = (spec, build_drafter(spec, target, None, same_tokenizer=True))
    prompts = [(kind, chat) for kind, chats in held_out(args.per_kind).items() for chat in chats]
    results: dict[str, list[dict]] = {name: [] for name in rows}
    for i, (kind, chat) in enumerate(prompts):
        ids = tokenizer.apply_chat(chat)
        names = list(rows)
        for name in names[i % len(names) :] + names[: i % len(names)]:
            spec, drafter = rows[name] or (None, None)
            out = generate(target, ids, sampling=sampling, spec=spec, draft=drafter)
            stats = out.stats
            results[name].append({
                "kind": kind, "tokens": out.token_ids,
                "per_forward": stats.new_tokens / max(1, stats.target_forwards),
                "rate": stats.decode_tokens_per_second,
            })  # fmt: skip
    meta = {"target": args.target, "quant": args.quant, "eagle_dir": args.eagle_dir,
            "machine": describe_machine(), "threads": args.threads,
            "per_kind": args.per_kind, "max_new_tokens": args.max_new_tokens}  # fmt: skip
    result = {"meta": meta, "summary": summarize(results)}
    report = render(result)
    print(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.md").write_text(report)
        (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")


def summarize(results: dict[str, list[dict]]) -> dict[str, dict]:
    """Per kind and over all: plain's median rate; per row, mean tokens a forward, median
    rate, and how many of its outputs equal plain decoding's."""
    summary = {}
    for kind in (*TASK_KINDS, "all"):

        def pick(name: str, kind: str = kind) -> list[dict]:
            return [r for r in results[name] if kind in ("all", r["kind"])]

        if not pick("plain"):
            continue
        row: dict = {"plain_rate": statistics.median(r["rate"] for r in pick("plain"))}
        for name in ROWS:
            pairs = list(zip(pick(name), pick("plain"), strict=True))
            row[name] = {
                "per_forward": statistics.mean(r["per_forward"] for r in pick(name)),
                "rate": statistics.median(r["rate"] for r in pick(name)),
                "identical": sum(a["tokens"] == b["tokens"] for a, b in pairs),
                "runs": len(pairs),
            }
        summary[kind] = row
    return summary


def render(result: dict) -> str:
    """The report, from what ``results.json`` holds."""
    meta = result["meta"]
    lines = [
        f"# EAGLE on held-out prompts: {meta['target']} ({meta['quant']}), drafter "
        f"{meta['eagle_dir'] or 'shipped'}",
        "",
        f"{meta['machine']}, {meta['threads']} threads; {meta['per_kind']} prompts a kind, "
        f"{meta['max_new_tokens']} new tokens, greedy. Tokens per target forward (bonus "
        "included), means over prompts; decode tokens/s, medians; = plain: outputs equal to "
        "plain decoding.",
        "",
        "| kind | plain tokens/s | network alone: tokens a forward | tokens/s | with the graft: "
        "tokens a forward | tokens/s | = plain |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, row in result["summary"].items():
        alone, graft = (row[name] for name in ROWS)
        same = sum(row[name]["identical"] for name in ROWS)
        runs = sum(row[name]["runs"] for name in ROWS)
        lines.append(
            f"| {kind} | {row['plain_rate']:.1f} | {alone['per_forward']:.2f} | "
            f"{alone['rate']:.1f} | {graft['per_forward']:.2f} | {graft['rate']:.1f} | "
            f"{same}/{runs} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
