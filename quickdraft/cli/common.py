"""What every command module shares: the console, argument types, and loading a target with
its drafter."""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from quickdraft.config import SpecConfig
    from quickdraft.models.base import Model
    from quickdraft.models.tokenizer import HFTokenizer
    from quickdraft.train.common import Scaling

# Wide enough for the tables when the output is a file or a pipe (rich assumes 80 columns).
console = Console(width=None if sys.stdout.isatty() else 120)
# Progress in a log goes to stderr, so that stdout stays the result (--json).
log_console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)


def strict_int(text: str) -> int:
    """An integer written in ASCII digits (a sign allowed), no spaces, at most 18 digits: int()
    alone would take ' 5', '1_000' and other scripts' digits, and ten thousand digits."""
    if not re.fullmatch(r"[-+]?[0-9]{1,18}", text):
        raise argparse.ArgumentTypeError(f"expected an integer in ASCII digits, got {text!r}")
    return int(text)


def finite_float(text: str) -> float:
    """A finite decimal number (nan and inf refused), in ASCII, no spaces."""
    if not re.fullmatch(r"[-+]?([0-9]{1,18}(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]{1,3})?", text):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = strict_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = strict_int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _threads(text: str) -> int:
    """A torch thread count: 1..1024."""
    value = strict_int(text)
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"must be in 1..1024, got {value}")
    return value


def auto_method(target: str, draft: str | None = None, backend: str = "auto") -> str:
    """The method ``auto`` means: draft_model with a draft; EAGLE where a drafter ships for
    the target alias and the native runner serves it (the fastest method in the bench where
    one ships: ``benchmarks/results/defaults.md``); else
    prompt lookup, which needs nothing trained. A shipped drafter whose config says
    ``"auto": false`` is left to ``--method eagle`` (``drafters.eagle.io.offered_by_auto``)."""
    from quickdraft.drafters.eagle.io import ARTIFACTS, offered_by_auto

    if draft:
        return "draft_model"
    shipped = {folder.name for folder in ARTIFACTS.iterdir() if offered_by_auto(folder)}
    return "eagle" if target in shipped and backend != "hf" else "ngram"


def load_speculation(
    target_name: str,
    spec: SpecConfig,
    draft_name: str | None,
    *,
    device: str,
    backend: str,
    draft_int8: bool,
    quant: str | None = None,
) -> tuple[Model, HFTokenizer, Model | None, HFTokenizer | None]:
    """The target (``quant``: its weights quantized, ``load_model``) and its tokenizer, and
    the draft model and its tokenizer when ``spec``'s method takes one (int8 weights on the
    native CPU runner when ``draft_int8``), else None: what ``Engine.from_spec`` and
    ``generate`` build the drafter from."""
    from quickdraft.drafters import registry
    from quickdraft.models.loading import load_model

    entry = registry.get(spec.method)
    registry.check_draft(entry, draft_name is not None)
    target, tokenizer = load_model(target_name, device=device, backend=backend, quant=quant)
    if draft_name is None:
        return target, tokenizer, None, None
    int8 = draft_int8 and device == "cpu" and backend != "hf"
    draft, draft_tokenizer = load_model(draft_name, device=device, backend=backend, int8=int8)
    return target, tokenizer, draft, draft_tokenizer


def add_quant(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quant",
        choices=["int8", "q4"],
        default=None,
        help="the target's weights quantized on CPU: int8, or q4 (4-bit weights, int8 "
        "activations, the compiled kernel this CPU runs); speculation stays exact with respect "
        "to the quantized target, and the load checks it against its float original",
    )


def _progress_columns() -> tuple:
    from rich.progress import BarColumn, TextColumn, TimeRemainingColumn

    return (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeRemainingColumn(),
    )


class LogLines:
    """Progress as plain lines where rich shows no bar (output to a log file or a pipe, as a
    background run's is): a stage's first report, then one every ``every`` seconds, and its
    last, each with the time left at the rate since the line before (a run paused with
    SIGSTOP in between is not counted as slow ever after). Silent on a terminal."""

    def __init__(self, console: Console = log_console, every: float = 60.0):
        self.console, self.every = console, every
        self.last: dict[str, tuple[float, int]] = {}  # stage: time and count of its last line

    def __call__(self, stage: str, done: int, total: int, note: str = "") -> None:
        if self.console.is_terminal:
            return
        now = time.monotonic()
        if stage not in self.last:
            self.last[stage] = (now, done)
            self.console.print(f"{stage}: {done:,}/{total:,}{note}")
            return
        then, before = self.last[stage]
        if now - then < self.every and done < total:
            return
        self.last[stage] = (now, done)
        rate = (done - before) / max(now - then, 1e-9)
        left = ""
        if rate > 0 and done < total:
            left = f", about {_duration((total - done) / rate)} left"
        self.console.print(f"{stage}: {done:,}/{total:,} ({done / max(total, 1):.0%}){note}{left}")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def _stages(progress: Any) -> Callable[[str, int, int], None]:
    """A progress callback (stage, done, total) with one bar per stage (lines in a log)."""
    tasks: dict[str, int] = {}
    lines = LogLines()

    def advance(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = progress.add_task(stage, total=total)
        progress.update(tasks[stage], completed=done)
        lines(stage, done, total)

    return advance


# Training runs' features and checkpoints (``quickdraft train ... --cache``).
DEFAULT_CACHE = Path.home() / ".cache" / "quickdraft" / "train"


def _add_scaling(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--accumulation-steps",
        type=_positive_int,
        default=1,
        help="cut each process's share of a batch into N pieces, one backward pass each "
        "(less memory; the same result)",
    )
    parser.add_argument(
        "--mixed-precision",
        choices=["auto", "no", "bf16", "fp16"],
        default="auto",
        help="precision of the training passes (auto: bf16 on a GPU that has it, else full)",
    )


def _scaling(args: argparse.Namespace) -> tuple[Scaling, bool]:
    """The run's scaling, and whether this process is the one that writes and reports."""
    from quickdraft.train.common import Scaling, running_processes

    scaling = Scaling(args.accumulation_steps, args.mixed_precision)
    return scaling, running_processes().is_main_process
