"""Measure collectives: `python -m roofline.cli.collectives world=2` (gloo on the CPU, NCCL with device=cuda).

Under torchrun or srun every rank runs this same command; rank 0 writes the results.

The Hydra entry of the `collectives` command; what it does is roofline/commands/collectives.py."""

from roofline.cli.entry import command, fail_fast, plain
from roofline.commands import collectives


@command("collectives")
def main(cfg) -> None:
    with fail_fast():
        collectives.run(plain(cfg, device_as="torch"))


if __name__ == "__main__":
    main()
