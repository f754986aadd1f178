"""two runs point by point: ratio and whether it exceeds the noise

`python -m roofline.cli.compare a=DIR b=DIR [out=FILE.csv]`; with `fail_above=1.05` it returns
REGRESSION when a point is more than 5% slower in b beyond the noise."""


from roofline.io import files
from roofline.analysis.compare import compare_runs, format_comparison, write_table
from roofline.commands import REGRESSION


def run(c: dict) -> int:
    table, summary = compare_runs(c["a"], c["b"], c["allow_other_model"], c["fail_above"])
    if c["out"]:
        write_table(table, c["out"])
    print(format_comparison(table, summary))
    print(files.json_text(summary))
    return REGRESSION if summary.get("regressions") else 0
