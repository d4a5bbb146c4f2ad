"""What every command module shares: the console and argument types."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

# Wide enough for the tables when the output is a file or a pipe (rich assumes 80 columns).
console = Console(width=None if sys.stdout.isatty() else 120)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _threads(text: str) -> int:
    """A torch thread count: 1..1024."""
    value = int(text)
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"must be in 1..1024, got {value}")
    return value
