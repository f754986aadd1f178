"""Fit the cost model on some sweeps, predict unseen layouts:
`python -m experiments.layout_validation 'train=[A,B]' 'test=[C,D]' collectives=.../collectives.json`."""

import json

from experiments.entry import command, fail_fast, plain
from roofline.parallel.validate import held_out


@command("layout_validation")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        table, summary = held_out(c["train"], c["test"], c["collectives"], c["out_dir"])
        print(table.round(5).to_string(index=False))
        print(json.dumps(summary, default=float))


if __name__ == "__main__":
    main()
