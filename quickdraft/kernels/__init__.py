"""Compiled CPU kernels, built from the sources beside this file at first use.

``superblock.cpp``: the 4-bit (and 8-bit) linear layer (``kernels.superblock``).
``groups.cpp``: the per-group weight quantizer it starts from (``kernels.groups``).
``attention.cpp``: attention one query at a time over exactly its own keys
(``models.attention.attend_each``), the same bits whatever else a pass holds. ``layer.cpp``: a
quantized model's decoder layers in one call (``models.fused``). ``native()`` compiles
them once per environment (``kernels.build``: sources, torch, Python prefix, compiler, flags)
into the user's cache (``$QUICKDRAFT_CACHE``, else ``~/.cache/quickdraft``) with the compiler
and ninja the machine has, under a lock that dies with its process, and loads them as
``torch.ops.quickdraft_kernels``. ``make demo`` builds them while installing, so the first
generation does not wait. A host that cannot build them (no compiler, no ninja) gets one
warning and PyTorch paths: the 4-bit reference (the same bits, slower) and batched attention.

    python -m quickdraft.kernels    # build now; print the path this CPU runs
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

import torch

from quickdraft.kernels import build

EXTENSION = build.Extension(
    name="quickdraft_kernels",
    sources=tuple(
        Path(__file__).with_name(name)
        for name in ("groups.cpp", "superblock.cpp", "attention.cpp", "layer.cpp")
    ),
    headers=tuple(
        Path(__file__).with_name(name)
        for name in (
            "simd.h",
            "entry.h",
            "superblock.h",
            "superblock_tiles.h",
            "superblock_tile256.inc",
        )
    ),
    cflags=("-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno"),
    ldflags=("-fopenmp",),
)
# Which code path runs the 4-bit product: the compiled kernel's instruction sets, best first,
# then the PyTorch reference (``kernels.superblock.reference``), which every CPU runs.
# avx-vnni: 256-bit vectors with vpdpbusd (AVX-VNNI on Intel's client CPUs; on a CPU with
# AVX-512 VNNI the same tile in its EVEX form). Every path gives a row the same bits.
PATHS = {"avx512-vnni": 1, "avx-vnni": 3, "avx2": 2}
REFERENCE = "pytorch"
# Names a path to run instead of the fastest (``QUICKDRAFT_Q4_PATH=avx2``): how a benchmark
# measures an AVX2-only host's kernels on a CPU that has more.
PATH_VARIABLE = "QUICKDRAFT_Q4_PATH"


def cache_root() -> Path:
    """``$QUICKDRAFT_CACHE``, else ``~/.cache/quickdraft``."""
    return Path(os.environ.get("QUICKDRAFT_CACHE") or Path.home() / ".cache" / "quickdraft")


def cache_dir() -> Path:
    """This environment's build folder (``kernels.build``: keyed by sources, torch, the Python
    environment, compiler and flags)."""
    return EXTENSION.folder(cache_root())


@functools.cache
def native() -> bool:
    """Whether the compiled kernels are loaded (building them first if need be)."""
    if hasattr(torch.ops.quickdraft_kernels, "superblock_linear"):
        return True
    wait = build.wait_seconds()  # a malformed $QUICKDRAFT_KERNEL_WAIT is the user's error
    try:
        folder = build.build(EXTENSION, cache_root(), wait)
    except Exception as error:  # no compiler, no ninja, a failed build, a held lock: all end so
        warnings.warn(
            f"compiled kernels could not be built ({_reason(error)}); 4-bit layers use "
            "the PyTorch reference path (same results, slower)",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    build.sweep(folder)
    return True


def _reason(error: Exception) -> str:
    """The line of a build failure that says why: the compiler's first error, else the
    exception's first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [repr(error)]
    return next((line for line in lines if ": error:" in line), lines[0])[:300]


@functools.cache
def best_path() -> str:
    """The fastest 4-bit path this host runs (``avx512-vnni``, ``avx-vnni``, ``avx2`` or
    ``pytorch``), or the one ``$QUICKDRAFT_Q4_PATH`` names (ValueError if this host cannot run
    it)."""
    chosen = os.environ.get(PATH_VARIABLE, "auto")
    if chosen != "auto":
        try:
            return check_path(chosen)
        except ValueError as error:
            raise ValueError(f"{PATH_VARIABLE}: {error}") from None
    if not native():
        return REFERENCE
    code = int(torch.ops.quickdraft_kernels.best_path())
    return next((name for name, value in PATHS.items() if value == code), REFERENCE)


def runnable_paths() -> list[str]:
    """Every 4-bit path this host can run, the reference last."""
    if not native():
        return [REFERENCE]
    ops = torch.ops.quickdraft_kernels
    return [name for name, code in PATHS.items() if ops.supported(code)] + [REFERENCE]


def check_path(path: str) -> str:
    """``path``, if this host runs it; a ValueError naming the field otherwise."""
    if path == "auto":
        return best_path()
    runnable = runnable_paths()
    if path not in runnable:
        known = ", ".join(["auto", *PATHS, REFERENCE])
        if path not in (*PATHS, REFERENCE):
            raise ValueError(f"q4 path: {path!r} is not one of {known}")
        raise ValueError(f"q4 path: this CPU cannot run {path!r} (it runs {', '.join(runnable)})")
    return path


@functools.cache
def attention_path() -> int:
    """The compiled attention kernel's instruction set for this CPU (1: AVX-512, 2: AVX2), or
    0 where there is none."""
    return {"avx512-vnni": 1, "avx-vnni": 2, "avx2": 2}.get(best_path(), 0)


def describe_weights(quant: str | None, layout: str | None = None) -> str:
    """How a target's weights are stored and which kernel multiplies them, for reports:
    "float", "q4 (avx512-vnni)", "q4 superblock (avx512-vnni)", "int8 groups (avx2)"."""
    if quant is None:
        return "float"
    return f"{quant}{'' if layout is None else ' ' + layout} ({best_path()})"
