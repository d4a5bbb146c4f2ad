"""Quantized weights kept on disk, so a model quantizes once per machine instead of at every
load (the 1.5B's 113 projections take minutes to fit, its packed weights seconds to read).

An entry is one safetensors file in the user's cache (``$QUICKDRAFT_CACHE``, else
``~/.cache/quickdraft``), ``quantized/<model>-<key>.safetensors``: each projection's packed
weights and bias per run of rows (``ops.StackedWeights``; most have one), and in the metadata
each run's layout, shape and code width and the load check's figures.
``model`` hashes the weight files (their bytes, or for large ones their path, size and
modification time) and the quantization asked for; ``key`` adds the sources of the quantizer
and kernel layouts. A changed model or a changed quantizer gets a new entry; a damaged entry
is deleted and rebuilt. An entry of the same model that another quickdraft's sources made,
and that no load has read for a day (``STALE_SECONDS``), is deleted when a new one is written
(entries named the older way, by key alone, take the new name when their key matches and
are deleted like the others): without that, every upgrade left the 1.5B's gigabyte behind (one
development machine held 11 GB of them), while two installations of this version or later
used side by side still keep theirs (an older one, which does not mark what it reads, may
quantize again after a day).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import mmap
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from quickdraft import kernels
from quickdraft.artifacts import write_safetensors
from quickdraft.kernels import groups, superblock
from quickdraft.models import int8 as int8_ops
from quickdraft.models.ops import Linear, QuantWeights, StackedWeights, layout_of, parts_of

# Each layout's weights (``ops.LAYOUTS``), by the name an entry stores.
WEIGHTS = {"superblock": superblock.SuperWeights, "groups": groups.GroupWeights}

# What the packed bytes depend on besides the weights: the quantizers, the layouts, the policy.
SOURCES = [
    Path(superblock.__file__),
    Path(groups.__file__),
    Path(kernels.__file__).with_name("groups.cpp"),
    Path(kernels.__file__).with_name("superblock.cpp"),
    Path(kernels.__file__).with_name("superblock.h"),  # a record's bytes
    Path(__file__).with_name("ops.py"),  # which codes a layer gets ...
    Path(__file__).with_name("exact.py"),  # ... from a quantized file
    Path(__file__).with_name("llama.py"),  # the head's bits, the layouts tried
    Path(__file__).with_name("gguf.py"),  # a GGUF's blocks read as codes
]


STALE_SECONDS = 24 * 3600


# Weights of up to this size in all are known by their bytes (and their folder's config.json),
# larger ones by path, size and time (hashing the 1.5B's 6 GB at every load would cost
# seconds): a small model saved again with the same weights, as every test run saves its tiny
# models, finds its entry instead of leaving one more behind.
CONTENT_BYTES = 64 * 2**20


def cache_path(
    weight_files: Sequence[Path], quant: str, exact_only: bool, blocks: bool = False
) -> Path:
    """The entry for these weight files and quantization; ``blocks``: the codes come from a
    GGUF's own blocks (``gguf.BlockSource``), which an entry fitted without them differs
    from."""
    digest = hashlib.sha256()
    files = sorted(weight_files)
    if sum(path.stat().st_size for path in files) <= CONTENT_BYTES:
        configs = {path.with_name("config.json") for path in files}
        for path in [*files, *sorted(c for c in configs if c.is_file())]:
            with path.open("rb") as handle:
                digest.update(hashlib.file_digest(handle, "sha256").digest())
    else:
        for path in files:
            stat = path.stat()
            digest.update(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    digest.update(f"{quant}|{exact_only}|{blocks}\n".encode())
    model = digest.hexdigest()[:12]
    for source in SOURCES:
        digest.update(source.read_bytes())
    root = os.environ.get("QUICKDRAFT_CACHE") or Path.home() / ".cache" / "quickdraft"
    return Path(root) / "quantized" / f"{model}-{digest.hexdigest()[:24]}.safetensors"


@dataclass(frozen=True, slots=True)
class Stored:
    """An entry read back: the load check's figures as they were (None: there was no probe)."""

    check: int8_ops.QuantCheck | None


def load(path: Path, linears: Sequence[Linear]) -> Stored | None:
    """Give each of ``linears`` its stored weights, or None where there is no usable entry
    (the layers are then untouched)."""
    from safetensors import SafetensorError, safe_open

    path_name = kernels.best_path()
    _adopt_legacy(path)
    if not path.is_file() or path_name == kernels.REFERENCE:
        return None
    try:
        with safe_open(str(path), "pt") as handle:
            meta = json.loads(handle.metadata()["quickdraft"])
            keys = set(handle.keys())
            built: list[QuantWeights] = []
            for i, (linear, parts) in enumerate(zip(linears, meta["layers"], strict=True)):
                found = []
                for j, (layout, out, inner, bits, sub, half) in enumerate(parts):
                    packed = _fresh(handle.get_tensor(f"{i}.{j}.packed"))
                    name = f"{i}.{j}.bias"
                    bias = handle.get_tensor(name) if name in keys else None
                    form = (bits,) if layout == "groups" else (bits, sub, half)
                    found.append(WEIGHTS[layout](out, inner, path_name, packed, None, bias, *form))
                rows = sum(part.out_features for part in found)
                if linear.weight is None or tuple(linear.weight.shape) != (rows, inner):
                    raise ValueError(f"layer {i} shape")
                built.append(found[0] if len(found) == 1 else StackedWeights(tuple(found)))
    except PermissionError:  # another user's entry in a shared cache: not damaged
        return None
    except (SafetensorError, OSError, ValueError, KeyError, TypeError, RuntimeError):
        path.unlink(missing_ok=True)  # damaged or from another layout: quantize again
        return None
    for linear, weights in zip(linears, built, strict=True):
        linear.use_quantized(weights)
    with contextlib.suppress(OSError):  # a read-only cache is fine
        os.utime(path)  # read now: not stale
    check = meta.get("check")
    return Stored(None if check is None else int8_ops.QuantCheck(**check))


