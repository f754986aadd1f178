"""Did a conversion lose tensors? `python -m experiments.inventory before=DIR after=DIR [rename_map=FILE]`.

Exits 1 on any loss (missing, reshaped, re-typed or changed tensors, or a dropped
num_nextn_predict_layers), 2 on bad input; the last line of stdout is one JSON document."""

import json
import sys

from experiments.entry import command, fail_fast, plain
from roofline.checkpoints.inventory import InventoryRequest, format_report, run_inventory, write_outputs


@command("inventory")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        result = run_inventory(InventoryRequest(before=c["before"], after=c["after"],
                                                rename_map=c["rename_map"], strict=c["strict"]))
        path = write_outputs(result, c["out"]) if c["out"] else None
        print(format_report(result))
        print(json.dumps(dict(result.counts(), inventory=str(path) if path else None)))
        sys.exit(0 if result.ok else 1)


if __name__ == "__main__":
    main()
