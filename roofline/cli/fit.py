"""Fit the step-time model to a run folder: `python -m roofline.cli.fit results_dir=results/runs/<run>`.

The Hydra entry of the `fit` command; what it does is roofline/commands/fit.py."""

from roofline.cli.entry import main_of

main = main_of("fit")

if __name__ == "__main__":
    main()
