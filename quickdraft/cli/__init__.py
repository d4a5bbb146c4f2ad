"""The `quickdraft` command line: argparse to configs to library calls, nothing more.

One module per command group; this one assembles the parser and dispatches.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path
from typing import NoReturn

from quickdraft.artifacts import check_output
from quickdraft.cli.bench import _add_bench, _bench
from quickdraft.cli.checks import _conformance, _demo, _theory
from quickdraft.cli.common import _positive_int, finite_float, strict_int
from quickdraft.cli.data import _add_data, _data
from quickdraft.cli.export import _add_export, _export
from quickdraft.cli.generate import _add_generate, _generate
from quickdraft.cli.pick import _add_pick, _pick
from quickdraft.cli.serve import _add_serve, _serve
from quickdraft.cli.train import _add_train, _train


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``quickdraft generate: error: ...`` and exit 2, without
    the usage block (``--help`` still shows it). Subcommand parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
    conformance.add_argument("--seed", type=strict_int, default=0)
    conformance.add_argument(
        "--full",
        action="store_true",
        help="every row (68: the whole temperature x top-k x top-p x k grid and every drafter "
        "variant; several minutes) instead of the default 16 (every rule with every drafter "
        "kind, about a minute)",
    )
    conformance.add_argument(
        "--alpha",
        type=finite_float,
        default=1e-3,
        help="fail a case whose p-value is below this (default 1e-3)",
    )

    theory = commands.add_parser(
        "theory", help="speedup model, optimal draft length and acceptance against KL, with plots"
    )
    theory.add_argument("--out", type=Path, required=True, help="directory for PNGs and JSON")
    theory.add_argument(
        "--draft-cost",
        type=finite_float,
        default=0.1,
        help="draft forward / target decode step (default 0.1)",
    )
    theory.add_argument(
        "--verify-slope",
        type=finite_float,
        default=0.0,
        help="extra verify cost per token, in decode steps (0: GPU-like)",
    )
    theory.add_argument(
        "--steps",
        type=_positive_int,
        default=10_000,
        help="speculative steps per draft quality (default 10000)",
    )
    theory.add_argument("--seed", type=strict_int, default=0)

    demo = commands.add_parser("demo", help="speculative generation on toy models, with stats")
    demo.add_argument("--seed", type=strict_int, default=0)

    _add_generate(commands)
    _add_serve(commands)
    _add_bench(commands)
    _add_pick(commands)
    _add_train(commands)
    _add_export(commands)
    _add_data(commands)
    return parser


def _one_line(message: object) -> str:
    return " ".join(str(message).split())


def _warning_line(message, category, filename, lineno, line=None) -> str:
    return f"warning: {_one_line(message)}\n"


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done, 1 a check failed (conformance), 2 bad input or a bad file (one line
    on stderr naming it), 130 interrupted (Ctrl-C)."""
    formatting = warnings.formatwarning
    warnings.formatwarning = _warning_line  # library warnings print as one line each
    stages = _StageLines()  # a model's loading stages, one line each (models.loading)
    loading = logging.getLogger("quickdraft.load")
    loading.addHandler(stages)
    loading.setLevel(logging.INFO)
    try:
        return _run(argv)
    finally:
        warnings.formatwarning = formatting  # as it was, for a caller in the same process
        loading.removeHandler(stages)


class _StageLines(logging.Handler):
    """``quickdraft: <message>`` on the stderr of the moment (a test's capture included)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"quickdraft: {record.getMessage()}", file=sys.stderr, flush=True)


def _run(argv: list[str] | None) -> int:
    try:
        args = _parser().parse_args(argv)
    except KeyboardInterrupt:
        return _interrupted()
    commands = {
        "conformance": _conformance,
        "theory": _theory,
        "demo": _demo,
        "generate": _generate,
        "serve": _serve,
        "bench": _bench,
        "pick": _pick,
        "train": _train,
        "export": _export,
        "data": _data,
    }
    try:
        out = vars(args).get("out")  # every --out is a folder: check it before any compute
        if out is not None:
            check_output(out, folder=True)
        return commands[args.command](args)
    except (ValueError, OSError) as error:  # OSError: a path the user gave, a full disk
        print(f"error: {_one_line(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _interrupted()


def _interrupted() -> int:
    print("interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())
