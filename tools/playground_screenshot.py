"""The README's picture of the playground: `quickdraft serve` on a real model (SmolLM2-135M and
its EAGLE drafter by default), a race of plain decoding against the served method on one chat
prompt at temperature 0, a step of the answer selected, the whole page saved as a PNG.

    python tools/playground_screenshot.py [--target smollm2-135m] [--out docs/playground_race.png]

Needs the ``playwright`` package and a Chromium (Debian's ``chromium``, or --chromium PATH).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Write a Python function that checks whether a string is a palindrome."
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"quickdraft serve exited with {server.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("quickdraft serve did not come up")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "playground_race.png")
    parser.add_argument("--chromium", default=shutil.which("chromium"))
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.chromium is None:
        raise SystemExit("--chromium: no Chromium found (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "quickdraft", "serve", "--target", args.target]
    command += ["--port", str(port), "--threads", str(args.threads), "--log-level", "warning"]
    server = subprocess.Popen(command, cwd=ROOT)
    try:
        wait_healthy(url, server)
        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            page.goto(url + "/")
            page.wait_for_function("document.querySelectorAll('#method option').length > 1")
            page.fill("#prompt", PROMPT)
            page.fill("#max-tokens", str(args.max_tokens))
            page.click("#race")
            page.wait_for_selector("#race-result[data-identical]", timeout=600_000)
            steps = page.eval_on_selector_all("#pane-main .step", "s => s.length")
            page.hover(f"#pane-main .step[data-step='{min(3, steps - 1)}']")
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out), full_page=True)
            print(page.inner_text("#race-result"))
            browser.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
