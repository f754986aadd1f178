"""Measure collectives: `python -m roofline.cli.collectives world=2` (gloo on the CPU, NCCL with device=cuda).

Under torchrun or srun every rank runs this same command; rank 0 writes the results.

The Hydra entry of the `collectives` command; what it does is roofline/commands/collectives.py."""

from roofline.cli.entry import main_of

main = main_of("collectives")

if __name__ == "__main__":
    main()
