"""Does a drafter trained on one target's features draft as well from a quantized target's?

The drafters are trained on features of the target in bfloat16 (the fast way on a CPU with
AMX) and serve the q4 target, whose hidden states differ by its quantization. This scores one
drafter, teacher forced, on the same held-out sequences of its own training split (its
``metrics.json`` says which data, sample and split), once with each ``--quants`` target's
features: per unrolled step, how often its top token is that target's own (the target's own
head decides, so for q4 it is what the q4 target would accept).

    python benchmarks/eagle_feature_quant.py --target qwen2.5-coder-0.5b --sequences 256

Features the store lacks are extracted into the same store training uses (under --cache), so
a later training run on q4 features finds them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from quickdraft.bench.machine import describe_machine
from quickdraft.cli.common import DEFAULT_CACHE
from quickdraft.drafters.eagle.io import eagle_folder, load_eagle
from quickdraft.train.corpus import balanced_sample, read_records, tokenize
from quickdraft.train.eagle import evaluate, head_argmax, load_feature_target, split_held_out
from quickdraft.train.eagle_features import extract, store_folder
from quickdraft.train.eagle_objective import EagleTraining


def target_token(target, quant: str):
    """The target's own token from final hidden states [n, d]: the float head's argmax for a
    float target (as training scores it), the quantized head's for a quantized one."""
    head = target.head_weight.float()[: target.vocab_size]
    if quant in ("bf16", "float"):
        return lambda states: head_argmax(states, head)

    def own(states: torch.Tensor) -> torch.Tensor:
        pieces = states.to(target.dtype).split(1024)
        return torch.cat([target.head(p).float()[:, : target.vocab_size].argmax(-1)
                          for p in pieces])  # fmt: skip

    return own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-0.5b")
    parser.add_argument("--eagle-dir", type=Path, default=None, help="default: the shipped one")
    parser.add_argument("--quants", nargs="+", default=["bf16", "q4"])
    parser.add_argument("--sequences", type=int, default=256, help="of the held-out split")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="unrolled steps to score (default: as trained); past the trained "
        "ones, how the net does deeper in a draft than it learnt",
    )
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="a JSON file of the figures")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = eagle_folder(args.target, args.eagle_dir)
    metrics = json.loads((folder / "metrics.json").read_text())
    made, trained = metrics["features"], metrics["training"]
    trained = {k: v for k, v in trained.items() if k in EagleTraining.__dataclass_fields__}
    settings = EagleTraining(**{**trained, "steps": args.steps or trained["steps"]})
    layers, context = tuple(made["layers"]), made["context"]
    net = load_eagle(folder)  # evaluation leaves it as it was: one load serves every quant
    results = {}
    for quant in args.quants:
        target, tokenizer = load_feature_target(args.target, None if quant == "float" else quant)
        if quant == args.quants[0]:  # the same sample and split as training, once
            records = read_records(made["data"])
            sequences = [tokenize(r, tokenizer, made["max_tokens"]) for r in records]
            sample = balanced_sample(sequences, made["budget_tokens"], made["seed"])
            if len(sample) != made["sequences"]:
                raise SystemExit(f"data: {len(sample)} sequences, training had "
                                 f"{made['sequences']}: its files changed since")  # fmt: skip
            _, held = split_held_out(len(sample), settings.validation_fraction, settings.seed)
            chosen = [sample[i] for i in held[: args.sequences]]
        store = store_folder(args.cache, args.target, context, layers,
                             None if quant == "float" else quant)  # fmt: skip
        started = time.perf_counter()
        features = extract(target, chosen, layers, context, store)
        took = time.perf_counter() - started
        embed = target.embed.float()
        lm_head = target.head_weight.float()[: target.vocab_size]
        scores = evaluate(net, features, list(range(len(chosen))), embed, lm_head, settings,
                          torch.device("cpu"), target_token(target, quant))  # fmt: skip
        results[quant] = {**scores, "extract_seconds": round(took, 1)}
        print(quant, json.dumps(results[quant]), flush=True)
    print(f"\n{describe_machine()}, {args.threads} threads; drafter {folder}; "
          f"{len(chosen)} held-out sequences of its training split, teacher forced\n")  # fmt: skip
    steps = settings.steps
    print("| features from | " + " | ".join(f"step {j + 1} top-1" for j in range(steps))
          + " | expected chain | positions |")  # fmt: skip
    print("|---" * (steps + 3) + "|")
    for quant, r in results.items():
        cells = " | ".join(f"{100 * a:.1f}%" for a in r["agreement_by_step"])
        print(f"| {quant} | {cells} | {r['expected_chain_accepted_length']:.3f} | "
              f"{r['positions']} |")  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps({"drafter": str(folder), "results": results}, indent=2))


if __name__ == "__main__":
    main()
