"""Fit the cost model on some sweeps, predict unseen layouts:
`python -m roofline.cli.layout_validation 'train=[A,B]' 'test=[C,D]' collectives=.../collectives.json`.

The Hydra entry of the `layout_validation` command; what it does is roofline/commands/layout_validation.py."""

from roofline.cli.entry import command, fail_fast, plain
from roofline.commands import layout_validation


@command("layout_validation")
def main(cfg) -> None:
    with fail_fast():
        layout_validation.run(plain(cfg))


if __name__ == "__main__":
    main()
