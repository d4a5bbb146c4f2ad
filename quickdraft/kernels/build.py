"""Building a C++ extension once per environment, safely among processes.

The build folder is keyed by everything that changes what the compiler produces or where the
build file points: the sources, torch's version and include paths, the Python environment's
prefix and include path, the compiler (its path and version line) and the flags. Two virtual
environments on one machine so get two folders and never rebuild each other's kernels; every
process with the same key reuses the one finished build.

One process builds or loads a folder at a time, under an OS file lock (``flock``) on
``build.lock``: the kernel releases it when its process dies, however it dies, so a killed
build never blocks a later one. The lock file records the holder's pid, host and start time
for the one line a waiting process prints. torch's own lock file (``lock``, a create-exclusive
file that outlives a killed build and makes ``cpp_extension.load`` spin forever) is removed
while the lock is held: no live build can own it then. A wait gives up after ``wait_seconds``
with ``LockTimeout`` naming the lock.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

try:
    import fcntl
except ImportError:  # not a POSIX host: builds are not serialized there
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = "build.lock"
USED_NAME = "last-used"
TORCH_BATON = "lock"  # torch.utils.file_baton's file in the build folder
DEFAULT_WAIT_SECONDS = 900.0  # a cold build takes 1-9 minutes on 2 busy cores
STALE_SECONDS = 14 * 24 * 3600  # other keys' folders unused this long are removed
COMPILING = "compiling quickdraft kernels once for this environment, about a minute"


class LockTimeout(RuntimeError):
    """Another live process held the build lock for longer than the wait allows."""


@dataclass(frozen=True, slots=True)
class Extension:
    """name: the library's name (``torch.ops.<name>``). sources: its C++ files; headers: files
    they include (part of the key, not compiled). cflags/ldflags: the compiler's flags."""

    name: str
    sources: tuple[Path, ...]
    headers: tuple[Path, ...] = ()
    cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()

    def key(self) -> str:
        """A digest of everything the build depends on (module docstring)."""
        from torch.utils import cpp_extension

        digest = hashlib.sha256()
        for path in (*self.sources, *self.headers):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        parts = [
            self.name,
            torch.__version__,
            sys.prefix,
            os.path.realpath(sys.executable),  # python and python3 in a venv: one interpreter
            sysconfig.get_paths()["include"],
            *cpp_extension.include_paths(),
            *compiler_identity(os.environ.get("CXX", "c++")),
            *self.cflags,
            "--",
            *self.ldflags,
        ]
        digest.update("\0".join(parts).encode())
        return digest.hexdigest()[:16]

    def folder(self, root: Path) -> Path:
        version = torch.__version__.replace("+", "-")
        return root / "kernels" / f"{version}-{self.key()}"


@functools.cache
def compiler_identity(name: str) -> tuple[str, str]:
    """The C++ compiler ``name`` (what ``cpp_extension`` runs: $CXX, else c++): its resolved
    path and the first line of its ``--version``, so an upgraded or switched compiler gets a
    folder of its own. Once per process."""
    path = shutil.which(name) or name
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=20, check=False
        )
        first = (done.stdout.splitlines() or ["?"])[0]
    except (OSError, subprocess.SubprocessError):
        first = "unavailable"
    return os.path.realpath(path), first


def wait_seconds() -> float:
    """How long to wait for another process's build: ``$QUICKDRAFT_KERNEL_WAIT`` seconds,
    else ``DEFAULT_WAIT_SECONDS``."""
    text = os.environ.get("QUICKDRAFT_KERNEL_WAIT")
    if text is None:
        return DEFAULT_WAIT_SECONDS
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"QUICKDRAFT_KERNEL_WAIT: {text!r} is not a number of seconds") from None
    if not value >= 0:
        raise ValueError(f"QUICKDRAFT_KERNEL_WAIT must be >= 0 seconds, got {text!r}")
    return value


def say(line: str) -> None:
    print(f"quickdraft: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def locked(
    path: Path, wait: float, notice: Callable[[str], None] = say, poll: float = 0.2
) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if need be). If another live process
    holds it, print one line naming the holder and ``path``'s folder, then poll for up to
    ``wait`` seconds; past that, raise LockTimeout naming ``path``."""
    if fcntl is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline, told = time.monotonic() + wait, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _same_file(fd, path):
                    break
                # ``sweep`` removed the folder while we waited: this lock guards nothing.
                os.close(fd)
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except BlockingIOError:
                if not told:
                    notice(
                        f"waiting for another process ({holder(path)}) to build the kernels "
                        f"in {path.parent}"
                    )
                    told = True
                if time.monotonic() >= deadline:
                    raise LockTimeout(
                        f"gave up after {wait:.0f} s waiting for the kernel build lock {path} "
                        f"({holder(path)}); set QUICKDRAFT_KERNEL_WAIT to wait longer"
                    ) from None
                time.sleep(poll)
        os.ftruncate(fd, 0)
        stamp = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}"
        os.pwrite(fd, stamp.encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _same_file(fd: int, path: Path) -> bool:
    """Whether the open ``fd`` is still the file at ``path``."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def holder(path: Path) -> str:
    """The lock's record of who holds it ("pid N on HOST since T"), or "unknown holder"."""
    try:
        return path.read_text().strip() or "unknown holder"
    except OSError:
        return "unknown holder"


def build(extension: Extension, root: Path, wait: float, verbose: bool = False) -> Path:
    """Compile ``extension`` into its keyed folder under ``root`` unless it is built there, and
    load it (``torch.ops.<name>``). Returns the folder. Raises LockTimeout or the build's own
    error."""
    from torch.utils import cpp_extension

    folder = extension.folder(root)
    with locked(folder / LOCK_NAME, wait):
        # The lock is ours, so no live process is inside cpp_extension.load for this folder:
        # a baton file there was left by a build that died.
        (folder / TORCH_BATON).unlink(missing_ok=True)
        if not (folder / f"{extension.name}.so").is_file():
            say(COMPILING)
        cpp_extension.load(
            name=extension.name,
            sources=[str(path) for path in extension.sources],
            extra_cflags=list(extension.cflags),
            extra_ldflags=list(extension.ldflags),
            build_directory=str(folder),
            is_python_module=False,
            verbose=verbose,
        )
        (folder / USED_NAME).touch()
    return folder


def sweep(folder: Path, older_than: float = STALE_SECONDS) -> list[Path]:
    """Remove the sibling build folders of ``folder`` that no process has loaded for
    ``older_than`` seconds and whose lock nobody holds; returns those removed."""
    removed = []
    for other in folder.parent.iterdir():
        if other == folder or not other.is_dir():
            continue
        used = other / USED_NAME
        try:
            last = (used if used.exists() else other).stat().st_mtime
        except OSError:
            continue
        if time.time() - last <= older_than:
            continue
        quiet = locked(other / LOCK_NAME, 0, notice=lambda line: None)
        with contextlib.suppress(LockTimeout, OSError), quiet:
            # Renamed first, so no process finds the folder half removed under its name.
            doomed = other.with_name(f".removing-{other.name}-{os.getpid()}")
            other.rename(doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            removed.append(other)
    return removed
