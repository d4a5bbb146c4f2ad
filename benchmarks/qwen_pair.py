"""Qwen2.5-Coder 1.5B target with the 0.5B as draft: quickdraft against transformers.

Methods, interleaved prompt by prompt (the machine's speed drifts; every method sees the same
conditions), greedy, the same new-token budget:

  quickdraft autoregressive, draft_model at k = 3 and 5 (int8 draft weights), n-gram
  (prompt lookup, k = 5);
  transformers generate: autoregressive, with assistant_model (k = 4, constant schedule), and
  with prompt_lookup_num_tokens = 5.

Per method: median tokens/s, median speedup over transformers autoregressive (per prompt, then
the median), whether every output equals quickdraft's autoregressive output, and the mean
accepted length. Also the native runner's 5-token / 1-token forward cost on the target.

    python benchmarks/qwen_pair.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from quickdraft import Method, SamplingParams, SpecConfig, generate
from quickdraft.bench.machine import describe_machine
from quickdraft.models.loading import load_model
from quickdraft.models.sources import resolve
from quickdraft.pick.calibrate import forward_costs

RESULTS = Path(__file__).parent / "results"

PROMPTS = [
    (
        "code",
        "Write a Python function `merge_intervals(intervals)` that merges overlapping "
        "intervals and returns them sorted. Include a docstring.",
    ),
    (
        "code",
        "Implement a class `LRUCache` in Python with `get(key)` and `put(key, value)` "
        "methods, both O(1), using collections.OrderedDict.",
    ),
    (
        "code",
        "Write a Python function that parses a CSV file with the csv module and returns "
        "the average of the column named 'price', skipping rows where it is missing.",
    ),
    (
        "code",
        'Complete this function:\n\ndef binary_search(items, target):\n    """Return the '
        'index of target in the sorted list items, or -1."""\n',
    ),
    (
        "math",
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
        "clips in May. How many clips did Natalia sell altogether in April and May? "
        "Reason step by step.",
    ),
    (
        "math",
        "A train travels 120 km in 1.5 hours, then 80 km in 1 hour. What is its average "
        "speed for the whole trip? Show the calculation.",
    ),
]


STOP: tuple[int, ...] = ()  # the target's end-of-sequence ids, set in main()


def _qd(target, prompt, tokens, spec, draft=None):
    sampling = SamplingParams(temperature=0, max_new_tokens=tokens, stop_token_ids=STOP)
    out = generate(target, prompt, sampling=sampling, spec=spec, draft=draft)
    return out.token_ids, out.stats.mean_accepted_length


