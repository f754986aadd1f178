"""Measure this device's memory and matmul ceilings: `python -m roofline.cli.ceilings device=cpu quick=true`.

The Hydra entry of the `ceilings` command; what it does is roofline/commands/ceilings.py."""

from roofline.cli.entry import command, fail_fast, plain
from roofline.commands import ceilings


@command("ceilings")
def main(cfg) -> None:
    with fail_fast():
        ceilings.run(plain(cfg, device_as="torch"))


if __name__ == "__main__":
    main()
