"""Debian's headless chromium driven by playwright, for the report's browser test and its screenshot.

Playwright's own browser download cannot run here (no network beyond package registries), so it always drives
`/usr/bin/chromium` (`apt-get install chromium`; `RL_CHROMIUM` points elsewhere). A missing browser is an error that
says how to install it, never a skip: a browser session that skipped would pass having tested nothing.

`python tests/chromium.py REPORT.html OUT.png [--width 1300]` writes a full-page screenshot (docs/report.png).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("RL_CHROMIUM", "/usr/bin/chromium")
# No network, no first-run or sync machinery, no updater: a page load touches nothing but the file.
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class ChromiumMissingError(RuntimeError):
    pass


def check_chromium() -> str:
    if shutil.which(CHROMIUM) is None:
        raise ChromiumMissingError(
            f"no chromium at {CHROMIUM}: install Debian's (`apt-get install -y chromium`) or set RL_CHROMIUM to a "
            "chromium binary; playwright's own browser download is not used"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        raise ChromiumMissingError(
            f"playwright is not installed ({exc}); install the extra: pip install -e '.[browser]'"
        ) from exc
    return CHROMIUM


@contextlib.contextmanager
def browser_context(width: int, height: int = 900) -> Iterator[Any]:
    """A fresh-profile chromium context with a `width` x `height` viewport."""
    from playwright.sync_api import sync_playwright

    executable = check_chromium()
    with tempfile.TemporaryDirectory(prefix="rl-chromium-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=executable, headless=True, args=ARGS, viewport={"width": width, "height": height}
        )
        try:
            yield context
        finally:
            context.close()


def screenshot(report: Path, out: Path, width: int = 1300) -> None:
    """A full-page PNG of the HTML file `report` at a `width`-pixel window."""
    with browser_context(width) as context:
        page = context.new_page()
        page.goto(Path(report).resolve().as_uri())
        page.screenshot(path=str(out), full_page=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=screenshot.__doc__)
    parser.add_argument("report", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--width", type=int, default=1300)
    args = parser.parse_args()
    screenshot(args.report, args.out, args.width)
