"""Did a conversion lose tensors? `python -m roofline.cli.inventory before=DIR after=DIR [rename_map=FILE]`.

Exits 1 on any loss (missing, reshaped, re-typed or changed tensors, or a dropped
num_nextn_predict_layers), 2 on bad input; the last line of stdout is one JSON document.

The Hydra entry of the `inventory` command; what it does is roofline/commands/inventory.py."""

import sys

from roofline.cli.entry import command, fail_fast, plain
from roofline.commands import inventory


@command("inventory")
def main(cfg) -> None:
    with fail_fast():
        if status := inventory.run(plain(cfg)):
            sys.exit(status)


if __name__ == "__main__":
    main()
