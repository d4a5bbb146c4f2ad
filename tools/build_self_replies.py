"""Replies of a model to the shortlist corpus's prompts: text in the model's own style.

A frequency list counted on reference answers misses the tokens a model actually writes (Qwen
writes LaTeX for arithmetic, GSM8K answers do not), so the shortlist artifacts also count the
drafter's own greedy replies to prompts of the corpus (none of them from the bench task sets).
Each record keeps the corpus record's kind with a "/generated" suffix, so the frequency list
weighs the model's style and the reference text equally.

    python tools/build_self_replies.py --model qwen2.5-coder-0.5b --per-kind 50
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
from rich.progress import track

from quickdraft import SamplingParams, generate
from quickdraft.models.loading import load_model

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "benchmarks" / "data" / "shortlist_corpus.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--int8", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--per-kind", type=int, default=50)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or ROOT / "benchmarks" / "data" / f"shortlist_replies_{args.model}.jsonl"
    model, tokenizer = load_model(args.model, int8=args.int8)
    by_kind: dict[str, list[tuple[int, dict]]] = {}
    for number, line in enumerate(args.corpus.read_text(encoding="utf-8").splitlines(), 1):
        record = json.loads(line)
        by_kind.setdefault(record["kind"], []).append((number, record))
    rng = random.Random(args.seed)
    for records in by_kind.values():
        rng.shuffle(records)
    # Kinds in turn, so a run stopped early still covers every kind.
    chosen = [
        by_kind[kind][i]
        for i in range(args.per_kind)
        for kind in sorted(by_kind)
        if i < len(by_kind[kind])
    ]
    sampling = SamplingParams(
        temperature=0, max_new_tokens=args.max_new_tokens, stop_token_ids=tokenizer.eos_token_ids
    )
    start, tokens = time.perf_counter(), 0
    with out.open("w", encoding="utf-8", buffering=1) as sink:
        for number, record in track(chosen, description="replies", console=None):
            user = next(m for m in record["messages"] if m["role"] == "user")
            reply = generate(model, tokenizer.apply_chat([user]), sampling=sampling)
            tokens += len(reply.token_ids)
            text = tokenizer.decode(reply.token_ids)
            messages = [user, {"role": "assistant", "content": text}]
            source = f"{args.model} greedy reply to {args.corpus.name} line {number}"
            kind = f"{record['kind']}/generated"
            sink.write(json.dumps({"kind": kind, "messages": messages, "source": source}) + "\n")
    seconds = time.perf_counter() - start
    print(f"{len(chosen)} replies, {tokens} tokens in {seconds:.0f} s -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
