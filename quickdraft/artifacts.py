"""Reading the files quickdraft did not just write: every failure names the file and what to do;
and writing files whole (``written_whole``; the safetensors files others read:
``write_safetensors``).

A truncated download, a half-written checkpoint or a folder from another version should end in
one line such as ``drafter.safetensors: truncated or not a safetensors file (...); re-export the
drafter``, never in a library's traceback about a byte offset. Each reader raises
``ArtifactError``, a ValueError, so the CLI prints it as one line and the API raises it as any
other bad input.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch


class ArtifactError(ValueError):
    """A file quickdraft reads is missing, corrupt or does not fit what it is used with."""

    def __init__(self, path: str | Path, problem: str, remedy: str):
        super().__init__(f"{path}: {problem}; {remedy}")


def read_json(path: str | Path, remedy: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A JSON object holding at least the ``required`` keys."""
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(path, "missing", remedy) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ArtifactError(path, f"not readable JSON ({brief(error)})", remedy) from None
    if not isinstance(record, dict):
        raise ArtifactError(path, f"holds a {type(record).__name__}, not a JSON object", remedy)
    missing = [key for key in required if key not in record]
    if missing:
        raise ArtifactError(path, f"lacks the key(s) {', '.join(missing)}", remedy)
    return record


def build(path: str | Path, remedy: str, factory: Any, fields: Any) -> Any:
    """``factory(**fields)`` for a config read from ``path``: unknown, missing or invalid
    fields name the file."""
    if not isinstance(fields, dict):
        raise ArtifactError(path, f"expected an object of settings, got {fields!r}", remedy)
    try:
        return factory(**fields)
    except (TypeError, ValueError) as error:
        raise ArtifactError(path, f"invalid settings ({brief(error)})", remedy) from None


def read_safetensors(path: str | Path, remedy: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise ArtifactError(path, "missing", remedy)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        problem = f"truncated or not a safetensors file ({brief(error)})"
        raise ArtifactError(path, problem, remedy) from None


def write_safetensors(
    path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """``tensors`` as a safetensors file at ``path`` that any user may read whom the umask
    lets read the files beside it (a drafter, an export, a shortlist, a quantized model).
    safetensors 0.8's own ``save_file`` creates every file with mode 0600 (it writes through a
    private temporary file), so an export served by vLLM or SGLang under another user, in a
    container for instance, could not be opened. Written to a partial file, given the umask's
    mode, then renamed: a reader never sees half a file, and an interrupted write (an
    exception, Ctrl-C) leaves nothing behind. OSError (a full or read-only folder) is raised."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(path) as partial:
        save_file({name: t.contiguous() for name, t in tensors.items()}, str(partial), metadata)
        partial.chmod(_umask_mode(path.parent))


def _umask_mode(folder: Path) -> int:
    """The mode a new file in ``folder`` gets from the umask (found by making one, so the
    process's umask is never changed, not even for a moment)."""
    probe = folder / f".mode-{partial_suffix()}"
    try:
        probe.touch()
        return probe.stat().st_mode & 0o777
    finally:
        probe.unlink(missing_ok=True)


def read_checkpoint(
    path: str | Path, remedy: str, *, trusted: bool = False, mmap: bool = False
) -> Any:
    """``torch.load`` of a file quickdraft wrote; ``trusted`` allows pickled Python objects
    (training checkpoints hold optimizer state and settings); ``mmap``: tensors paged in from
    the file as they are read."""
    path = Path(path)
    try:
        return torch.load(path, weights_only=not trusted, mmap=mmap)
    except FileNotFoundError:
        raise ArtifactError(path, "missing", remedy) from None
    except Exception as error:
        raise ArtifactError(path, f"corrupt or truncated ({brief(error)})", remedy) from None


def load_state(path: str | Path, module: torch.nn.Module, state: dict, remedy: str) -> None:
    """``module.load_state_dict(state)``: missing, unexpected or misshapen tensors (weights
    that disagree with their config, such as a different head count) name the file."""
    try:
        module.load_state_dict(state)
    except RuntimeError as error:
        detail = " ".join(str(error).split())
        detail = detail if len(detail) <= 240 else detail[:237] + "..."
        raise ArtifactError(path, f"weights do not fit its config ({detail})", remedy) from None


def check_output(path: str | Path | None, *, folder: bool = False) -> None:
    """Before any compute: ``path`` can be written. A file output must not be an existing
    folder; a folder output must not be an existing file; the parent must be a folder."""
    if path is None:
        return
    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        raise ValueError(f"out: {path} exists and is not a folder")
    if not folder and path.is_dir():
        raise ValueError(f"out: {path} is a folder; give a file name")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"out: {parent} is not a folder")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"out: {parent} is not writable")


@contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """A partial file beside ``path`` (``NAME.partial-HOST-PID``) for the block to write: it
    replaces ``path`` when the block ends, so a reader never sees half a file, and is removed
    when the block raises (an exception, Ctrl-C), leaving ``path`` as it was."""
    partial = path.with_name(f"{path.name}.partial-{partial_suffix()}")
    try:
        yield partial
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


def partial_suffix() -> str:
    """``HOST-PID`` of this process, for the name of a file or folder being written."""
    return f"{socket.gethostname()}-{os.getpid()}"


def remove_stale_partials(folder: Path, pattern: str) -> None:
    """Delete leftovers ``pattern`` (a glob ending in ``partial_suffix``) of processes of this
    host that are gone: an interrupted conversion must not keep its half-written copy
    forever. Another host's are left alone (a cache on a shared disk)."""
    host = socket.gethostname()
    for stale in folder.glob(pattern):
        owner, _, pid = stale.name.rpartition("-")
        # ".partial-PID" is what earlier versions wrote, always on this host's own cache.
        ours = owner.endswith((f".partial-{host}", ".partial"))
        if not ours or not pid.isdecimal():
            continue  # another host's, or not ours to judge
        if int(pid) == os.getpid() or _alive(int(pid)):
            continue  # still being written
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def brief(error: BaseException) -> str:
    """The first line of an error's message, at most 160 characters."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text if len(text) <= 160 else text[:157] + "..."
