"""Compare two runs point by point: `python -m roofline.cli.compare a=DIR b=DIR [out=FILE.csv]`.

The last line of stdout is one JSON document (the summary). In CI: `fail_above=1.05` exits
REGRESSION (3) when a point is more than 5% slower in b beyond the noise.

The Hydra entry of the `compare` command; what it does is roofline/commands/compare.py."""

import sys

from roofline.cli.entry import command, fail_fast, plain
from roofline.commands import compare


@command("compare")
def main(cfg) -> None:
    with fail_fast():
        if status := compare.run(plain(cfg)):
            sys.exit(status)


if __name__ == "__main__":
    main()
