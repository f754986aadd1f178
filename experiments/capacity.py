"""Capacity plan: `python -m experiments.capacity model=llama-3.1-8b device=h200_sxm` (datasheet what-if)
or `fit=<run>/fit.json memory_gb=64` (measured device parameters); `layouts=true` plans devices and
layouts (tp / ep / dp-attention / pp) from the datasheet row + roofline/data/priors.yaml."""

import json

import pandas as pd

from experiments.entry import command, fail_fast, plain
from roofline.analysis.capacity import plan_layouts, request_from_config, run


@command("capacity")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg, device_as="datasheet")
        c.pop("overrides")
        if c.pop("layouts"):  # how many devices, which layout: an interval from the priors
            rows, summary = plan_layouts(c)
            with pd.option_context("display.width", 250, "display.max_columns", 40):
                print(rows.round(3).to_string(index=False) if not rows.empty else "no layout meets the ITL target")
            print(json.dumps(summary, default=str))
            return
        table, summary, _ = run(request_from_config(c))
        print(table.round(3).to_string(index=False))
        print(json.dumps(summary, default=str))


if __name__ == "__main__":
    main()
