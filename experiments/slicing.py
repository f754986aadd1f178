"""Check layer-sliced extrapolation against a full-depth run of the same grid:
`python -m experiments.slicing full_dir=results/runs/A sliced_dir=results/runs/B`."""

import json

from experiments.entry import command, fail_fast, plain
from roofline.measure.slicing import slicing_check


@command("slicing")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        table, summary = slicing_check(c["full_dir"], c["sliced_dir"])
        print(table.round(4).to_string(index=False))
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
