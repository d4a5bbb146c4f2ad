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


def vector_isa() -> str:
    """The widest x86 vector instructions the int8 and float kernels can use here: "AVX-512
    VNNI", "AVX-512", "AVX2 VNNI", "AVX2" (int8 kernels differ between them), else "other"."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "other"
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])  # fmt: skip
    if "avx512f" in flags:
        return "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX-512"
    if "avx2" in flags:
        return "AVX2 VNNI" if "avx_vnni" in flags else "AVX2"
    return "other"


def describe_machine() -> str:
    """Architecture, CPU model, vector instructions and torch version: "x86_64, AMD EPYC 7B13,
    AVX2, torch 2.13.0+cpu"."""
    return f"{platform.machine()}, {cpu_name()}, {vector_isa()}, torch {torch.__version__}"
