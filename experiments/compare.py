"""Compare two runs point by point: `python -m experiments.compare a=DIR b=DIR [out=FILE.csv]`.

The last line of stdout is one JSON document (the summary)."""

import json

from experiments.entry import command, fail_fast, plain
from roofline.analysis.compare import compare_runs, format_comparison


@command("compare")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        table, summary = compare_runs(c["a"], c["b"])
        if c["out"]:
            table.to_csv(c["out"], index=False)
        print(format_comparison(table, summary))
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
