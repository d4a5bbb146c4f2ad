"""How often a prompt-lookup draft's tokens land, by the match it came from: the table behind
``quickdraft.drafters.ngram``'s scores (``FIRST``, ``SPLIT``, ``LATER``).

The target decodes held-out prompts greedily (code completions of another seed than the
benches', and the first chat items of each kind, which the benches skip); at every position of
its output the drafter's lookup (n-gram sizes 1..3, 5 tokens) is matched against what the target
went on to say. Reported: the first token's rate by n and by whether every earlier occurrence of
the n-gram went on the same way, and each later token's given the one before, by n. And the
same for suffix decoding's drafts (``quickdraft.drafters.suffix.drafter``'s ``MATCHED`` and
``LATER``), from the request's own trie (depth 24, chains of up to 8): the first token's by the
length of the match, each by whether the text went on that way every time (share 1).

    python benchmarks/lookup_odds.py --target smollm2-135m \\
        --out benchmarks/results/lookup_odds.md
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch

from quickdraft import SamplingParams, generate
from quickdraft.bench.tasks import TASK_DIR, load_tasks
from quickdraft.drafters.ngram import TextIndex
from quickdraft.drafters.suffix.trie import SuffixTrie, chain
from quickdraft.models.loading import load_model
from quickdraft.train.sources import code_prompts

CHAT_KINDS = ("translation", "qa", "conversation", "summarization")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--quant", default="q4")
    parser.add_argument("--code", type=int, default=16)
    parser.add_argument("--chat", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    target, tokenizer = load_model(args.target, quant=args.quant)
    work = [("code", tokenizer.apply_chat(p["prompt"]))
            for p in code_prompts(args.code, task_dir=TASK_DIR, seed=23)]  # fmt: skip
    tasks = load_tasks(CHAT_KINDS, None)
    items = [item for group in zip(*tasks.values(), strict=False) for item in group]
    work += [("chat", tokenizer.apply_chat(list(item.messages))) for item in items[: args.chat]]
    sampling = SamplingParams(temperature=0, max_new_tokens=args.max_new_tokens,
                              stop_token_ids=tokenizer.eos_token_ids)  # fmt: skip
    # (task, n, agreed, first?) -> [drafted, landed]
    counts: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    # (task, matched, share 1?, first?) -> [drafted, landed]
    suffix: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])

    def tally(table: dict, key: tuple, kind: str, lands: bool) -> None:
        for task in (kind, "all"):
            cell = table[(task, *key)]
            cell[0] += 1
            cell[1] += lands

    for kind, prompt in work:
        output = list(generate(target, prompt, sampling=sampling).token_ids)
        index = TextIndex(1, 3)
        index.extend(prompt + output[:1])
        trie = SuffixTrie(24)
        cursor = trie.extend(trie.cursor(), prompt + output[:1])
        for t in range(1, len(output)):
            text = prompt + output[:t]
            match = index.lookup(5)
            for depth, token in enumerate(match.tokens):
                lands = t + depth < len(output) and output[t + depth] == token
                tally(counts, (min(match.n, 3), match.agreed, depth == 0), kind, lands)
                if not lands:
                    break
            node, matched = trie.match(text[-24:], 8)
            if node is not None:
                found = chain(node, min(8, matched), 0.1)
                above = 1.0
                for depth, (token, prob) in enumerate(zip(found.tokens, found.probs, strict=True)):
                    lands = t + depth < len(output) and output[t + depth] == token
                    whole = prob / above > 0.999
                    size = min(matched, 6) if depth == 0 else 0
                    tally(suffix, (size, whole, depth == 0), kind, lands)
                    above = prob
                    if not lands:
                        break
            index.extend(output[t : t + 1])
            cursor = trie.extend(cursor, output[t : t + 1])
    lines = [f"{args.target} ({args.quant}), greedy, {args.max_new_tokens} new tokens at most: "
             f"{args.code} code prompts (seed 23), {args.chat} chat items (the first of each "
             "kind); every output position's lookup (n 1..3, 5 tokens)", "",
             "| task | n | earlier occurrences | first token lands | a later one lands, "
             "given the one before |", "|---|---|---|---|---|"]  # fmt: skip
    for task in ("code", "chat", "all"):
        for n in (1, 2, 3):
            for agreed in (True, False):
                first, later = counts[(task, n, agreed, True)], counts[(task, n, agreed, False)]
                rate = [f"{c[1] / c[0]:.2f} of {c[0]}" if c[0] else "-" for c in (first, later)]
                went = "agreed" if agreed else "differed"
                size = f"{n}+" if n == 3 else str(n)
                lines.append(f"| {task} | {size} | {went} | {rate[0]} | {rate[1]} |")
    lines += ["", "Suffix decoding (the request's own trie):", "",
              "| task | match | went on that way | first token lands | a later one lands, "
              "given the one before |", "|---|---|---|---|---|"]  # fmt: skip
    for task in ("code", "chat", "all"):
        for whole in (True, False):
            went = "every time" if whole else "not every time"
            later = suffix[(task, 0, whole, False)]
            for size in range(1, 7):
                first = suffix[(task, size, whole, True)]
                rates = [f"{c[1] / c[0]:.2f} of {c[0]}" if c[0] else "-" for c in (first, later)]
                shown = f"{size}+" if size == 6 else str(size)
                lines.append(f"| {task} | {shown} | {went} | {rates[0]} | "
                             f"{rates[1] if size == 1 else ''} |")  # fmt: skip
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
