"""Report of a run folder: `python -m experiments.report results_dir=results/<run>`.

Writes figures/, report.md and report.html (self-contained) into the run folder; the last
line of stdout is one JSON document with the paths."""

import json

from experiments.entry import command, fail_fast, plain
from roofline.report.document import write_report


@command("report")
def main(cfg) -> None:
    with fail_fast():
        md, html = write_report(plain(cfg)["results_dir"])
    print(f"report: {md}\nreport: {html}")
    print(json.dumps({"report_md": str(md), "report_html": str(html)}))


if __name__ == "__main__":
    main()
