"""Predict speculative-decoding speedups: `python -m experiments.predict fit=<run>/fit.json model=deepseek-v3`,
or without a fit for a device never measured: `python -m experiments.predict model=deepseek-v3 device=h200_sxm tp=8`
(datasheet row + roofline/data/priors.yaml, an interval)."""

import json

from experiments.entry import command, fail_fast, plain
from roofline.analysis.predict import predict_command


@command("predict")
def main(cfg) -> None:
    with fail_fast():
        text, summary = predict_command(plain(cfg, device_as="datasheet"))
        print(text)
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
