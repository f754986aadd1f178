"""report.md + report.html of a run folder

`python -m roofline.cli.report results_dir=results/<run>`: figures/, report.md and report.html
(self-contained) in the run folder."""


from roofline.io import files
from roofline.report.document import write_report


def run(c: dict) -> None:
    md, html = write_report(c["results_dir"])
    print(f"report: {md}\nreport: {html}")
    print(files.json_text({"report_md": str(md), "report_html": str(html)}))
