"""report.md + report.html of a run folder

`python -m roofline.cli.report results_dir=results/<run>`: figures/, report.md and report.html
(self-contained) in the run folder."""

from dataclasses import dataclass

from roofline.io import files
from roofline.io.fields import option
from roofline.report.document import write_report


@dataclass(frozen=True)
class ReportKeys:
    """The run folder the report is written into."""

    results_dir: str | None = option(None, "a run folder: writes figures/, report.md and report.html into it")


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (ReportKeys,)


def run(c: dict) -> None:
    md, html = write_report(c["results_dir"])
    print(f"report: {md}\nreport: {html}")
    print(files.json_text({"report_md": str(md), "report_html": str(html)}))
