"""`quickdraft data ...`: training text built from what the machine has."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
from collections.abc import Iterator
from pathlib import Path

from quickdraft.cli.common import (
    DEFAULT_CACHE,
    LogLines,
    _positive_int,
    _progress_columns,
    _threads,
    add_quant,
    console,
    finite_float,
    strict_int,
)


def _add_data(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("data", help="build training text")
    kinds = data.add_subparsers(dest="data_kind", required=True)
    corpus = kinds.add_parser(
        "corpus",
        help="a plain-text corpus from offline sources (the standard library, man pages) for "
        "frequency lists",
        description="Writes corpus.jsonl (records with text, kind and source) and corpus.json "
        "(files taken, characters, sha256) into --out. Files the bench's task sets quote are "
        "left out. Deterministic: the same machine and arguments give the same bytes. Count "
        "it with: quickdraft train frequency --data OUT/corpus.jsonl ...",
    )
    corpus.add_argument("--out", type=Path, required=True, help="output folder")
    corpus.add_argument(
        "--sources",
        nargs="+",
        choices=["code", "manual"],
        default=["code", "manual"],
        help="code: the Python standard library; manual: the English man pages (default both)",
    )
    corpus.add_argument(
        "--max-chars",
        type=_positive_int,
        default=24_000_000,
        help="characters taken from each source at most (default 24M, about 6M tokens)",
    )
    corpus.add_argument("--seed", type=strict_int, default=0, help="the order files are taken in")

    prompt_kinds = {
        "code-prompts": (
            "code-completion prompts from the standard library's functions, for regenerate",
            "in HumanEval's form (a public standard-library function's signature and docstring "
            "to complete)",
            "which functions are taken",
        ),
        "doc-prompts": (
            "summarization and passage-question prompts over docstrings and man pages",
            "in the forms of the bench's summarization and RAG tasks (summarise a passage in "
            "two sentences; answer a question from the passage alone), alternately, over "
            "standard-library docstrings and man pages' DESCRIPTION sections,",
            "which passages are taken",
        ),
        "guide-prompts": (
            "questions and chat requests over the Python documentation (python3.11-doc)",
            "over the Python documentation (apt-get install python3.11-doc), alternately: its "
            "FAQ's questions as they are (kind qa) and requests to explain a section of its "
            "tutorial, HOWTOs or library pages (kind conversation),",
            "which questions and sections are taken",
        ),
        "translation-prompts": (
            "German and French paragraphs to translate into English (debian-reference-de, -fr)",
            "in the form of the bench's translation task (a paragraph to put into English), "
            "over the Debian Reference's German and French paragraphs of the task's lengths "
            "(apt-get install debian-reference-de debian-reference-fr), alternately,",
            "which paragraphs are taken",
        ),
    }
    for name, (summary, form, seed_help) in prompt_kinds.items():
        prompts = kinds.add_parser(
            name,
            help=summary,
            description=f"Writes --count prompts {form} as .jsonl records with kind, prompt "
            "and source. Files the bench's task sets quote are left out. Then: quickdraft data "
            "regenerate --target MODEL --prompts OUT --out REPLIES.jsonl",
        )
        prompts.add_argument(
            "--out", dest="out_file", type=Path, required=True, help="the .jsonl file written"
        )
        prompts.add_argument("--count", type=_positive_int, default=500)
        prompts.add_argument("--seed", type=strict_int, default=0, help=seed_help)

    followups = kinds.add_parser(
        "followups",
        help="follow-up prompts over a target's own chats (a second user turn after its "
        "reply), for regenerate",
        description="Writes --count prompts, each a chat from --replies (one user turn and "
        "the target's reply, as data regenerate writes them) and a follow-up request chosen "
        "by its kind (tests or an explanation after code, a shorter version after a summary, "
        "...), as .jsonl records with kind, messages and source. regenerate answers them "
        "and marks the new reply, which alone is trained on. Use the target's own chats: the "
        "first reply is the context it answers from.",
    )
    followups.add_argument(
        "--replies", type=Path, nargs="+", required=True, help="chats from data regenerate"
    )
    followups.add_argument(
        "--out", dest="out_file", type=Path, required=True, help="the .jsonl file written"
    )
    followups.add_argument("--count", type=_positive_int, default=500)
    followups.add_argument(
        "--max-chars",
        type=_positive_int,
        default=1200,
        help="longest chat taken, in characters (default 1,200, about 300 tokens: the chat "
        "and the new reply fit train eagle's --max-tokens 512)",
    )
    followups.add_argument("--seed", type=strict_int, default=0, help="which chats and forms")

    regenerate = kinds.add_parser(
        "regenerate",
        help="the target's own replies to prompts, as chats for train eagle / medusa / router",
        description="Writes one chat record per prompt (the prompt's turns and the target's "
        "reply) to --out, batch by batch; run again, it skips the prompts already answered. "
        "Prompts: .jsonl with messages or prompt (and an optional kind: kinds are taken in "
        "turn, so --limit covers every kind), or one prompt per line.",
    )
    regenerate.add_argument("--target", required=True, help="the model that replies")
    regenerate.add_argument("--prompts", type=Path, required=True)
    regenerate.add_argument(
        "--out", dest="out_file", type=Path, required=True, help="the .jsonl file written"
    )
    regenerate.add_argument(
        "--answered",
        type=Path,
        nargs="+",
        default=[],
        help="earlier reply files: the prompts they answer are skipped too (a second part of "
        "a run beside a first that is kept as it is)",
    )
    regenerate.add_argument("--max-new-tokens", type=_positive_int, default=256)
    regenerate.add_argument(
        "--temperature", type=finite_float, default=0.0, help="0: greedy replies (default)"
    )
    regenerate.add_argument(
        "--batch-size",
        type=_positive_int,
        default=16,
        help="replies decoding at once (continuous batching; default 16, the fastest measured "
        "on a 2-core CPU: benchmarks/results/regenerate_rate/)",
    )
    regenerate.add_argument("--limit", type=_positive_int, default=None, help="prompts at most")
    add_quant(regenerate)
    regenerate.add_argument(
        "--int8",
        action="store_const",
        const="int8",
        dest="quant",
        help="the same as --quant int8 (kept for earlier command lines)",
    )
    regenerate.add_argument("--seed", type=strict_int, default=0)
    regenerate.add_argument("--threads", type=_threads, default=None)
    features = regenerate.add_argument_group(
        "EAGLE features",
        "with --eagle-features the target's EAGLE-3 features of every reply are stored as it is "
        "written, in the store `train eagle` reads (give it the same --context, --max-tokens, "
        "--cache and --quant): no separate extraction pass later",
    )
    features.add_argument("--eagle-features", action="store_true")
    features.add_argument(
        "--context", type=strict_int, default=None, help="as train eagle's (default: --max-tokens)"
    )
    features.add_argument("--max-tokens", type=_positive_int, default=None, help="default 512")
    features.add_argument("--cache", type=Path, default=None, help=f"default {DEFAULT_CACHE}")


def _data(args: argparse.Namespace) -> int:
    if args.data_kind == "regenerate":
        return _regenerate(args)
    if args.data_kind in ("code-prompts", "doc-prompts", "guide-prompts", "translation-prompts"):
        return _prompts(args)
    if args.data_kind == "followups":
        return _followups(args)
    return _corpus(args)


def _followups(args: argparse.Namespace) -> int:
    from quickdraft.artifacts import check_output
    from quickdraft.train.followups import followup_prompts

    check_output(args.out_file)
    if any(args.out_file.resolve() == path.resolve() for path in args.replies):
        raise ValueError(f"out: {args.out_file} is one of the replies files; give another --out")
    records = followup_prompts(args.replies, args.count, seed=args.seed, max_chars=args.max_chars)
    return _write_prompts(args, records, "follow-up prompts")


def _prompts(args: argparse.Namespace) -> int:
    from quickdraft.artifacts import check_output
    from quickdraft.bench.tasks import TASK_DIR
    from quickdraft.train.guide_prompts import guide_prompts
    from quickdraft.train.sources import code_prompts, document_prompts
    from quickdraft.train.translation_prompts import translation_prompts

    check_output(args.out_file)
    make = {"code-prompts": code_prompts, "doc-prompts": document_prompts,
            "guide-prompts": guide_prompts,
            "translation-prompts": translation_prompts}[args.data_kind]  # fmt: skip
    return _write_prompts(args, make(args.count, task_dir=TASK_DIR, seed=args.seed), "prompts")


def _write_prompts(args: argparse.Namespace, records: list[dict], what: str) -> int:
    """``records`` as --out's JSONL lines, and one line saying how many of --count."""
    import json

    from quickdraft.artifacts import written_whole

    args.out_file.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(args.out_file) as partial:
        partial.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    note = "" if len(records) == args.count else f" (all there are; {args.count:,} asked)"
    console.print(f"wrote {args.out_file}: {len(records):,} {what}{note}")
    return 0