def _hf(model, prompt, tokens, **kwargs):
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            do_sample=False,
            eos_token_id=list(STOP),
            **kwargs,
        )
    return out[0, len(prompt) :].tolist(), float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--out", type=Path, default=RESULTS / "qwen_pair.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    global STOP
    target, tokenizer = load_model("qwen2.5-coder-1.5b")
    STOP = tokenizer.eos_token_ids
    # quickdraft's draft runs with int8 weights (its default for drafts on CPU): the draft's
    # numerics never change the output, only how often it is accepted. transformers' assistant
    # keeps its float32 default.
    draft, _ = load_model("qwen2.5-coder-0.5b", int8=True)
    hf_target = AutoModelForCausalLM.from_pretrained(
        str(resolve("qwen2.5-coder-1.5b")), dtype=torch.float32
    ).eval()
    hf_draft = AutoModelForCausalLM.from_pretrained(
        str(resolve("qwen2.5-coder-0.5b")), dtype=torch.float32
    ).eval()
    tokens = args.max_new_tokens
    methods = {
        "quickdraft ar": lambda p: _qd(target, p, tokens, SpecConfig(method=Method.AR)),
        "quickdraft draft_model k=3": lambda p: _qd(
            target, p, tokens, SpecConfig(num_speculative_tokens=3), draft
        ),
        "quickdraft draft_model k=5": lambda p: _qd(
            target, p, tokens, SpecConfig(num_speculative_tokens=5), draft
        ),
        "quickdraft ngram k=5": lambda p: _qd(
            target, p, tokens, SpecConfig(method=Method.NGRAM, num_speculative_tokens=5)
        ),
        "transformers ar": lambda p: _hf(hf_target, p, tokens),
        "transformers assisted k=4": lambda p: _hf(
            hf_target,
            p,
            tokens,
            assistant_model=hf_draft,
            num_assistant_tokens=4,
            num_assistant_tokens_schedule="constant",
        ),
        "transformers prompt lookup 5": lambda p: _hf(
            hf_target, p, tokens, prompt_lookup_num_tokens=5
        ),
    }
    # Warm-up: one short run of each, so no method pays first-call costs in the timings.
    warm = tokenizer.apply_chat("Say hi.")
    for run in methods.values():
        run(warm)

    records = []
    names = list(methods)
    for index, (kind, text) in enumerate(PROMPTS[: args.prompts]):
        prompt = tokenizer.apply_chat(text)
        order = names[index % len(names) :] + names[: index % len(names)]  # rotate the order
        for name in order:
            start = time.perf_counter()
            ids, accepted = methods[name](prompt)
            seconds = time.perf_counter() - start
            records.append(
                {
                    "prompt": index,
                    "kind": kind,
                    "method": name,
                    "tokens": len(ids),
                    "seconds": seconds,
                    "tokens_per_s": len(ids) / seconds,
                    "mean_accepted_length": accepted,
                    "token_ids": ids,
                }
            )
            print(f"prompt {index} ({kind}) {name}: {len(ids) / seconds:.2f} tok/s", flush=True)

    costs = {t: 1000.0 * sec for t, sec in forward_costs(target, 200, [1, 2, 5, 9], 10).items()}
    summary = summarise(records, names)
    report = {
        "target": "qwen2.5-coder-1.5b",
        "draft": "qwen2.5-coder-0.5b",
        "threads": args.threads,
        "max_new_tokens": tokens,
        "greedy": True,
        "machine": f"{describe_machine()}, {args.threads} threads",
        "native_target_forward_ms": costs,
        "five_to_one_token_cost": costs[5] / costs[1],
        "summary": summary,
        "runs": records,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


def summarise(records: list[dict], names: list[str]) -> dict[str, dict]:
    reference = {r["prompt"]: r for r in records if r["method"] == "quickdraft ar"}
    baseline = {r["prompt"]: r for r in records if r["method"] == "transformers ar"}
    summary = {}
    for name in names:
        rows = [r for r in records if r["method"] == name]
        for scope in ("code", "all"):
            chosen = [r for r in rows if scope == "all" or r["kind"] == scope]
            if not chosen:
                continue
            accepted = [
                r["mean_accepted_length"]
                for r in chosen
                if r["mean_accepted_length"] == r["mean_accepted_length"]
            ]
            summary.setdefault(name, {})[scope] = {
                "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in chosen),
                "speedup_over_transformers_ar": statistics.median(
                    r["tokens_per_s"] / baseline[r["prompt"]]["tokens_per_s"] for r in chosen
                ),
                "identical_to_ar": all(
                    r["token_ids"] == reference[r["prompt"]]["token_ids"] for r in chosen
                ),
                "mean_accepted_length": statistics.mean(accepted) if accepted else None,
            }
    return summary


def markdown(report: dict) -> str:
    lines = [
        "# Qwen2.5-Coder 1.5B target, 0.5B draft: quickdraft against transformers",
        "",
        f"Greedy, {report['max_new_tokens']} new tokens, prompts interleaved method by method; "
        f"{report['machine']}.",
        "",
        "| method | code tok/s | code speedup | all tok/s | all speedup | identical | "
        "accepted length |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, scopes in report["summary"].items():
        code, every = scopes.get("code", {}), scopes["all"]
        accepted = every["mean_accepted_length"]
        lines.append(
            f"| {name} | {code.get('tokens_per_s_median', float('nan')):.2f} | "
            f"{code.get('speedup_over_transformers_ar', float('nan')):.2f}x | "
            f"{every['tokens_per_s_median']:.2f} | {every['speedup_over_transformers_ar']:.2f}x "
            f"| {'yes' if every['identical_to_ar'] else 'no'} | "
            f"{'' if accepted is None else f'{accepted:.2f}'} |"
        )
    costs = report["native_target_forward_ms"]
    lines += [
        "",
        "Native runner, target forward after 200 tokens (median ms): "
        + ", ".join(f"T={t}: {ms:.0f}" for t, ms in costs.items())
        + f"; 5-token / 1-token = {report['five_to_one_token_cost']:.2f}.",
        "",
        "Speedups are medians of per-prompt ratios to transformers autoregressive. "
        "'identical' compares token ids with quickdraft autoregressive decoding.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
