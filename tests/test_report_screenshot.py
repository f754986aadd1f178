"""The report as headless Chromium renders it (scripts/report_screenshot.py): skipped where no
Chromium is installed (CI; `make browser` installs Debian's)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from roofline.report import regime
from roofline.report.document import open_run, write_report
from tests.helpers import make_synthetic_run

_SPEC = importlib.util.spec_from_file_location("report_screenshot", Path(__file__).parents[1] / "scripts" / "report_screenshot.py")
shot = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(shot)

BROWSER = shot.chromium()
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium on this machine (make browser)")


def test_the_rendered_page_states_the_regime_the_data_show(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    _, html_path = write_report(run)
    df = open_run(run)[1]
    page = shot.rendered(html_path, BROWSER)
    said = [p for p in page.paragraphs if p.startswith("Regime:")]
    assert said == [f"Regime: {line}." for line in regime.headline(df)] and said
    assert any(a.startswith("step_time_vs_q") for a in page.alts)  # the step-time figure is on the page


def test_the_screenshot_is_a_picture_of_the_page(tmp_path):
    import matplotlib.image
    run = make_synthetic_run(tmp_path / "run")
    _, html_path = write_report(run)
    png = shot.screenshot(html_path, tmp_path / "page.png", BROWSER, width=800, height=1000)
    pixels = matplotlib.image.imread(png)
    assert pixels.shape[:2] == (1000, 800)
    assert pixels[..., :3].std() > 0.05  # text and figures, not a blank page
