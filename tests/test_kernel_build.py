"""kernels.build: one build per environment, a lock that dies with its process, a bounded wait.

The extension built here is a one-function C++ file (a second or two to compile), built in
fresh subprocesses as a new command would, into a cache under tmp_path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from quickdraft.kernels import build

pytestmark = pytest.mark.skipif(build.fcntl is None, reason="the build lock is a POSIX flock")

# A subprocess that builds the probe extension; "prefix" stands for the Python environment's
# prefix, which is what differs between two virtual environments.
BUILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from quickdraft.kernels import build

    source, root, prefix = sys.argv[1:4]
    sys.prefix = prefix
    extension = build.Extension(name="quickdraft_probe", sources=(Path(source),))
    print(build.build(extension, Path(root), wait=120.0))
    """
)

# A build that takes the lock, leaves torch's baton file as a dying build does, and is killed.
KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from quickdraft.kernels import build

    folder = Path(sys.argv[1])
    with build.locked(folder / build.LOCK_NAME, wait=0):
        (folder / build.TORCH_BATON).write_text("")
        os.kill(os.getpid(), signal.SIGKILL)
    """
)

HOLDS = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from quickdraft.kernels import build

    with build.locked(Path(sys.argv[1]), wait=0):
        print("held", flush=True)
        time.sleep(120)
    """
)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "probe.cpp"
    path.write_text('extern "C" int quickdraft_probe_value() { return 7; }\n')
    return path


def _build(source: Path, root: Path, prefix: str) -> tuple[Path, str]:
    done = subprocess.run(
        [sys.executable, "-c", BUILD, str(source), str(root), prefix],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return Path(done.stdout.strip().splitlines()[-1]), done.stderr


def test_the_key_covers_the_environment_compiler_and_flags(source, monkeypatch):
    extension = build.Extension(name="quickdraft_probe", sources=(source,))
    key = extension.key()
    assert key == extension.key()
    monkeypatch.setattr(sys, "prefix", "/elsewhere/venv")
    assert extension.key() != key
    monkeypatch.undo()
    assert build.Extension("quickdraft_probe", (source,), cflags=("-O2",)).key() != key
    monkeypatch.setenv("CXX", "/bin/true")
    assert extension.key() != key
    monkeypatch.undo()
    source.write_text(source.read_text() + "// changed\n")
    assert extension.key() != key


def test_one_environment_is_one_key_whichever_name_runs_its_python(source, tmp_path, monkeypatch):
    """A venv's ``python`` and ``python3`` (the console scripts' shebang) are one interpreter:
    one build, not one each (a fresh ``make demo`` built twice)."""
    extension = build.Extension(name="quickdraft_probe", sources=(source,))
    key = extension.key()
    alias = tmp_path / "python3"
    alias.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(alias))
    assert extension.key() == key


def test_two_environments_alternate_without_rebuilding(source, tmp_path):
    root = tmp_path / "cache"
    runs = [_build(source, root, prefix) for prefix in ("/env/a", "/env/b", "/env/a", "/env/b")]
    folders = [folder for folder, _ in runs]
    assert folders[0] == folders[2] and folders[1] == folders[3] and folders[0] != folders[1]
    compiled = [build.COMPILING in stderr for _, stderr in runs]
    assert compiled == [True, True, False, False]
    for folder in folders[:2]:
        assert (folder / "quickdraft_probe.so").is_file()
        assert (folder / build.USED_NAME).is_file()


def test_a_killed_build_never_blocks_the_next(source, tmp_path):
    root = tmp_path / "cache"
    extension = build.Extension(name="quickdraft_probe", sources=(source,))
    folder = extension.folder(root)
    folder.mkdir(parents=True)
    killed = subprocess.run([sys.executable, "-c", KILLED, str(folder)], timeout=120)
    assert killed.returncode == -signal.SIGKILL
    assert (folder / build.TORCH_BATON).exists()  # left behind, as torch leaves it
    start = time.monotonic()
    built, stderr = _build(source, root, sys.prefix)
    assert built == folder
    assert time.monotonic() - start < 120
    assert "waiting for another process" not in stderr
    assert not (folder / build.TORCH_BATON).exists()


def test_a_held_lock_times_out_naming_it(tmp_path):
    lock = tmp_path / "kernels" / "some-key" / build.LOCK_NAME
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDS, str(lock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        lines: list[str] = []
        start = time.monotonic()
        waiting = build.locked(lock, wait=0.5, notice=lines.append)
        with pytest.raises(build.LockTimeout) as raised, waiting:
            pass
        assert time.monotonic() - start < 30
        assert str(lock) in str(raised.value)
        assert f"pid {holder.pid}" in str(raised.value)
        assert len(lines) == 1
        assert lines[0].startswith("waiting for another process (pid ")
        assert str(lock.parent) in lines[0]
    finally:
        holder.kill()
        holder.wait()
    with build.locked(lock, wait=0):  # free once its holder is gone
        assert f"pid {os.getpid()}" in build.holder(lock)


def test_the_wait_bound_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_KERNEL_WAIT", "2.5")
    assert build.wait_seconds() == 2.5
    monkeypatch.setenv("QUICKDRAFT_KERNEL_WAIT", "soon")
    with pytest.raises(ValueError, match="QUICKDRAFT_KERNEL_WAIT"):
        build.wait_seconds()
    monkeypatch.delenv("QUICKDRAFT_KERNEL_WAIT")
    assert build.wait_seconds() == build.DEFAULT_WAIT_SECONDS


def test_sweep_removes_only_unused_unlocked_folders(tmp_path):
    parent = tmp_path / "kernels"
    current, old, held = (parent / name for name in ("current", "old", "held"))
    for folder in (current, old, held):
        folder.mkdir(parents=True)
        (folder / build.USED_NAME).touch()
        past = time.time() - build.STALE_SECONDS - 60
        os.utime(folder / build.USED_NAME, (past, past))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDS, str(held / build.LOCK_NAME)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert build.sweep(current) == [old]
    finally:
        holder.kill()
        holder.wait()
    assert current.is_dir() and held.is_dir() and not old.exists()
