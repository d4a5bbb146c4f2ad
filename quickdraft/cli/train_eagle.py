"""`quickdraft train eagle`: an EAGLE draft layer on a frozen target's features."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from quickdraft.cli.common import (
    DEFAULT_CACHE,
    _add_scaling,
    _positive_int,
    _progress_columns,
    _scaling,
    _stages,
    _threads,
    console,
    finite_float,
    strict_int,
)


def _add_train_eagle(kinds: argparse._SubParsersAction) -> None:
    eagle = kinds.add_parser(
        "eagle",
        help="an EAGLE draft layer on a frozen target's features (EAGLE-1, or EAGLE-3 with "
        "fused features and training-time test)",
        description="Writes eagle.json, eagle.safetensors and metrics.json into --out. The "
        "target's features are cached in fp16 under --cache (within --max-cache-gb) and "
        "checkpoints too, so an interrupted run resumes where it stopped. For several processes "
        "(GPUs, or CPU processes with --cpu), run it unchanged under `accelerate launch`: "
        "--batch-size is the global batch, so the result does not change with their number.",
    )
    eagle.add_argument("--target", required=True, help="the target model (native runner)")
    eagle.add_argument(
        "--data", nargs="+", required=True, help="corpus files or folders (.jsonl chats, text)"
    )
    eagle.add_argument("--out", type=Path, required=True)
    eagle.add_argument("--variant", choices=["eagle1", "eagle3"], default="eagle3")
    eagle.add_argument(
        "--steps",
        type=_positive_int,
        default=None,
        help="training-time test steps (default 3 for eagle3, 1 for eagle1; 5 trains the "
        "deeper nodes of the default trees, 6 deep: on the 0.5B one epoch of 5 drafted 2.36 "
        "tokens a forward against 3 steps' 2.29, for 1.4x the training time)",
    )
    eagle.add_argument(
        "--draft-vocab",
        type=_positive_int,
        default=8192,
        help="tokens the draft scores: the most frequent of the training text (default 8192)",
    )
    eagle.add_argument(
        "--budget-tokens",
        type=_positive_int,
        default=150_000,
        help="scored (reply) positions, balanced over kinds of text (default 150000)",
    )
    eagle.add_argument(
        "--score-full-vocab",
        action="store_true",
        help="save the drafter scoring the target's whole head (trained on --draft-vocab "
        "rows): the setting where drafter-head shortlists pay",
    )
    eagle.add_argument(
        "--int8-file",
        action="store_true",
        help="save the layers' matrices in int8 with a scale per row (half the file; what the "
        "CPU drafter runs by default anyway)",
    )
    eagle.add_argument(
        "--intermediate-size",
        type=_positive_int,
        default=None,
        help="the draft layer's MLP width (default: the target's); narrower is a cheaper draft "
        "step and a smaller file",
    )
    eagle.add_argument("--max-tokens", type=_positive_int, default=512)
    eagle.add_argument(
        "--context",
        type=strict_int,
        default=None,
        help="prompt tokens kept before each reply as the draft's context (default: the whole "
        "prompt; a smaller value shrinks the feature cache)",
    )
    eagle.add_argument("--max-cache-gb", type=finite_float, default=8.0)
    eagle.add_argument("--epochs", type=_positive_int, default=3)
    eagle.add_argument("--batch-size", type=_positive_int, default=8, help="sequences")
    eagle.add_argument("--lr", type=finite_float, default=1e-3)
    eagle.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    eagle.add_argument("--threads", type=_threads, default=None)
    eagle.add_argument("--seed", type=strict_int, default=0)
    eagle.add_argument(
        "--init",
        type=Path,
        default=None,
        help="start from the layers of a drafter saved by quickdraft train eagle for the same "
        "target and variant (more epochs, or new data); the draft vocabulary is chosen again",
    )
    eagle.add_argument(
        "--quant",
        choices=["int8", "q4", "bf16"],
        default=None,
        help="extract the features with the target's quantized weights (the target the "
        "drafter will draft for; on the 1.5B, 2-core EPYC: q4 124 tokens/s, float 76) or "
        "with bf16 ones (569 tokens/s on a 2-core Xeon with AMX, against q4's 190; slow on "
        "a CPU without AMX or AVX-512 bf16)",
    )
    _add_scaling(eagle)


def _train_eagle(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from quickdraft.train.eagle import EagleTraining, train_eagle

    steps = args.steps or (3 if args.variant == "eagle3" else 1)
    training = EagleTraining(
        variant=args.variant,
        steps=steps,
        draft_vocab=args.draft_vocab,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        init=None if args.init is None else str(args.init),
        intermediate_size=args.intermediate_size,
    )
    scaling, reporting = _scaling(args)
    with Progress(
        *_progress_columns(), console=console, transient=True, disable=not reporting
    ) as progress:
        advance = _stages(progress)
        metrics = train_eagle(
            args.target, args.data, training, args.out, args.cache, args.budget_tokens,
            args.max_tokens, args.context, args.max_cache_gb, advance, scaling, args.quant,
        )  # fmt: skip
    if not reporting:  # under `accelerate launch`, the first process writes and reports
        return 0
    if args.score_full_vocab or args.int8_file:
        from quickdraft.drafters.eagle.io import load_eagle, save_eagle, with_full_vocabulary

        record = json.loads((args.out / "eagle.json").read_text())
        record.pop("config")
        net = load_eagle(args.out)
        if args.score_full_vocab:
            record["score_full_vocab"] = True  # held-out figures are the trained subset's
            net = with_full_vocabulary(net)
        save_eagle(args.out, net, record, int8=args.int8_file)
    held = metrics["held_out"]
    console.print(
        f"wrote {args.out} ({metrics['train_sequences']} training sequences, "
        f"{metrics['held_sequences']} held out, {held['positions']} held-out positions)"
    )
    for step, (agree, inside) in enumerate(
        zip(held["agreement_by_step"], held["in_draft_vocab_by_step"], strict=True)
    ):
        console.print(
            f"  step {step + 1}: top-1 is the target's own token {agree:.1%} "
            f"(in the draft vocabulary {inside:.1%})"
        )
    console.print(f"  expected chain accepted length {held['expected_chain_accepted_length']}")
    return 0