def _regenerate(args: argparse.Namespace) -> int:
    import torch
    from rich.progress import Progress

    from quickdraft.artifacts import check_output
    from quickdraft.config import SamplingParams
    from quickdraft.models.loading import load_model
    from quickdraft.train.replies import answered, read_prompts, regenerate

    check_output(args.out_file)
    if args.out_file.resolve() == args.prompts.resolve():
        raise ValueError(f"out: {args.out_file} is the prompts file; give another --out")
    _check_feature_flags(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    prompts = read_prompts(args.prompts)[: args.limit]
    # Everything a run could refuse is refused before the model loads (minutes on the 1.5B):
    # the sampling settings, and the files holding replies already written.
    sampling = SamplingParams(
        temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed
    )
    for path in args.answered:
        if not path.is_file():
            raise ValueError(f"answered: {path} is not a file")
        answered(path, repair=False, option="answered")
    answered(args.out_file, repair=False)
    model, tokenizer = load_model(args.target, quant=args.quant)
    recorder = _feature_recorder(args, model) if args.eagle_features else None
    sampling = dataclasses.replace(sampling, stop_token_ids=tokenizer.eos_token_ids)
    with (
        _terminate_as_interrupt(),
        Progress(*_progress_columns(), console=console, transient=True) as progress,
    ):
        task = progress.add_task("replies", total=len(prompts))
        lines = LogLines()

        def replied(done: int, total: int, tokens: int, seconds: float) -> None:
            rate = f"{tokens / seconds:,.0f} tokens/s" if seconds > 0 else "starting"
            progress.update(task, completed=done, description=f"replies ({rate})")
            lines("replies", done, total, f", {rate}")

        counts = regenerate(
            model, tokenizer, prompts, args.out_file, sampling, name=args.target,
            batch_size=args.batch_size, progress=replied, features=recorder,
            answered_in=tuple(args.answered),
        )  # fmt: skip
    rate = counts["tokens"] / counts["seconds"] if counts["seconds"] else 0.0
    console.print(
        f"wrote {args.out_file}: {counts['answered']:,} replies ({counts['tokens']:,} tokens, "
        f"{rate:,.1f} tokens/s); {counts['skipped']:,} were there already"
    )
    if recorder is not None:
        console.print(
            f"stored the EAGLE features of {counts['features']:,} replies in {recorder.folder}"
        )
    if counts["repeated"]:
        console.print(
            f"left out {counts['repeated']:,} further copies of repeated prompts (greedy: "
            "each copy would get the same reply)"
        )
    if counts["too_long"]:
        console.print(
            f"left out {counts['too_long']:,} prompts longer than the model's context "
            f"({model.max_positions:,} tokens)"
        )
    return 0


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (``kill``; a background job, for which the shell ignores Ctrl-C's SIGINT) ends
    the run as Ctrl-C does: through the ``finally`` blocks, so the replies' features saved so
    far are written and nothing the output file holds is lost."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _check_feature_flags(args: argparse.Namespace) -> None:
    """--context, --max-tokens and --cache belong to --eagle-features; checked before loading."""
    if not args.eagle_features:
        for flag in ("context", "max_tokens", "cache"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')}: only with --eagle-features")
        return
    args.max_tokens = 512 if args.max_tokens is None else args.max_tokens
    args.cache = DEFAULT_CACHE if args.cache is None else args.cache
    if args.max_tokens < 2:
        raise ValueError(f"--max-tokens must be >= 2, got {args.max_tokens}")
    args.context = args.max_tokens if args.context is None else args.context
    if args.context < 0:
        raise ValueError(f"--context must be >= 0, got {args.context}")


def _feature_recorder(args: argparse.Namespace, model):
    """The recorder of EAGLE-3 features for ``train eagle`` with the same settings."""
    from quickdraft.drafters.eagle.net import EagleConfig
    from quickdraft.models.llama import LlamaRunner
    from quickdraft.train.eagle_features import FeatureRecorder, store_folder

    if not isinstance(model, LlamaRunner):
        raise ValueError(f"--eagle-features: needs the native runner, got {type(model).__name__}")
    context = args.context
    layers = EagleConfig.for_target(model.config, "eagle3", 1).feature_layers
    folder = store_folder(args.cache, args.target, context, layers, args.quant)
    return FeatureRecorder(model.vocab_size, layers, folder, context, args.max_tokens)


def _corpus(args: argparse.Namespace) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn

    from quickdraft.bench.tasks import TASK_DIR
    from quickdraft.train.sources import build_corpus

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), console=console, transient=True
    ) as progress:
        bar = progress.add_task("reading", total=None)

        def advance(kind: str, files: int) -> None:
            progress.update(bar, description=f"{kind}: {files:,} files")

        manifest = build_corpus(
            args.out,
            tuple(args.sources),
            args.max_chars,
            task_dir=TASK_DIR,
            seed=args.seed,
            progress=advance,
        )
    for kind, row in manifest["sources"].items():
        console.print(
            f"{kind}: {row['files']:,} of {row['of']:,} files, {row['chars']:,} characters"
        )
    console.print(f"wrote {args.out / 'corpus.jsonl'} (sha256 {manifest['sha256'][:16]}...)")
    return 0
