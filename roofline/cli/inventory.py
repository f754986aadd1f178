"""Did a conversion lose tensors? `python -m roofline.cli.inventory before=DIR after=DIR [rename_map=FILE]`.

Exits 1 on any loss (missing, reshaped, re-typed or changed tensors, or a dropped
num_nextn_predict_layers), 2 on bad input; the last line of stdout is one JSON document.

The Hydra entry of the `inventory` command; what it does is roofline/commands/inventory.py."""

from roofline.cli.entry import main_of

main = main_of("inventory")

if __name__ == "__main__":
    main()
