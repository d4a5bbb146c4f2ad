"""What the serving benchmarks share: a `quickdraft serve` process on a free loopback port,
its Prometheus gauges, and the chat prompts of the bench's task sets."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from quickdraft.bench.tasks import TASK_KINDS, TaskItem, load_tasks


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def server(target: str, *options: str, log: str) -> Iterator[str]:
    """A `quickdraft serve` subprocess; yields its base URL once /health answers. Its output
    goes to ``log``; it gets SIGTERM at the end and must exit 0."""
    port = free_port()
    command = [sys.executable, "-m", "quickdraft", "serve", "--target", target]
    command += ["--port", str(port), "--log-level", "warning", *options]
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while not healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start; see {log}")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        code = process.wait(120)
        if code != 0:
            raise RuntimeError(f"the server exited {code} after SIGTERM; see {log}")


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def gauges(url: str) -> dict[str, float]:
    """Every unlabelled sample of /metrics by name."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def task_items(count: int) -> list[TaskItem]:
    """``count`` items of the bench's task sets (prompts the shipped drafters were not trained
    on), the seven task kinds in turn."""
    tasks = load_tasks(TASK_KINDS, None)
    items = [item for group in zip(*tasks.values(), strict=False) for item in group]
    return (items * (count // len(items) + 1))[:count]


def write(path_stem, payload: dict, markdown: list[str]) -> None:
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    path_stem.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    path_stem.with_suffix(".md").write_text("\n".join(markdown) + "\n")
