"""two runs point by point: ratio and whether it exceeds the noise

`python -m roofline.cli.compare a=DIR b=DIR [out=FILE.csv]`; with `fail_above=1.05` it returns
REGRESSION when a point is more than 5% slower in b beyond the noise."""

from dataclasses import dataclass

from roofline.io import files
from roofline.io.fields import option
from roofline.analysis.compare import compare_runs, format_comparison, write_table
from roofline.commands import REGRESSION


@dataclass(frozen=True)
class CompareKeys:
    """The two runs joined point by point, and what counts as a regression."""

    a: str = option(help="a sweep run folder (the reference)")
    b: str = option(help="another run folder (ratio = b / a)")
    out: str | None = option(None, "a CSV file for the joined table; null writes nothing")
    allow_other_model: bool = option(False, "true: join runs of different models (point ids may coincide); "
                                            "marked in the output")
    fail_above: float | None = option(None, "CI: a ratio b/a (1.05); a point slower than that beyond the noise "
                                               "exits 3 (REGRESSION)")


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (CompareKeys,)


def run(c: dict) -> int:
    table, summary = compare_runs(c["a"], c["b"], c["allow_other_model"], c["fail_above"])
    if c["out"]:
        write_table(table, c["out"])
    print(format_comparison(table, summary))
    print(files.json_text(summary))
    return REGRESSION if summary.get("regressions") else 0
