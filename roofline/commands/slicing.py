"""check layer-sliced extrapolation against a full-depth run

`python -m roofline.cli.slicing full_dir=results/runs/A sliced_dir=results/runs/B`."""

from dataclasses import dataclass

from roofline.io import files
from roofline.io.fields import option
from roofline.measure.slicing import slicing_check


@dataclass(frozen=True)
class SlicingKeys:
    """The two run folders compared."""

    full_dir: str = option(help="a full-depth sweep run folder")
    sliced_dir: str = option(help="the same grid with layers=n")


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (SlicingKeys,)


def run(c: dict) -> None:
    table, summary = slicing_check(c["full_dir"], c["sliced_dir"])
    print(table.round(4).to_string(index=False))
    print(files.json_text(summary))
