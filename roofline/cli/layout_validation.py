"""Fit the cost model on some sweeps, predict unseen layouts:
`python -m roofline.cli.layout_validation 'train=[A,B]' 'test=[C,D]' collectives=.../collectives.json`.

The Hydra entry of the `layout_validation` command; what it does is roofline/commands/layout_validation.py."""

from roofline.cli.entry import main_of

main = main_of("layout_validation")

if __name__ == "__main__":
    main()
