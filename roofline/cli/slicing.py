"""Check layer-sliced extrapolation against a full-depth run of the same grid:
`python -m roofline.cli.slicing full_dir=results/runs/A sliced_dir=results/runs/B`.

The Hydra entry of the `slicing` command; what it does is roofline/commands/slicing.py."""

from roofline.cli.entry import command, fail_fast, plain
from roofline.commands import slicing


@command("slicing")
def main(cfg) -> None:
    with fail_fast():
        slicing.run(plain(cfg))


if __name__ == "__main__":
    main()
