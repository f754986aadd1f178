"""figures of a run folder

`python -m roofline.cli.plots results_dir=results/<run>`: the written paths, then one JSON
document with the paths and the figures skipped (why)."""

from dataclasses import dataclass

from roofline.io import files
from roofline.io.fields import option
from roofline.report.document import write_figures


@dataclass(frozen=True)
class PlotsKeys:
    """The run folder read and where its figures go."""

    results_dir: str | None = option(None, "a run folder (points.csv or points.jsonl; ceilings.json when present)")
    out_dir: str | None = option(None, "where the figures go; null: <results_dir>/figures")


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (PlotsKeys,)


def run(c: dict) -> None:
    figures = write_figures(c["results_dir"], c["out_dir"])
    for paths in figures.paths.values():
        for p in paths:
            print(p)
    print(files.json_text({"figures": {k: [str(p) for p in v] for k, v in figures.paths.items()},
                      "skipped": figures.skipped}))
