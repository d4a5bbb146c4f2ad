"""The drafter's own weights, int8 kernels against the compiled kernels' 4-bit codes
(``ops.DRAFT_BITS``), end to end: EAGLE on a q4 target, greedy, 2 threads, prompts nothing was
tuned on (code: standard-library functions past those the training replies used; chat: the
bench's items from the 12th on), the rows interleaved prompt by prompt. Per row: decode
tokens/s, tokens per target forward, draft time per forward, and whether every output equals
plain decoding.

    python benchmarks/drafter_bits.py --target smollm2-135m --prompts 8
"""

from __future__ import annotations

import argparse
import statistics

import torch
from vs_llama_cpp import chat_prompts

from quickdraft import SamplingParams, SpecConfig, generate
from quickdraft.bench.machine import describe_machine
from quickdraft.bench.tasks import TASK_DIR
from quickdraft.drafters.registry import build_drafter, make_spec
from quickdraft.models import ops
from quickdraft.models.loading import load_model
from quickdraft.train.sources import code_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--quant", default="q4")
    parser.add_argument("--prompts", type=int, default=8, help="of each kind")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lookup", type=int, default=None, help="eagle_lookup (default: its own)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_model(args.target, quant=args.quant)
    code = code_prompts(args.prompts, task_dir=TASK_DIR, seed=11)
    prompts = [("code", tokenizer.apply_chat([{"role": "user", "content": r["prompt"]}]))
               for r in code] + chat_prompts(tokenizer, args.prompts)  # fmt: skip
    sampling = SamplingParams(
        temperature=0, max_new_tokens=args.max_new_tokens, stop_token_ids=tokenizer.eos_token_ids
    )
    spec = make_spec(method="eagle", eagle_lookup=args.lookup)
    rows: dict[str, tuple[SpecConfig | None, object]] = {"plain": (None, None)}
    for name, bits in (("EAGLE, int8 drafter", None), ("EAGLE, 4-bit drafter", 4)):
        ops.DRAFT_BITS = bits
        rows[name] = (spec, build_drafter(spec, target, None, same_tokenizer=True))
    ops.DRAFT_BITS = 4
    results: dict[str, list[dict]] = {name: [] for name in rows}
    generate(target, prompts[0][1], sampling=sampling)  # warm up
    for i, (kind, ids) in enumerate(prompts):
        names = list(rows)
        for name in names[i % len(names) :] + names[: i % len(names)]:
            spec_i, drafter = rows[name]
            out = generate(target, ids, sampling=sampling, spec=spec_i, draft=drafter)
            stats = out.stats
            results[name].append({
                "kind": kind, "tokens": out.token_ids, "rate": stats.decode_tokens_per_second,
                "per_forward": stats.new_tokens / max(1, stats.target_forwards),
                "draft_ms": 1e3 * stats.time_draft / max(1, stats.target_forwards),
            })  # fmt: skip
    print(f"{describe_machine()}, {args.threads} threads; {args.target} {args.quant}, "
          f"{len(prompts)} prompts, {args.max_new_tokens} tokens")  # fmt: skip
    header = ("row", "kind", "decode tokens/s", "x plain", "tokens a forward", "draft ms", "=")
    print("| " + " | ".join(header) + " |")
    print("|---|---|---|---|---|---|---|")
    for kind in ("code", "chat", "all"):
        plain = [r for r in results["plain"] if kind in ("all", r["kind"])]
        base = statistics.median(r["rate"] for r in plain)
        for name, got in results.items():
            mine = [r for r in got if kind in ("all", r["kind"])]
            rate = statistics.median(r["rate"] for r in mine)
            same = sum(a["tokens"] == b["tokens"] for a, b in zip(mine, plain, strict=True))
            per_forward = statistics.mean(r["per_forward"] for r in mine)
            draft_ms = statistics.mean(r["draft_ms"] for r in mine)
            print(f"| {name} | {kind} | {rate:.1f} | {rate / base:.2f} | {per_forward:.2f} | "
                  f"{draft_ms:.2f} | {same}/{len(mine)} |")  # fmt: skip


if __name__ == "__main__":
    main()
