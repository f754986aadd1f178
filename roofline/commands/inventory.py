"""did a checkpoint conversion lose tensors?

`python -m roofline.cli.inventory before=DIR after=DIR [rename_map=FILE]`: returns 1 on any loss
(missing, reshaped, re-typed or changed tensors, or a dropped num_nextn_predict_layers)."""

from dataclasses import dataclass

from roofline.io import files
from roofline.io.fields import option
from roofline.checkpoints.inventory import InventoryRequest, format_report, run_inventory, write_outputs


@dataclass(frozen=True)
class InventoryKeys:
    """Where the inventory is written (the checkpoints compared: InventoryRequest)."""

    out: str | None = option(None, "folder for inventory.txt and inventory.json; null writes nothing")


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (InventoryRequest, InventoryKeys)


def run(c: dict) -> int:
    result = run_inventory(InventoryRequest(before=c["before"], after=c["after"],
                                            rename_map=c["rename_map"], strict=c["strict"]))
    path = write_outputs(result, c["out"]) if c["out"] else None
    print(format_report(result))
    print(files.json_text(dict(result.counts(), inventory=str(path) if path else None)))
    return 0 if result.ok else 1