def _fresh(tensor: torch.Tensor) -> torch.Tensor:
    """A copy in memory torch allocated (aligned for the kernels' loads), not a view of the
    entry's file."""
    copy = torch.empty_like(tensor)
    copy.copy_(tensor)
    return copy


def save(path: Path, linears: Sequence[Linear], check: int8_ops.QuantCheck | None) -> None:
    """Store ``linears``' packed weights (written to a temporary name, then renamed, so a
    reader never sees half a file). Unless every layer has packed weights, nothing is stored."""
    layers, tensors = [], {}
    for i, linear in enumerate(linears):
        weights = linear.quantized_weights
        if weights is None:
            return
        parts = []
        for j, part in enumerate(parts_of(weights)):
            if part.packed is None:
                return
            sub = getattr(part, "sub", superblock.GROUP)
            half = getattr(part, "half", False)
            parts.append(
                (layout_of(part), part.out_features, part.in_features, part.bits, sub, half)
            )
            tensors[f"{i}.{j}.packed"] = part.packed
            if part.bias is not None:
                tensors[f"{i}.{j}.bias"] = part.bias
        layers.append(parts)
    meta = {"layers": layers, "check": None}
    if check is not None:
        meta["check"] = {
            "relative_error": check.relative_error,
            "top1_agreement": check.top1_agreement,
            "positions": check.positions,
        }
    try:
        write_safetensors(path, tensors, {"quickdraft": json.dumps(meta)})
    except OSError:  # a full or read-only cache: the next load quantizes again
        return
    remove_stale(path)


def _adopt_legacy(path: Path) -> None:
    """An entry named the way earlier versions named it (its key alone) is this one when its
    key matches: it takes the new name instead of quantizing the model again."""
    key = path.name.partition("-")[2]
    if key and not path.exists():
        with contextlib.suppress(OSError):
            path.with_name(key).replace(path)


def remove_stale(path: Path) -> None:
    """Delete the entries of ``path``'s model (its name's ``<model>-`` part) that other
    sources made and no load has read for ``STALE_SECONDS``, and entries named before names
    carried their model (``<key>.safetensors``, which no load of this version reads) as old."""
    model, dash, _ = path.name.partition("-")
    if not dash:
        return
    now = time.time()
    legacy = path.parent.glob("?" * 24 + ".safetensors")
    for other in [*path.parent.glob(f"{model}-*.safetensors"), *legacy]:
        try:
            if other != path and now - other.stat().st_mtime > STALE_SECONDS:
                other.unlink()
        except OSError:
            continue  # gone already, or not ours to delete


# Where the packed weights of a model go together: a line apart, in one region that asks the
# kernel for 2 MB pages (Linux's ``madvise``; transparent huge pages in "madvise" mode, as on
# these hosts). A decode step streams every byte of them: with 4 KB pages it walks a new page
# every 4 KB (a TLB miss each), and the 1.5B's step took 1.21x as long in 4 KB pages as in 2 MB
# ones (median of 8 pairs, the two copies swapped run by run in one process: 38.7 against 32.7
# ms; ``benchmarks/huge_pages.py``, ``results/huge_pages.md``, AMD EPYC).
ALIGN = 64
HUGE_PAGE = 2 << 20


def gather(linears: Sequence[Linear]) -> bool:
    """Move every packed weight of ``linears`` into one region advised for huge pages, in
    place: each layer's weights become views of it (its dense weight, if kept, stays). The
    same bytes, so nothing computed changes. False, and nothing moved, where the advice cannot
    be given (no Linux ``madvise``) or nothing is packed. The old copies are freed once nothing
    else holds them: a caller that caches the packed tensors (``LlamaRunner``'s fused stacks)
    drops its cache. Copying or pickling one layer's packed tensor then carries the region."""
    parts = [
        part for linear in linears if linear.quantized_weights is not None
        for part in parts_of(linear.quantized_weights) if part.packed is not None
    ]  # fmt: skip
    total = sum(-(-part.packed.numel() // ALIGN) * ALIGN for part in parts)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if total == 0 or advice is None:
        return False
    try:  # 2 MB more, so that the region can start on a 2 MB boundary
        region = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        region.madvise(advice)
    except (OSError, ValueError, AttributeError):
        return False
    memory = torch.frombuffer(region, dtype=torch.uint8)  # keeps the region alive
    at = -memory.data_ptr() % HUGE_PAGE
    moved: dict[int, torch.Tensor] = {}
    for part in parts:
        size = part.packed.numel()
        view = memory[at : at + size]
        view.copy_(part.packed)
        moved[id(part)] = view
        at += -(-size // ALIGN) * ALIGN
    for linear in linears:
        weights = linear.quantized_weights
        if weights is None:
            continue
        new = [
            dataclasses.replace(part, packed=moved[id(part)]) if id(part) in moved else part
            for part in parts_of(weights)
        ]
        found = StackedWeights(tuple(new)) if isinstance(weights, StackedWeights) else new[0]
        linear.use_quantized(found, keep_dense=True)
    return True
