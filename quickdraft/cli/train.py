"""`quickdraft train ...`: training of drafter-side artifacts."""

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
    non_negative_int,
    strict_int,
)
from quickdraft.cli.train_eagle import _add_train_eagle, _train_eagle


def _add_train(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help="train drafter artifacts")
    kinds = train.add_subparsers(dest="train_kind", required=True)
    frequency = kinds.add_parser(
        "frequency",
        help="an FR-Spec frequency list: token counts over a corpus, each kind of text "
        "weighted equally",
        description="Writes frequency.safetensors and frequency.json (tokens counted, token "
        "ids that occur) into --out. Counts every scored token of every record, uncut (a "
        "chat's replies, a text file after its first token): a larger corpus than the "
        "router's, so that the list ranks tokens by use rather than by id.",
    )
    frequency.add_argument("--model", required=True, help="whose tokenizer counts (an alias)")
    frequency.add_argument(
        "--data", nargs="+", required=True, help="corpus files or folders (.jsonl chats, text)"
    )
    frequency.add_argument("--out", type=Path, required=True)
    frequency.add_argument("--threads", type=_threads, default=None)
    router = kinds.add_parser(
        "router",
        help="vocabulary shortlists for a draft model: FR-Spec frequency list, DynaSpec "
        "clusters and router",
        description="Writes frequency.safetensors, clusters.safetensors, router.json, "
        "router.safetensors and metrics.json into --out. Features and checkpoints are cached "
        "under --cache, so an interrupted run resumes where it stopped.",
    )
    router.add_argument(
        "--draft",
        required=True,
        help="the model whose head is shortlisted: a draft model, or with --eagle-dir the "
        "target of that EAGLE drafter",
    )
    router.add_argument(
        "--eagle-dir",
        default=None,
        help="an EAGLE drafter of --draft: the router learns from its first draft level's "
        "inputs (the target's fused feature and the token), labels are --draft's own tokens",
    )
    router.add_argument(
        "--target",
        default=None,
        help="labels are the target's next tokens (its argmax); without it, the corpus's",
    )
    router.add_argument(
        "--data", nargs="+", required=True, help="corpus files or folders (.jsonl chats, text)"
    )
    router.add_argument(
        "--frequency-data",
        nargs="+",
        default=(),
        help="text for the frequency list when it differs from --data (such as the draft's "
        "own replies); default: --data",
    )
    router.add_argument(
        "--frequency",
        default=None,
        help="a 'train frequency' folder: its list is used as it is (a larger corpus than "
        "--data); instead of --frequency-data",
    )
    router.add_argument("--out", type=Path, required=True)
    router.add_argument("--clusters", type=_positive_int, default=64, help="M (default 64)")
    router.add_argument(
        "--core",
        type=non_negative_int,
        default=16384,
        help="most frequent tokens always in a DynaSpec shortlist, outside the clusters "
        "(default 16384; 0 clusters the whole vocabulary as in the paper)",
    )
    router.add_argument(
        "--budget-tokens",
        type=_positive_int,
        default=40_000,
        help="scored positions of router training data, balanced over kinds (default 40000)",
    )
    router.add_argument("--max-tokens", type=_positive_int, default=384)
    router.add_argument("--epochs", type=_positive_int, default=8)
    router.add_argument("--batch-size", type=_positive_int, default=256)
    router.add_argument("--lr", type=finite_float, default=2e-3)
    router.add_argument("--width", type=_positive_int, default=512, help="router hidden width")
    router.add_argument(
        "--int8",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="int8 weights while computing features (default on, as the draft runs)",
    )
    router.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    router.add_argument("--threads", type=_threads, default=None)
    router.add_argument("--seed", type=strict_int, default=0)

    medusa = kinds.add_parser(
        "medusa",
        help="Medusa heads on a frozen target (self-distilled: each head learns the target's "
        "own later tokens)",
        description="Writes medusa.json, medusa.safetensors and metrics.json into --out. "
        "Features and checkpoints are cached under --cache, so an interrupted run resumes "
        "where it stopped. Runs unchanged under `accelerate launch`; --batch-size is the "
        "global batch.",
    )
    medusa.add_argument("--target", required=True, help="the target model (native runner)")
    medusa.add_argument(
        "--data", nargs="+", required=True, help="corpus files or folders (.jsonl chats, text)"
    )
    medusa.add_argument("--out", type=Path, required=True)
    medusa.add_argument("--heads", type=_positive_int, default=3, help="heads (default 3)")
    medusa.add_argument(
        "--layers", type=_positive_int, default=1, help="residual blocks per head (default 1)"
    )
    medusa.add_argument(
        "--own-head",
        action="store_true",
        help="each head gets an LM head of its own (vocab x hidden each) instead of the target's",
    )
    medusa.add_argument(
        "--budget-tokens",
        type=_positive_int,
        default=60_000,
        help="training positions, balanced over kinds of text (default 60000)",
    )
    medusa.add_argument("--max-tokens", type=_positive_int, default=512)
    medusa.add_argument("--epochs", type=_positive_int, default=2)
    medusa.add_argument("--batch-size", type=_positive_int, default=32)
    medusa.add_argument("--lr", type=finite_float, default=1e-3)
    medusa.add_argument(
        "--train-vocab",
        type=strict_int,
        default=0,
        help="score only the N most frequent target tokens in the loss (0: all, the default); "
        "the heads still rank the whole vocabulary when drafting",
    )
    medusa.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    medusa.add_argument("--threads", type=_threads, default=None)
    medusa.add_argument("--seed", type=strict_int, default=0)
    _add_scaling(medusa)
    _add_train_eagle(kinds)


