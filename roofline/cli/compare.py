"""Compare two runs point by point: `python -m roofline.cli.compare a=DIR b=DIR [out=FILE.csv]`.

The last line of stdout is one JSON document (the summary). In CI: `fail_above=1.05` exits
REGRESSION (3) when a point is more than 5% slower in b beyond the noise.

The Hydra entry of the `compare` command; what it does is roofline/commands/compare.py."""

from roofline.cli.entry import main_of

main = main_of("compare")

if __name__ == "__main__":
    main()
