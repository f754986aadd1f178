"""Measure this device's memory and matmul ceilings: `python -m roofline.cli.ceilings device=cpu quick=true`.

The Hydra entry of the `ceilings` command; what it does is roofline/commands/ceilings.py."""

from roofline.cli.entry import main_of

main = main_of("ceilings")

if __name__ == "__main__":
    main()
