"""Report of a run folder: `python -m roofline.cli.report results_dir=results/<run>`.

Writes figures/, report.md and report.html (self-contained) into the run folder; the last
line of stdout is one JSON document with the paths.

The Hydra entry of the `report` command; what it does is roofline/commands/report.py."""

from roofline.cli.entry import main_of

main = main_of("report")

if __name__ == "__main__":
    main()
