"""Capacity plan: `python -m roofline.cli.capacity model=llama-3.1-8b device=h200_sxm` (datasheet what-if)
or `fit=<run>/fit.json memory_gb=64` (measured device parameters); `layouts=true` plans devices and
layouts (tp / ep / dp-attention / pp) from the datasheet row + roofline/data/priors.yaml.

The Hydra entry of the `capacity` command; what it does is roofline/commands/capacity.py."""

from roofline.cli.entry import main_of

main = main_of("capacity")

if __name__ == "__main__":
    main()
