"""Measure this device's memory and matmul ceilings: `python -m experiments.ceilings device=cpu quick=true`."""

import json

import hydra

from experiments.entry import fail_fast, plain
from roofline.measure.ceilings import (CeilingsSpec, format_summary, measure_ceilings, stderr_log,
                               write_ceilings)


@hydra.main(config_path="../conf", config_name="ceilings", version_base="1.3")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg, device_as="torch")
        out_dir, overrides = c.pop("out_dir"), c.pop("overrides", [])
        result = measure_ceilings(CeilingsSpec.from_dict(c), log=stderr_log,
                                  context={"overrides": overrides})
        run_dir = write_ceilings(result, out_dir)
        print(format_summary(result))
        print(json.dumps({"run_dir": str(run_dir), "summary": result["summary"]}))


if __name__ == "__main__":
    main()
