#!/usr/bin/env python3
"""A report as a reader's browser shows it: headless Chromium renders report.html.

    python3 scripts/report_screenshot.py results/runs/demo/report.html [out.png]

Writes a PNG of the top of the page (the headline, the key figure, the regime lines and the first
figures; default: report.png beside the report) and prints what the rendered page says in its
"Regime:" lines and the step-time figure's caption, so that a check of the report reads the page
the browser built, not the Markdown it came from. Needs a Chromium (`make browser` installs
Debian's; $CHROMIUM names another); not part of the default test run's requirements
(tests/test_report_screenshot.py skips without one).
"""

from __future__ import annotations

import html.parser
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WIDTH, HEIGHT = 1280, 2400  # px: the headline block and the first two figures of the demo's report


def chromium() -> str | None:
    """The browser to run: $CHROMIUM, else the first of CANDIDATES on PATH."""
    return os.environ.get("CHROMIUM") or next((p for p in map(shutil.which, CANDIDATES) if p), None)


def _run(browser: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:  # a fresh profile: nothing of a user's browser
        return subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               "--no-first-run", f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout, check=True)


class _Text(html.parser.HTMLParser):
    """The page's paragraphs as text, and every image's alt."""

    def __init__(self):
        super().__init__()
        self.paragraphs, self.alts, self._p = [], [], None

    def handle_starttag(self, tag, attrs):
        if tag == "p":
            self._p = []
        elif tag == "img":
            self.alts.append(dict(attrs).get("alt") or "")

    def handle_data(self, data):
        if self._p is not None:
            self._p.append(data)

    def handle_endtag(self, tag):
        if tag == "p" and self._p is not None:
            self.paragraphs.append(" ".join("".join(self._p).split()))
            self._p = None


def rendered(report: Path, browser: str) -> _Text:
    """What the browser built from the report: its DOM after rendering, parsed."""
    dom = _run(browser, "--dump-dom", report.resolve().as_uri()).stdout
    text = _Text()
    text.feed(dom)
    return text


def screenshot(report: Path, out: Path, browser: str, width: int = WIDTH, height: int = HEIGHT) -> Path:
    _run(browser, f"--window-size={width},{height}", f"--screenshot={out.resolve()}", report.resolve().as_uri())
    if not out.exists() or out.stat().st_size == 0:
        raise RuntimeError(f"{browser} wrote no screenshot to {out}")
    return out


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    report = Path(argv[0])
    out = Path(argv[1]) if len(argv) == 2 else report.with_suffix(".png")
    browser = chromium()
    if browser is None:
        print("no Chromium found (make browser installs Debian's; or set CHROMIUM)", file=sys.stderr)
        return 2
    page = rendered(report, browser)
    for line in page.paragraphs:
        if line.startswith(("Key figure:", "Regime:", "Decode:")):
            print(line)
    steps = [a for a in page.alts if a.startswith("step_time")]
    print("step-time figure:", steps[0] if steps else "(none)")
    print(screenshot(report, out, browser))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
