"""Compare two runs point by point: `python -m experiments.compare a=DIR b=DIR [out=FILE.csv]`.

The last line of stdout is one JSON document (the summary). In CI: `fail_above=1.05` exits
REGRESSION (3) when a point is more than 5% slower in b beyond the noise."""

import json
import sys

from experiments.entry import REGRESSION, command, fail_fast, plain
from roofline.analysis.compare import compare_runs, format_comparison, write_table


@command("compare")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        table, summary = compare_runs(c["a"], c["b"], c["allow_other_model"], c["fail_above"])
        if c["out"]:
            write_table(table, c["out"])
        print(format_comparison(table, summary))
        print(json.dumps(summary))
        if summary.get("regressions"):
            sys.exit(REGRESSION)


if __name__ == "__main__":
    main()
