"""One line naming the machine a benchmark ran on, for every results file."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, or "unknown CPU" where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def describe_machine() -> str:
    """Architecture, CPU model and torch version: "x86_64, AMD EPYC 7B13, torch 2.13.0+cpu"."""
    return f"{platform.machine()}, {cpu_name()}, torch {torch.__version__}"
