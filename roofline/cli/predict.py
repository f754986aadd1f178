"""Predict speculative-decoding speedups: `python -m roofline.cli.predict fit=<run>/fit.json model=deepseek-v3`,
or without a fit for a device never measured: `python -m roofline.cli.predict model=deepseek-v3 device=h200_sxm tp=8`
(datasheet row + roofline/data/priors.yaml, an interval).

The Hydra entry of the `predict` command; what it does is roofline/commands/predict.py."""

from roofline.cli.entry import main_of

main = main_of("predict")

if __name__ == "__main__":
    main()
