"""What suffix decoding's drafting costs beside the target's step: the drafter's host work a
step (the tries' match and tree, and taking in the kept tokens) against the target's verify
pass, on SmolLM2-135M (q4 by default), greedy, one request at a time; a second pass over the
same prompts drafts from the first pass's outputs too (the shared trie).

    python benchmarks/suffix_cost.py --quant q4 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from quickdraft import SamplingParams, generate
from quickdraft.bench.machine import describe_machine
from quickdraft.bench.tasks import TASK_DIR
from quickdraft.drafters.suffix.drafter import SuffixDrafter
from quickdraft.models.loading import load_model
from quickdraft.train.sources import code_prompts


class Timed(SuffixDrafter):
    """The drafter, timing its own work: propose, begin and observe."""

    seconds = 0.0

    def _time(self, name: str, *args):
        start = time.perf_counter()
        result = getattr(super(), name)(*args)
        Timed.seconds += time.perf_counter() - start
        return result

    def propose(self, batch):
        return self._time("propose", batch)

    def begin(self, start):
        return self._time("begin", start)

    def observe(self, result):
        return self._time("observe", result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="smollm2-135m")
    parser.add_argument("--quant", default="q4", help="float, int8 or q4")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, quant=None if args.quant == "float" else args.quant)
    prompts = [
        tokenizer.apply_chat([{"role": "user", "content": r["prompt"]}])
        for r in code_prompts(args.prompts, task_dir=TASK_DIR, seed=11)
    ]
    sampling = SamplingParams(temperature=0, max_new_tokens=args.max_new_tokens)
    drafter = Timed(model.vocab_size, 8)
    print(f"{args.model} ({args.quant}); {describe_machine()}; {args.threads} threads")
    for round_ in ("first pass", "second pass (shared trie holds the first's outputs)"):
        shares, steps, drafting, verify, tokens = [], 0, 0.0, 0.0, 0
        for prompt in prompts:
            Timed.seconds = 0.0
            out = generate(model, prompt, sampling=sampling, draft=drafter)
            stats = out.stats
            step = stats.time_verify / stats.target_forwards
            shares.append(Timed.seconds / stats.target_forwards / step)
            steps += stats.target_forwards
            drafting += Timed.seconds
            verify += stats.time_verify
            tokens += stats.new_tokens
        print(
            f"{round_}: {tokens / steps:.2f} tokens a target step; drafter "
            f"{1000 * drafting / steps:.2f} ms a step, verify {1000 * verify / steps:.1f} ms a "
            f"step; drafter / verify median {100 * statistics.median(shares):.1f}% "
            f"(max {100 * max(shares):.1f}%)"
        )


if __name__ == "__main__":
    main()
