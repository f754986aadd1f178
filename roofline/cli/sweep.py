"""Time forward passes of a preset over a grid: `python -m roofline.cli.sweep model=cpu-demo`.

Multirun: `python -m roofline.cli.sweep -m model=cpu-demo,tiny 'dtypes=[bfloat16],[float32]'`
(add `hydra/launcher=submitit_local` or `hydra/launcher=slurm` to go through submitit).
A Hugging Face model folder in place of a preset: `python -m roofline.cli.sweep checkpoint=path/to/folder`.
Several ranks: `python -m roofline.cli.sweep tp=2 [ep=2]` (spawned here; or under torchrun / srun).

The Hydra entry of the `sweep` command; what it does is roofline/commands/sweep.py."""

from roofline.cli.entry import main_of

main = main_of("sweep")

if __name__ == "__main__":
    main()