def _train(args: argparse.Namespace) -> int:
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.train_kind == "medusa":
        return _train_medusa(args)
    if args.train_kind == "eagle":
        return _train_eagle(args)
    if args.train_kind == "frequency":
        return _train_frequency(args)
    return _train_router(args)


def _train_frequency(args: argparse.Namespace) -> int:
    from rich.progress import track

    from quickdraft.models.loading import load_model
    from quickdraft.train.corpus import read_records, tokenize
    from quickdraft.train.shortlist_artifacts import token_frequency
    from quickdraft.vocab.shortlist import save_frequency

    records = read_records(list(args.data))
    model, tokenizer = load_model(args.model)
    sequences = [
        tokenize(record, tokenizer, 1 << 30)
        for record in track(records, description="counting", console=console, transient=True)
    ]
    frequency = token_frequency(sequences, model.vocab_size)
    save_frequency(args.out, frequency, {"data": list(args.data), "model": args.model})
    occurring = int((frequency > 0).sum())
    counted = sum(len(s.tokens) - s.start for s in sequences)
    summary = {"tokens": counted, "records": len(records), "ids_occurring": occurring}
    (args.out / "frequency.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(
        f"wrote {args.out}: {counted:,} tokens of {len(records):,} records; {occurring:,} of "
        f"{model.vocab_size:,} token ids occur"
    )
    return 0


def _train_medusa(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from quickdraft.train.medusa import MedusaTraining, build_heads

    training = MedusaTraining(
        num_heads=args.heads,
        num_layers=args.layers,
        own_head=args.own_head,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        train_vocab=args.train_vocab,
    )
    scaling, reporting = _scaling(args)
    with Progress(
        *_progress_columns(), console=console, transient=True, disable=not reporting
    ) as progress:
        advance = _stages(progress)
        metrics = build_heads(
            args.target, args.data, training, args.out, args.cache,
            args.budget_tokens, args.max_tokens, advance, scaling,
        )  # fmt: skip
    if not reporting:  # under `accelerate launch`, the first process writes and reports
        return 0
    console.print(
        f"wrote {args.out} ({metrics['train_positions']} training positions, "
        f"{metrics['held_positions']} held out)"
    )
    for row in metrics["held_out"]:
        console.print(
            f"  head {row['head']}: top-1 {row['top1']:.1%}, top-3 {row['top3']:.1%}, "
            f"top-5 {row['top5']:.1%} of the target's own tokens"
        )
    return 0


def _train_router(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from quickdraft.train.router import RouterTraining
    from quickdraft.train.shortlist_artifacts import ArtifactSettings, build_artifacts

    settings = ArtifactSettings(
        draft=args.draft,
        target=args.target,
        eagle_dir=args.eagle_dir,
        data=tuple(args.data),
        frequency_data=tuple(args.frequency_data),
        frequency=args.frequency,
        clusters=args.clusters,
        core=args.core,
        budget_tokens=args.budget_tokens,
        max_tokens=args.max_tokens,
        int8=args.int8,
    )
    training = RouterTraining(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        width=args.width,
        seed=args.seed,
    )
    with Progress(*_progress_columns(), console=console, transient=True) as progress:
        advance = _stages(progress)
        metrics = build_artifacts(settings, training, args.out, args.cache, advance)
    held = metrics["log"]["history"][-1]["held_loss"] if metrics["log"]["history"] else None
    console.print(f"wrote {args.out} ({metrics['features']['rows']} training rows)")
    console.print(f"held-out router loss {held}")
    for row in metrics["router_coverage"]:
        console.print(
            f"  top {row['clusters']:>2} clusters: {row['vocab_share']:.1%} of the vocabulary, "
            f"target token {row['target_recall']:.1%}, agreeing draft "
            f"{row['agreeing_draft_recall']:.1%}"
        )
    return 0
