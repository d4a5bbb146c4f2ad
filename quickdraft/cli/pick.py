"""`quickdraft pick`: choosing a method and its settings for a workload, from priors or from
a calibration on the user's own prompts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.progress import Progress
from rich.table import Table

from quickdraft.cli.common import (
    _positive_int,
    _progress_columns,
    _stages,
    _threads,
    add_quant,
    console,
    finite_float,
    strict_int,
)


def _add_pick(commands: argparse._SubParsersAction) -> None:
    from quickdraft.pick.picker import PICK_TASKS

    pick = commands.add_parser(
        "pick",
        help="choose a method and its settings for a workload, with the configs for quickdraft, "
        "vLLM and SGLang",
        description="Considers every registered method with what this target has (a draft "
        "model, EAGLE drafters, Medusa heads, shortlists), from priors measured here or, with "
        "--calibrate, measured on your prompts. Prints quickdraft's --speculative-config, "
        "vLLM's speculative_config and SGLang's flags, with the export commands a drafter needs.",
    )
    pick.add_argument("--target", default=None, help="the target (default: the default model)")
    pick.add_argument("--draft", default=None, help="a draft model, if one may be used")
    pick.add_argument("--eagle-dir", type=Path, default=None, help="an EAGLE drafter's folder")
    pick.add_argument("--medusa-dir", type=Path, default=None, help="Medusa heads' folder")
    pick.add_argument(
        "--shortlist-dir", type=Path, default=None, help="a draft model's shortlist artifacts"
    )
    pick.add_argument(
        "--export-dir",
        type=Path,
        default=Path("exported"),
        help="where drafters are exported for other engines (default: ./exported)",
    )
    pick.add_argument("--task", default="other", choices=PICK_TASKS)
    pick.add_argument("--temperature", type=finite_float, default=0.0)
    pick.add_argument("--output-tokens", type=strict_int, default=256, help="typical output length")
    pick.add_argument("--concurrency", type=strict_int, default=1, help="requests decoded together")
    pick.add_argument(
        "--memory-gb",
        type=finite_float,
        default=None,
        help="memory free for a drafter (default: plenty)",
    )
    pick.add_argument("--draft-gb", type=finite_float, default=1.0, help="the draft model's size")
    pick.add_argument(
        "--methods",
        default=None,
        help="only these registered methods, comma-separated (default: all)",
    )
    pick.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    add_quant(pick)
    pick.add_argument("--json", action="store_true", help="print the result as JSON")
    calibration = pick.add_argument_group(
        "calibration", "measure acceptance and costs on your prompts instead of using priors"
    )
    calibration.add_argument(
        "--calibrate",
        type=Path,
        default=None,
        metavar="PROMPTS",
        help="a JSONL file of {prompt} or {messages} items (the bench "
        "task format), or a text file with one prompt per line",
    )
    calibration.add_argument("--max-new-tokens", type=_positive_int, default=48)
    calibration.add_argument(
        "--budget-seconds",
        type=_positive_int,
        default=300,
        help="time for measuring and confirming (default 300)",
    )
    calibration.add_argument("--threads", type=_threads, default=None)


def _pick_inputs(args: argparse.Namespace):
    from quickdraft.models.loading import DEFAULT_MODEL
    from quickdraft.pick.context import PickContext
    from quickdraft.pick.picker import Workload

    chosen = None
    if args.methods is not None:
        chosen = tuple(m.strip() for m in args.methods.split(",") if m.strip())
        if not chosen:
            raise ValueError(f"--methods: no method named in {args.methods!r}")
    workload = Workload(
        task=args.task,
        temperature=args.temperature,
        output_tokens=args.output_tokens,
        concurrency=args.concurrency,
        memory_gb=args.memory_gb,
        draft_gb=args.draft_gb,
        methods=chosen,
        device=args.device,
        weights=args.quant or "float",
    )
    context = PickContext(
        target=args.target or DEFAULT_MODEL,
        draft=args.draft,
        device=args.device,
        eagle_dir=args.eagle_dir,
        medusa_dir=args.medusa_dir,
        shortlist_dir=args.shortlist_dir,
        export_dir=args.export_dir,
    )
    return workload, context


def _pick(args: argparse.Namespace) -> int:
    import json

    from quickdraft.pick.picker import pick

    if args.calibrate is not None:
        return _calibrate(args)
    workload, context = _pick_inputs(args)
    recommendation = pick(workload, context)
    if args.json:
        print(json.dumps(recommendation.as_dict(), indent=2))
    else:
        print(recommendation.as_text())  # plain: the JSON lines must stay unwrapped
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    import json

    import torch

    from quickdraft.models.loading import load_model
    from quickdraft.pick.calibrate import calibrate, describe

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    workload, context = _pick_inputs(args)
    if not args.calibrate.is_file():
        raise ValueError(f"calibrate: {args.calibrate} is not a file")
    target, tokenizer = load_model(context.target, quant=args.quant)
    draft = draft_tokenizer = None
    if context.draft is not None and (
        workload.methods is None or "draft_model" in workload.methods
    ):
        draft, draft_tokenizer = load_model(context.draft, int8=True)
    prompts = _read_prompts(args.calibrate, tokenizer)
    with Progress(*_progress_columns(), console=console, transient=True) as progress:
        advance = _stages(progress)
        result = calibrate(
            target,
            prompts,
            context,
            workload,
            draft=draft,
            max_new_tokens=args.max_new_tokens,
            stop_token_ids=tokenizer.eos_token_ids,
            budget_seconds=args.budget_seconds,
            progress=advance,
            tokenizer=tokenizer,
            draft_tokenizer=draft_tokenizer,
        )
    data = describe(result)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    table = Table(title=f"Measured on {result.prompts_used} prompts ({result.seconds:.0f} s)")
    for column in ("configuration", "tokens/step", "draft ms", "verify ms", "predicted"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for row in data["measured"]:
        table.add_row(
            row["label"], f"{row['expected_tokens']:.2f}", f"{row['draft_ms_per_step']:.1f}",
            f"{row['verify_ms_per_step']:.1f}", f"{row['predicted_speedup']:.2f}x",
        )  # fmt: skip
    console.print(table)
    print(result.choice.as_text())
    return 0


def _read_prompts(path: Path, tokenizer: Any) -> list[list[int]]:
    from quickdraft.train.corpus import check_record, jsonl_objects, read_utf8

    if not path.is_file():
        raise ValueError(f"calibrate: {path} is not a file")
    prompts = []
    if path.suffix == ".jsonl":
        for number, item in jsonl_objects(path, "calibrate"):
            where = f"{path}:{number}"
            if "messages" in item:
                check_record(item, where, option="calibrate")
            elif not isinstance(item.get("prompt"), str):
                raise ValueError(f"calibrate: {where} has neither 'messages' nor a 'prompt' string")
            if "messages" in item and tokenizer.has_chat_template:
                prompts.append(tokenizer.apply_chat(item["messages"]))
            elif "prompt" in item:
                prompts.append(tokenizer.encode(item["prompt"]))
            else:
                raise ValueError(f"calibrate: {where}: chats need a tokenizer with a chat template")
    else:
        lines = read_utf8(path, "calibrate").splitlines()
        prompts = [tokenizer.encode(line) for line in lines if line.strip()]
    if not prompts:
        raise ValueError(f"calibrate: {path} holds no prompts")
    return prompts
