"""The report of a run folder: Markdown with tables and image links, self-contained HTML."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from roofline.io.fields import ConfigError
from roofline.report.document import md_table, write_report
from tests.helpers import make_synthetic_run

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, str, str]:
    run = make_synthetic_run(tmp_path_factory.mktemp("run"))
    (run / "report_20_costmodel.md").write_text("## Cost model\n\n| term | value |\n|---|---|\n| a | 1.5 |\n")
    (run / "report_10_first.md").write_text("## First extra\n\nSome `code` and **bold**.\n\n- one\n- two\n")
    md, html = write_report(run)
    return run, md.read_text(), html.read_text()


def _table_after(md: str, heading: str) -> list[list[str]]:
    section = md.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows if not r.startswith("|---")]


def test_markdown_links_every_png_figure(report):
    run, md, _ = report
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert sorted(links) == sorted(p.relative_to(run).as_posix() for p in (run / "figures").glob("*.png"))
    assert len(links) == 4 and all((run / link).stat().st_size > 10_000 for link in links)


def test_tq_table_has_ratio_per_dtype_batch_context_and_gbps_at_q1(report):
    _, md, _ = report
    table = _table_after(md, "## Step time vs tokens per pass")
    header, rows = table[0], table[1:]
    assert header[:5] == ["dtype", "B", "L", "T(1) ms", "GB/s at q=1"]
    assert {(r[0], r[1], r[2]) for r in rows} == {("bfloat16", b, l) for b in ("1", "4") for l in ("0", "4096")}
    row = dict(zip(header, rows[0]))
    assert row["q=1"] == "1"
    assert 0.9 < float(row["q=4"]) < 1.05 and 6 < float(row["q=128"]) < 8  # flat, then linear
    assert 18 < float(row["GB/s at q=1"]) < 20
    assert float(row["% measured BW"]) == pytest.approx(100 * float(row["GB/s at q=1"]) / 21.0, rel=1e-3)


def test_ceilings_table_puts_measured_and_datasheet_side_by_side(report):
    _, md, _ = report
    table = _table_after(md, "## Ceilings: measured vs datasheet")
    rows = {r[0]: dict(zip(table[0], r)) for r in table[1:]}
    assert rows["memory bandwidth"]["measured"] == "21" and rows["memory bandwidth"]["datasheet"] == "38.4"
    assert rows["peak bf16"]["measured / datasheet %"] == "35"
    assert rows["ridge bf16"]["measured"] == "20"


def test_failed_points_are_listed_with_status_and_error(report):
    _, md, _ = report
    table = _table_after(md, "## Failed points")
    assert len(table) == 2
    row = dict(zip(table[0], table[1]))
    assert (row["status"], row["B"], row["L"], row["q"]) == ("oom", "4", "4096", "128")
    assert "can't allocate memory" in row["error"]


def test_provenance_table_compares_points_and_ceilings(report):
    _, md, _ = report
    rows = {r[0]: r[1:] for r in _table_after(md, "## Provenance")[1:]}
    assert rows["device_name"] == ["AMD EPYC 9R14 (synthetic)", "AMD EPYC 9R14 (synthetic)"]
    assert rows["git_commit"][0] == "0123456789ab"


def test_extra_sections_are_included_in_name_order(report):
    _, md, html = report
    assert md.index("## First extra") < md.index("## Cost model") and md.index("## Provenance") < md.index("## First")
    assert '<h2 id="cost-model">Cost model</h2>' in html and "<td>1.5</td>" in html
    assert '<a href="#cost-model">Cost model</a>' in html  # the contents list the sections' headings too
    assert "<code>code</code>" in html and "<strong>bold</strong>" in html and "<li>two</li>" in html


def test_html_embeds_every_image_and_links_nothing_outside(report):
    run, _, html = report
    srcs = re.findall(r'src="([^"]+)"', html)
    assert len(srcs) == len(list((run / "figures").glob("*.png"))) == 4
    assert all(s.startswith("data:image/png;base64,") and len(s) > 10_000 for s in srcs)
    assert not re.search(r"https?://|<link|<script", html)
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', html))  # only the contents' own anchors
    assert html.count("<table>") == 6 + 1  # T(q), percentiles, knee, ceilings, failed, provenance + the extra section's


def test_report_works_without_ceilings(tmp_path):
    run = make_synthetic_run(tmp_path / "run", ceilings=False)
    md_path, html_path = write_report(run)
    md = md_path.read_text()
    assert "No ceilings.json in this run folder" in md
    assert "Figure `bandwidth_vs_working_set` not drawn" in md
    assert "figures/roofline_bf16.png" in md and "figures/step_time_vs_q_bf16.png" in md
    assert "% measured BW" not in md
    assert html_path.read_text().count("data:image/png;base64,") == 2


@pytest.mark.parametrize("bad", ["missing", "empty", None])
def test_bad_results_dir_raises_config_error_naming_it(tmp_path, bad):
    path = {"missing": tmp_path / "nope", "empty": tmp_path, None: None}[bad]
    with pytest.raises(ConfigError, match="results_dir"):
        write_report(path)


def test_md_table_escapes_pipes():
    import pandas as pd
    assert md_table(pd.DataFrame({"a": ["x|y"]})) == "| a |\n|---|\n| x\\|y |"


def test_entry_point_names_results_dir_when_missing(tmp_path):
    out = subprocess.run([sys.executable, "-m", "roofline.cli.plots", f"results_dir={tmp_path / 'nope'}"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "results_dir" in out.stderr
