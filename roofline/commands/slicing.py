"""check layer-sliced extrapolation against a full-depth run

`python -m roofline.cli.slicing full_dir=results/runs/A sliced_dir=results/runs/B`."""


from roofline.io import files
from roofline.measure.slicing import slicing_check


def run(c: dict) -> None:
    table, summary = slicing_check(c["full_dir"], c["sliced_dir"])
    print(table.round(4).to_string(index=False))
    print(files.json_text(summary))
