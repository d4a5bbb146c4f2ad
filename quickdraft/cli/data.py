"""`quickdraft data ...`: training text built from what the machine has."""

from __future__ import annotations

import argparse
from pathlib import Path

from quickdraft.cli.common import _positive_int, console


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
    corpus.add_argument("--seed", type=int, default=0, help="the order files are taken in")


def _data(args: argparse.Namespace) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn

    from quickdraft.vocab.sources import build_corpus

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), console=console, transient=True
    ) as progress:
        bar = progress.add_task("reading", total=None)

        def advance(kind: str, files: int) -> None:
            progress.update(bar, description=f"{kind}: {files:,} files")

        manifest = build_corpus(
            args.out, tuple(args.sources), args.max_chars, seed=args.seed, progress=advance
        )
    for kind, row in manifest["sources"].items():
        console.print(
            f"{kind}: {row['files']:,} of {row['of']:,} files, {row['chars']:,} characters"
        )
    console.print(f"wrote {args.out / 'corpus.jsonl'} (sha256 {manifest['sha256'][:16]}...)")
    return 0
