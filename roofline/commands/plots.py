"""figures of a run folder

`python -m roofline.cli.plots results_dir=results/<run>`: the written paths, then one JSON
document with the paths and the figures skipped (why)."""

from roofline.io import files
from roofline.report.document import write_figures


def run(c: dict) -> None:
    figures = write_figures(c["results_dir"], c["out_dir"])
    for paths in figures.paths.values():
        for p in paths:
            print(p)
    print(files.json_text({"figures": {k: [str(p) for p in v] for k, v in figures.paths.items()},
                      "skipped": figures.skipped}))
