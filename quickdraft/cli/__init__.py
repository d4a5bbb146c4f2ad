"""The `quickdraft` command line: argparse to configs to library calls, nothing more.

One module per command group; this one assembles the parser and dispatches.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from quickdraft.cli.bench import _add_bench, _add_pick, _bench, _pick
from quickdraft.cli.checks import _conformance, _demo, _theory
from quickdraft.cli.common import _positive_int, console
from quickdraft.cli.generate import _add_generate, _generate
from quickdraft.cli.train import _add_export, _add_train, _export, _train


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
    _add_train(commands)
    _add_export(commands)
    return parser


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
            "train": _train,
            "export": _export,
        }
        return commands[args.command](args)
    except ValueError as error:
        console.print(f"[red]error:[/red] {error}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
