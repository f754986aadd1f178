"""Figures of a run folder: `python -m experiments.plots results_dir=results/<run>`.

The last line of stdout is one JSON document: the written paths and the figures skipped (why)."""

import json

from experiments.entry import command, fail_fast, plain
from roofline.report.document import write_figures


@command("plots")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        figures = write_figures(c["results_dir"], c["out_dir"])
    for paths in figures.paths.values():
        for p in paths:
            print(p)
    print(json.dumps({"figures": {k: [str(p) for p in v] for k, v in figures.paths.items()},
                      "skipped": figures.skipped}))


if __name__ == "__main__":
    main()
