"""The `quickdraft` command line: argparse to configs to library calls, nothing more."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

# Wide enough for the tables when the output is a file or a pipe (rich assumes 80 columns).
console = Console(width=None if sys.stdout.isatty() else 120)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quickdraft",
        description="Exact speculative decoding: faster generation, the same output distribution.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    conformance = commands.add_parser(
        "conformance",
        help="chi-square proof that every lossless rule samples the target's "
        "distribution (exits 1 on failure)",
    )
    conformance.add_argument(
        "--samples", type=_positive_int, default=50_000, help="sequences per case (default 50000)"
    )
    conformance.add_argument("--seed", type=int, default=0)
    conformance.add_argument(
        "--alpha",
        type=float,
        default=1e-3,
        help="fail a case whose p-value is below this (default 1e-3)",
    )

    theory = commands.add_parser(
        "theory", help="speedup model, optimal draft length and acceptance against KL, with plots"
    )
    theory.add_argument("--out", type=Path, required=True, help="directory for PNGs and JSON")
    theory.add_argument(
        "--draft-cost",
        type=float,
        default=0.1,
        help="draft forward / target decode step (default 0.1)",
    )
    theory.add_argument(
        "--verify-slope",
        type=float,
        default=0.0,
        help="extra verify cost per token, in decode steps (0: GPU-like)",
    )
    theory.add_argument(
        "--steps",
        type=_positive_int,
        default=10_000,
        help="speculative steps per draft quality (default 10000)",
    )
    theory.add_argument("--seed", type=int, default=0)

    demo = commands.add_parser("demo", help="speculative generation on toy models, with stats")
    demo.add_argument("--seed", type=int, default=0)

    _add_generate(commands)
    _add_bench(commands)
    _add_pick(commands)
    return parser


def _add_pick(commands: argparse._SubParsersAction) -> None:
    from quickdraft.bench.tasks import TASK_KINDS
    from quickdraft.picker import DRAFTERS

    pick = commands.add_parser(
        "pick", help="recommend a method, k and draft temperature for a workload"
    )
    pick.add_argument("--task", default="other", choices=[*TASK_KINDS, "other"])
    pick.add_argument("--temperature", type=float, default=0.0)
    pick.add_argument("--output-tokens", type=int, default=256, help="typical output length")
    pick.add_argument("--concurrency", type=int, default=1, help="requests decoded together")
    pick.add_argument(
        "--memory-gb", type=float, default=None, help="memory free for a drafter (default: plenty)"
    )
    pick.add_argument("--draft-gb", type=float, default=1.0, help="the draft model's size")
    pick.add_argument(
        "--drafters", default=",".join(DRAFTERS), help="available drafters, comma-separated"
    )
    pick.add_argument("--draft", default=None, help="draft model name, for the vLLM config")
    pick.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
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
    calibration.add_argument(
        "--target", default=None, help="model to calibrate (default: the default model)"
    )
    calibration.add_argument("--k-max", type=_positive_int, default=8)
    calibration.add_argument("--max-new-tokens", type=_positive_int, default=48)
    calibration.add_argument("--threads", type=_positive_int, default=None)
    calibration.add_argument("--json", action="store_true", help="print the result as JSON")


def _add_bench(commands: argparse._SubParsersAction) -> None:
    from quickdraft.models.loading import DEFAULT_MODEL

    bench = commands.add_parser(
        "bench",
        help="acceptance and speedup of several methods over seven task kinds",
        description="Methods run interleaved prompt by prompt; at temperature 0 every output "
        "is checked against autoregressive decoding. Writes results.json, report.md and plots.",
    )
    bench.add_argument("--target", default=DEFAULT_MODEL)
    bench.add_argument("--draft", default=None, help="draft model for draft_model")
    bench.add_argument(
        "--methods",
        default="ar,ngram",
        help="comma-separated; NAME@K sets k per method (e.g. draft_model@3)",
    )
    bench.add_argument("-k", "--num-speculative-tokens", type=int, default=None)
    bench.add_argument("--tasks", default="all", help="all, or a comma-separated list")
    bench.add_argument("--prompts-per-task", type=_positive_int, default=3)
    bench.add_argument("--max-new-tokens", type=_positive_int, default=64)
    bench.add_argument("--temperature", type=float, default=0.0)
    bench.add_argument("--repeats", type=_positive_int, default=1)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--threads", type=_positive_int, default=None)
    bench.add_argument(
        "--no-chat",
        dest="chat",
        action="store_false",
        help="use the plain prompts instead of the chat template",
    )
    bench.add_argument("--draft-int8", action=argparse.BooleanOptionalAction, default=True)
    bench.add_argument("--out", type=Path, required=True)


DEFAULT_PROMPT = (
    "Write a Python function is_palindrome(text) that ignores case and "
    "punctuation, then show three example calls and their results."
)


def _add_generate(commands: argparse._SubParsersAction) -> None:
    from quickdraft.config import AcceptRule
    from quickdraft.models.loading import ALIASES, DEFAULT_MODEL

    generate = commands.add_parser(
        "generate",
        help="generate text with speculative decoding; with no arguments, the "
        "default model on a built-in prompt",
        description="Accepted draft tokens are shown in cyan. Acceptance rules: "
        "rejection_sampling (lossless, default) and greedy (lossless).",
    )
    generate.add_argument(
        "prompt", nargs="?", default=None, help="the prompt (default: a built-in chat prompt)"
    )
    generate.add_argument(
        "--target",
        default=DEFAULT_MODEL,
        help=f"alias ({', '.join(ALIASES)}), GGUF file, folder or hub id",
    )
    generate.add_argument(
        "--method",
        default="auto",
        choices=["auto", "ar", "draft_model", "ngram"],
        help="auto: draft_model with --draft, else ngram",
    )
    generate.add_argument("--draft", default=None, help="draft model for --method draft_model")
    generate.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="draft tokens per step (default 4 for draft_model, 5 for ngram)",
    )
    generate.add_argument(
        "--acceptance", default="rejection_sampling", choices=[rule.value for rule in AcceptRule]
    )
    generate.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    generate.add_argument("--top-k", type=int, default=0)
    generate.add_argument("--top-p", type=float, default=1.0)
    generate.add_argument("--max-new-tokens", type=int, default=128)
    generate.add_argument("--seed", type=int, default=None)
    generate.add_argument("--draft-temperature", type=float, default=None)
    generate.add_argument(
        "--draft-int8",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="int8 weights for the draft model on CPU (default on; the output stays exact, "
        "only acceptance can change)",
    )
    generate.add_argument("--prompt-lookup-min", type=int, default=1)
    generate.add_argument("--prompt-lookup-max", type=int, default=3)
    generate.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    generate.add_argument("--device", default="cpu")
    generate.add_argument("--backend", default="auto", choices=["auto", "native", "hf"])
    generate.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap the prompt in the chat template (default: on for the built-in prompt)",
    )
    generate.add_argument("--stream", action="store_true", help="print tokens as they come")
    generate.add_argument(
        "--json", action="store_true", help='print {"token_ids", "text", "stats"} as JSON'
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        commands = {
            "conformance": _conformance,
            "theory": _theory,
            "demo": _demo,
            "generate": _generate,
            "bench": _bench,
            "pick": _pick,
        }
        return commands[args.command](args)
    except ValueError as error:
        console.print(f"[red]error:[/red] {error}")
        return 2


def _conformance(args: argparse.Namespace) -> int:
    from quickdraft.conformance import default_cases, run_case

    start = time.perf_counter()
    cases = default_cases()
    results = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("conformance", total=len(cases))
        for case in cases:
            results.append(run_case(case, samples=args.samples, seed=args.seed))
            progress.advance(task)
    table = Table(
        title=f"Conformance: joint distribution of the first k+1 tokens, "
        f"{args.samples:,} samples per row"
    )
    for column in (
        "rule",
        "temperature",
        "top_k",
        "top_p",
        "k",
        "accepted length",
        "bins",
        "p-value",
        "total variation",
        "",
    ):
        table.add_column(column, justify="left" if column == "rule" else "right")
    failed = 0
    for result in results:
        case, ok = result.case, result.p_value >= args.alpha
        failed += not ok
        table.add_row(
            case.rule.value,
            f"{case.temperature:g}",
            str(case.top_k),
            f"{case.top_p:g}",
            str(case.k),
            f"{result.mean_accepted_length:.2f}",
            str(result.bins),
            f"{result.p_value:.3g}",
            f"{result.total_variation:.4f}",
            "[green]pass[/green]" if ok else "[red]FAIL[/red]",
        )
    console.print(table)
    elapsed = time.perf_counter() - start
    console.print(
        f"{len(results) - failed}/{len(results)} rows pass at p >= {args.alpha:g}; {elapsed:.1f} s"
    )
    return 1 if failed else 0


def _theory(args: argparse.Namespace) -> int:
    from quickdraft.theory import CostModel
    from quickdraft.theory_report import TOLERANCE, build_report, write_report

    report = build_report(CostModel(args.draft_cost, args.verify_slope), args.steps, args.seed)
    paths = write_report(report, args.out)
    table = Table(
        title=f"Optimal draft length (draft cost {args.draft_cost:g}, "
        f"verify slope {args.verify_slope:g})"
    )
    for column in ("alpha", "optimal N", "tokens / target call", "speedup"):
        table.add_column(column, justify="right")
    for row in report.optimal:
        table.add_row(
            f"{row.alpha:g}",
            str(row.optimal_n),
            f"{row.tokens_per_step:.2f}",
            f"{row.speedup:.2f}x",
        )
    console.print(table)
    table = Table(
        title=f"Acceptance against KL(target || draft), {args.steps:,} speculative steps each"
    )
    for column in ("draft distance", "KL", "1 - TV (exact)", "measured", "gap", "trials"):
        table.add_column(column, justify="right")
    for point in sorted(report.acceptance, key=lambda p: p.kl):
        table.add_row(
            f"{point.distance:g}",
            f"{point.kl:.4f}",
            f"{point.expected:.4f}",
            f"{point.measured:.4f}",
            f"{point.measured - point.expected:+.4f}",
            f"{point.trials:,}",
        )
    console.print(table)
    console.print(
        f"monotone decreasing: {report.monotone}; largest gap {report.max_gap:.4f} "
        f"(tolerance {TOLERANCE})"
    )
    for path in paths:
        console.print(f"wrote {path}")
    return 0 if report.passed else 1


def _demo(args: argparse.Namespace) -> int:
    from quickdraft.config import Method, SamplingParams, SpecConfig
    from quickdraft.engine import generate
    from quickdraft.models.toy import NGramLM, ToyTokenizer

    target = NGramLM.random(26, order=3, seed=args.seed, sharpness=3.0)
    draft = target.perturbed(0.25)
    tokenizer = ToyTokenizer(26)
    console.print(
        "Toy trigram target (26 letters) and a perturbed copy as draft model. "
        "[bold cyan]Cyan[/bold cyan]: draft tokens the target accepted.\n"
    )
    for temperature in (0.0, 1.0):
        sampling = SamplingParams(temperature=temperature, max_new_tokens=64, seed=args.seed)
        for spec in (SpecConfig(method=Method.AR), SpecConfig(num_speculative_tokens=4)):
            out = generate(
                target, "spec", sampling=sampling, spec=spec, draft=draft, tokenizer=tokenizer
            )
            text = Text()
            for token, drafted in zip(out.token_ids, out.from_draft, strict=True):
                text.append(tokenizer.decode([token]), style="bold cyan" if drafted else None)
            console.print(f"[bold]{spec.method.value}[/bold], temperature {temperature:g}:")
            console.print(text)
            console.print(out.stats.summary() + "\n")
    return 0


def _generate(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    import torch

    from quickdraft.config import Method, SamplingParams, SpecConfig
    from quickdraft.engine import generate
    from quickdraft.models.loading import load_model

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    method = args.method
    if method == "auto":
        method = "draft_model" if args.draft else "ngram"
    if args.draft and method != "draft_model":
        raise ValueError(f"draft: --draft is used by --method draft_model, not {method}")
    k = args.num_speculative_tokens or (5 if method == "ngram" else 4)
    spec = SpecConfig(
        method=Method(method),
        num_speculative_tokens=k,
        acceptance=args.acceptance,
        draft_temperature=args.draft_temperature,
        prompt_lookup_min=args.prompt_lookup_min,
        prompt_lookup_max=args.prompt_lookup_max,
    )
    sampling = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    if method == "draft_model" and not args.draft:
        raise ValueError("draft: --method draft_model needs --draft MODEL")
    target, tokenizer = load_model(args.target, device=args.device, backend=args.backend)
    draft = draft_tokenizer = None
    if method == "draft_model":
        int8 = args.draft_int8 and args.device == "cpu" and args.backend != "hf"
        draft, draft_tokenizer = load_model(
            args.draft, device=args.device, backend=args.backend, int8=int8
        )
    sampling = dataclasses.replace(sampling, stop_token_ids=tokenizer.eos_token_ids)
    chat = args.chat if args.chat is not None else args.prompt is None
    text = args.prompt if args.prompt is not None else DEFAULT_PROMPT
    prompt = tokenizer.apply_chat(text) if chat else tokenizer.encode(text)

    printer = _MarkedPrinter(tokenizer)
    on_step = None
    if args.stream and not args.json:

        def on_step(output: Any) -> None:
            printer.show(output.row_ids(0), output.row_from_draft(0))

    out = generate(
        target,
        prompt,
        sampling=sampling,
        spec=spec,
        draft=draft,
        tokenizer=tokenizer,
        draft_tokenizer=draft_tokenizer,
        on_step=on_step,
    )
    if args.json:
        print(
            json.dumps({"token_ids": out.token_ids, "text": out.text, "stats": out.stats.to_dict()})
        )
        return 0
    printer.show(out.token_ids, out.from_draft)
    console.print()
    console.print(
        f"[dim]{spec.method.value}, k={spec.k}: {out.stats.summary()}; "
        f"finish: {out.finish_reason}[/dim]"
    )
    return 0


def _bench(args: argparse.Namespace) -> int:
    import platform

    import torch

    from quickdraft.bench.harness import BenchSettings, parse_methods, run_bench, summarise
    from quickdraft.bench.report import write_report
    from quickdraft.bench.tasks import load_tasks, parse_tasks
    from quickdraft.models.loading import load_model

    methods = parse_methods(args.methods, args.num_speculative_tokens)
    tasks = load_tasks(parse_tasks(args.tasks), args.prompts_per_task)
    settings = BenchSettings(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        repeats=args.repeats,
        seed=args.seed,
        chat=args.chat,
    )
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    target, tokenizer = load_model(args.target)
    draft = draft_tokenizer = None
    if args.draft:
        draft, draft_tokenizer = load_model(args.draft, int8=args.draft_int8)
    total = sum(len(items) for items in tasks.values()) * args.repeats * len(methods)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("bench", total=total)

        def advance(record: Any) -> None:
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
            on_run=advance,
        )
    summary = summarise(bench)
    meta = {
        "target": args.target,
        "draft": args.draft,
        "draft_weights": "int8" if args.draft and args.draft_int8 else "as loaded",
        "methods": [m.label for m in methods],
        "tasks": list(tasks),
        "prompts_per_task": args.prompts_per_task,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, "
        f"torch {torch.__version__}",
    }
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


def _pick(args: argparse.Namespace) -> int:
    from quickdraft.picker import Workload, pick

    if args.calibrate is not None:
        return _calibrate(args)

    drafters = tuple(d.strip() for d in args.drafters.split(",") if d.strip())
    workload = Workload(
        task=args.task,
        temperature=args.temperature,
        output_tokens=args.output_tokens,
        concurrency=args.concurrency,
        memory_gb=args.memory_gb,
        draft_gb=args.draft_gb,
        drafters=drafters,
        device=args.device,
    )
    print(pick(workload).as_text(args.draft))  # plain: the JSON lines must stay unwrapped
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    import json

    import torch

    from quickdraft.calibrate import calibrate, describe
    from quickdraft.config import Method
    from quickdraft.models.loading import DEFAULT_MODEL, load_model

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    target, tokenizer = load_model(args.target or DEFAULT_MODEL)
    draft = None
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    if "draft_model" in drafters and args.draft:
        draft, _ = load_model(args.draft, int8=True)
    prompts = _read_prompts(args.calibrate, tokenizer)
    with console.status(f"calibrating on {len(prompts)} prompts"):
        result = calibrate(
            target,
            prompts,
            draft=draft,
            methods=tuple(Method(d) for d in drafters),
            k_max=args.k_max,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            stop_token_ids=tokenizer.eos_token_ids,
        )
    data = describe(result, args.draft)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    table = Table(title="Predicted speedup over plain decoding, by method and k")
    table.add_column("method")
    for k in range(1, args.k_max + 1):
        table.add_column(f"k={k}", justify="right")
    for profile in result.profiles:
        table.add_row(
            profile.method.value, *(f"{profile.predicted[k]:.2f}" for k in range(1, args.k_max + 1))
        )
    console.print(table)
    print(result.choice.as_text(args.draft))
    if result.measured_speedup is not None:
        print(
            f"predicted {result.choice.predicted_speedup:.2f}x, measured "
            f"{result.measured_speedup:.2f}x on the same prompts"
        )
    return 0


def _read_prompts(path: Path, tokenizer: Any) -> list[list[int]]:
    import json

    if not path.is_file():
        raise ValueError(f"calibrate: {path} is not a file")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    prompts = []
    for line in lines:
        if path.suffix == ".jsonl":
            item = json.loads(line)
            if "messages" in item and tokenizer.has_chat_template:
                prompts.append(tokenizer.apply_chat(item["messages"]))
            else:
                prompts.append(tokenizer.encode(item["prompt"]))
        else:
            prompts.append(tokenizer.encode(line))
    if not prompts:
        raise ValueError(f"calibrate: {path} holds no prompts")
    return prompts


class _MarkedPrinter:
    """Prints new text as it arrives; accepted draft tokens in cyan."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.shown_tokens = 0
        self.shown_text = ""

    def show(self, ids: list[int], from_draft: list[bool]) -> None:
        piece = Text()
        for index in range(self.shown_tokens, len(ids)):
            text = self.tokenizer.decode(ids[: index + 1])
            if text.endswith("\ufffd") and index + 1 < len(ids):
                continue  # an incomplete multi-byte character: wait for the next token
            piece.append(text[len(self.shown_text) :], style="cyan" if from_draft[index] else None)
            self.shown_text = text
        self.shown_tokens = len(ids)
        console.print(piece, end="", soft_wrap=True)


if __name__ == "__main__":
    sys.exit(main())
