"""A model's own greedy replies, for training its Medusa heads on what it actually writes.

Heads trained on reference text learn that text's continuations, not the model's: SmolLM2's
heads reached 43% top-1 held out on the shortlist corpus but 11% on SmolLM2's own replies to a
code prompt. Medusa-2's remedy is self-distillation on the model's own output; this writes it.

Prompts: the user turns of the shortlist corpus (every kind in turn), and code-completion
prompts made from functions of the Python standard library that have docstrings ("Complete the
following Python function:" and the signature with its docstring, the form HumanEval uses).
None of them comes from the bench task sets (their code items are HumanEval's).

    python tools/build_medusa_replies.py --model smollm2-135m --code 120 --per-kind 16
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import sysconfig
import time
from pathlib import Path

import torch
from rich.progress import track

from quickdraft import SamplingParams, generate
from quickdraft.models.loading import load_model

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "benchmarks" / "data" / "shortlist_corpus.jsonl"


def code_prompts(count: int, seed: int) -> list[str]:
    """HumanEval-style prompts from standard-library functions and methods with a docstring."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(stdlib.glob("**/*.py")):
        if "test" in path.parts or "idlelib" in path.parts or "site-packages" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node, clean=False)
            if not doc or len(doc) < 40 or not node.body:
                continue
            first = node.body[0]
            header = "\n".join(lines[node.lineno - 1 : first.end_lineno])
            indent = len(header) - len(header.lstrip())
            header = "\n".join(line[indent:] for line in header.splitlines())
            if len(header) < 1500:
                found.append(header)
    random.Random(seed).shuffle(found)
    return [f"Complete the following Python function:\n\n{h}\n" for h in found[:count]]


def corpus_prompts(per_kind: int, seed: int) -> list[tuple[str, str]]:
    by_kind: dict[str, list[str]] = {}
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        user = next(m["content"] for m in record["messages"] if m["role"] == "user")
        by_kind.setdefault(record["kind"], []).append(user)
    rng = random.Random(seed)
    for prompts in by_kind.values():
        rng.shuffle(prompts)
    return [
        (kind, by_kind[kind][i])
        for i in range(per_kind)
        for kind in sorted(by_kind)
        if i < len(by_kind[kind])
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--code", type=int, default=120, help="code-completion prompts")
    parser.add_argument("--per-kind", type=int, default=16, help="corpus prompts per kind")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--batch",
        type=int,
        default=1,
        help="rows per batch: prompts of equal token length run together (generate_batch)",
    )
    parser.add_argument("--skip-code", type=int, default=0, help="code prompts already used")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or ROOT / "benchmarks" / "data" / f"medusa_replies_{args.model}.jsonl"
    model, tokenizer = load_model(args.model)
    if args.batch > 1:
        return batched(args, out)
    code = [("code", prompt) for prompt in code_prompts(args.code, args.seed)]
    others = corpus_prompts(args.per_kind, args.seed)
    # Interleaved, so a run stopped early still covers both.
    chosen = [p for pair in zip(code, others, strict=False) for p in pair]
    chosen += code[len(others) :] + others[len(code) :]
    sampling = SamplingParams(
        temperature=0, max_new_tokens=args.max_new_tokens, stop_token_ids=tokenizer.eos_token_ids
    )
    start, tokens = time.perf_counter(), 0
    with out.open("w", encoding="utf-8", buffering=1) as sink:
        for kind, prompt in track(chosen, description="replies", console=None):
            user = {"role": "user", "content": prompt}
            reply = generate(model, tokenizer.apply_chat([user]), sampling=sampling)
            tokens += len(reply.token_ids)
            messages = [user, {"role": "assistant", "content": tokenizer.decode(reply.token_ids)}]
            record = {"kind": f"{kind}/generated", "messages": messages, "source": args.model}
            sink.write(json.dumps(record) + "\n")
    seconds = time.perf_counter() - start
    print(f"{len(chosen)} replies, {tokens} tokens in {seconds:.0f} s -> {out}", file=sys.stderr)


def batched(args: argparse.Namespace, out: Path) -> None:
    """Code prompts only, grouped by token length: each group of equal-length prompts runs
    as one batch, several times the throughput of single rows on this CPU."""
    from quickdraft import generate_batch

    model, tokenizer = load_model(args.model)
    prompts = code_prompts(args.skip_code + args.code * 20, args.seed)[args.skip_code :]
    # Appending to an earlier run: never answer the same prompt twice.
    done = set()
    if out.exists():
        for line in out.read_text(encoding="utf-8").splitlines():
            done.add(json.loads(line)["messages"][0]["content"])
    prompts = [p for p in prompts if p not in done]
    by_length: dict[int, list[tuple[str, list[int]]]] = {}
    for prompt in prompts:
        ids = tokenizer.apply_chat([{"role": "user", "content": prompt}])
        by_length.setdefault(len(ids), []).append((prompt, ids))
    groups = [
        g[i : i + args.batch] for g in by_length.values() for i in range(0, len(g), args.batch)
    ]
    groups = [g for g in groups if len(g) == args.batch]  # full batches only
    random.Random(args.seed).shuffle(groups)
    groups = groups[: max(1, args.code // args.batch)]
    sampling = SamplingParams(
        temperature=0, max_new_tokens=args.max_new_tokens, stop_token_ids=tokenizer.eos_token_ids
    )
    start, tokens = time.perf_counter(), 0
    with out.open("a", encoding="utf-8", buffering=1) as sink:
        for group in track(groups, description="batches", console=None):
            rows = torch.tensor([ids for _, ids in group])
            result = generate_batch(model, rows, sampling=sampling)
            for (prompt, _), reply in zip(group, result.token_ids, strict=True):
                tokens += len(reply)
                user = {"role": "user", "content": prompt}
                messages = [user, {"role": "assistant", "content": tokenizer.decode(reply)}]
                record = {"kind": "code/generated", "messages": messages, "source": args.model}
                sink.write(json.dumps(record) + "\n")
    seconds = time.perf_counter() - start
    print(f"{len(groups)} batches, {tokens} tokens in {seconds:.0f} s -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
