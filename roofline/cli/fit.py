"""Fit the step-time model to a run folder: `python -m roofline.cli.fit results_dir=results/runs/<run>`.

The Hydra entry of the `fit` command; what it does is roofline/commands/fit.py."""

from roofline.cli.entry import command, fail_fast, plain
from roofline.commands import fit


@command("fit")
def main(cfg) -> None:
    with fail_fast():
        fit.run(plain(cfg))


if __name__ == "__main__":
    main()
