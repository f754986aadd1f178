"""Check layer-sliced extrapolation against a full-depth run of the same grid:
`python -m roofline.cli.slicing full_dir=results/runs/A sliced_dir=results/runs/B`.

The Hydra entry of the `slicing` command; what it does is roofline/commands/slicing.py."""

from roofline.cli.entry import main_of

main = main_of("slicing")

if __name__ == "__main__":
    main()
