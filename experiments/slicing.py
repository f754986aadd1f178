"""Check layer-sliced extrapolation against a full-depth run of the same grid:
`python -m experiments.slicing full_dir=results/runs/A sliced_dir=results/runs/B`."""

import json

import hydra

from experiments.entry import fail_fast, plain
from roofline.measure.slicing import slicing_check


@hydra.main(config_path="../conf", config_name="slicing", version_base="1.3")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        table, summary = slicing_check(c["full_dir"], c["sliced_dir"])
        print(table.round(4).to_string(index=False))
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
