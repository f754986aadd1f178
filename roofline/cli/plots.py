"""Figures of a run folder: `python -m roofline.cli.plots results_dir=results/<run>`.

The last line of stdout is one JSON document: the written paths and the figures skipped (why).

The Hydra entry of the `plots` command; what it does is roofline/commands/plots.py."""

from roofline.cli.entry import main_of

main = main_of("plots")

if __name__ == "__main__":
    main()
