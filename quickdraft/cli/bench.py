"""`quickdraft bench`: measuring methods side by side on task sets."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.progress import Progress
from rich.table import Table

from quickdraft.cli.common import (
    _positive_int,
    _threads,
    add_quant,
    console,
    finite_float,
    strict_int,
)


def _add_bench(commands: argparse._SubParsersAction) -> None:
    from quickdraft.models.loading import DEFAULT_MODEL

    bench = commands.add_parser(
        "bench",
        help="acceptance and speedup of several methods over seven task kinds",
        description="Methods run interleaved prompt by prompt; at temperature 0 every output "
        "is checked against autoregressive decoding. Writes results.json, report.md and plots.",
    )
    bench.add_argument("--target", default=DEFAULT_MODEL)
    add_quant(bench)
    bench.add_argument("--draft", default=None, help="draft model for draft_model")
    bench.add_argument(
        "--methods",
        default="ar,ngram",
        help="comma-separated; NAME@K sets k per method (e.g. draft_model@3); medusa@4.2.1 "
        "sets the Medusa tree's widths, eagle@4.4.12 the EAGLE tree's depth, top-k and tokens "
        "(eagle@6.4.10p0.1 adds a minimum path probability, eagle+N the prompt-lookup tokens "
        "grafted onto its tree, eagle+0 none; eagle+dyna-pa:4 or draft_model+fr:32768 a head "
        "shortlist, as --shortlist of generate), lookahead@4.4.3 its window, n-gram size and "
        "candidates",
    )
    bench.add_argument(
        "--medusa-dir", default=None, help="Medusa heads (default: those shipped for --target)"
    )
    bench.add_argument(
        "--eagle-dir", default=None, help="EAGLE drafter (default: the one shipped for --target)"
    )
    bench.add_argument("-k", "--num-speculative-tokens", type=strict_int, default=None)
    bench.add_argument(
        "--tasks",
        default="all",
        help="all (the seven classic kinds), or a comma-separated list; agentic: multi-turn "
        "agent sessions (--prompts-per-task counts sessions); structured: replies in a JSON "
        "schema",
    )
    bench.add_argument("--prompts-per-task", type=_positive_int, default=3)
    bench.add_argument("--max-new-tokens", type=_positive_int, default=64)
    bench.add_argument("--temperature", type=finite_float, default=0.0)
    bench.add_argument("--repeats", type=_positive_int, default=1)
    bench.add_argument("--seed", type=strict_int, default=0)
    bench.add_argument("--threads", type=_threads, default=None)
    bench.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="a fresh engine per request, every prompt prefilled whole (by default each "
        "method keeps one engine, as a server does: a session's next turn finds the earlier "
        "ones cached)",
    )
    bench.add_argument(
        "--unconstrained",
        dest="constrained",
        action="store_false",
        help="run the structured task set's items without their JSON schemas (their replies "
        "are still checked against them)",
    )
    bench.add_argument(
        "--no-chat",
        dest="chat",
        action="store_false",
        help="use the plain prompts instead of the chat template",
    )
    bench.add_argument(
        "--draft-int8",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="int8 weights for the draft model and the trained Medusa/EAGLE drafters on CPU",
    )
    bench.add_argument("--out", type=Path, required=True)


def _bench(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from quickdraft import kernels
    from quickdraft.bench.harness import BenchSettings, parse_methods, run_bench
    from quickdraft.bench.machine import describe_machine
    from quickdraft.bench.report import write_report
    from quickdraft.bench.runlog import RunLog
    from quickdraft.bench.summary import summarise
    from quickdraft.bench.tasks import load_tasks, parse_tasks
    from quickdraft.config import Method
    from quickdraft.drafters import registry
    from quickdraft.models.llama import quant_layout
    from quickdraft.models.loading import load_model

    methods = parse_methods(args.methods, args.num_speculative_tokens)
    if not args.draft_int8:  # the trained drafters' weights follow the draft model's flag
        methods = [
            dataclasses.replace(m, spec=registry.with_options(m.spec, drafter_int8=False))
            if "drafter_int8" in registry.get(m.spec.method).option_names()
            else m
            for m in methods
        ]
    tasks = load_tasks(parse_tasks(args.tasks), args.prompts_per_task)
    settings = BenchSettings(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        repeats=args.repeats,
        seed=args.seed,
        chat=args.chat,
        prefix_caching=args.prefix_caching,
        constrained=args.constrained,
    )
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    target, tokenizer = load_model(args.target, quant=args.quant)
    draft = draft_tokenizer = None
    if args.draft:
        draft, draft_tokenizer = load_model(args.draft, int8=args.draft_int8)
    trained = args.draft or any(m.spec.method in (Method.MEDUSA, Method.EAGLE) for m in methods)
    meta = {
        "target": args.target,
        "target_weights": kernels.describe_weights(args.quant, quant_layout(target)),
        "draft": args.draft,
        "draft_weights": "int8" if args.draft_int8 and trained else "as loaded",
        "methods": [m.label for m in methods],
        "tasks": list(tasks),
        "prompts_per_task": args.prompts_per_task,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "repeats": args.repeats,
        "seed": args.seed,
        "chat": args.chat,
        "prefix_caching": args.prefix_caching,
        "constrained": args.constrained,
        "threads": torch.get_num_threads(),
        "machine": describe_machine(),
    }
    identity = {key: value for key, value in meta.items() if key != "machine"}
    log = RunLog(args.out, {**identity, "medusa_dir": args.medusa_dir, "eagle_dir": args.eagle_dir})
    done = log.resume()
    if done:
        console.print(f"resuming: {len(done)} runs of this bench already in {log.path}")
    if log.replaced:
        console.print(
            f"{log.path} held another bench's runs (or an unreadable header); starting a new log"
        )
    total = sum(len(items) for items in tasks.values()) * args.repeats * len(methods)
    # An older results.json must not look current while this run goes: mark it partial now.
    write_report({}, {**meta, "completed": f"{len(done)}/{total}"}, args.out, partial=True)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("bench", total=total, completed=len(done))

        def advance(record: Any, so_far: Any) -> None:
            log.append(record)
            meta["completed"] = f"{len(so_far.records)}/{total}"
            write_report(summarise(so_far), meta, args.out, partial=True)
            progress.update(
                bar, advance=1, description=f"{record.task} {record.item} {record.method}"
            )

        bench = run_bench(
            target,
            tokenizer,
            methods,
            tasks,
            settings,
            draft=draft,
            draft_tokenizer=draft_tokenizer,
            draft_name=args.draft,
            target_name=args.target,
            medusa_dir=args.medusa_dir,
            eagle_dir=args.eagle_dir,
            on_run=advance,
            done=done,
        )
    summary = summarise(bench)
    meta["completed"] = f"{len(bench.records)}/{total}"
    paths = write_report(summary, meta, args.out)
    table = Table(title=f"bench: {args.target}, all tasks")
    columns = (
        "method",
        "decode tok/s",
        "decode speedup",
        "end-to-end speedup",
        "accepted length",
        "identical",
    )
    for column in columns:
        table.add_column(column, justify="right")
    mismatches = 0
    for label, row in summary["all"].items():
        identical = row["identical_to_ar"]
        mismatches += identical is False
        table.add_row(
            label,
            f"{row['decode_tokens_per_s_median'] or 0:.2f}",
            f"{row['decode_speedup_over_ar'] or 0:.2f}x",
            f"{row['speedup_over_ar'] or 0:.2f}x",
            f"{row['mean_accepted_length'] or 0:.2f}",
            {True: "yes", False: "[red]NO[/red]", None: "-"}[identical],
        )
    console.print(table)
    for path in paths:
        console.print(f"wrote {path}")
    return 1 if mismatches else 0
