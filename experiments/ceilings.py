"""Measure this device's memory and matmul ceilings: `python -m experiments.ceilings device=cpu quick=true`."""

import json

from experiments.entry import command, fail_fast, plain
from roofline.measure.ceilings import (CeilingsSpec, format_summary, measure_ceilings, stderr_log,
                               write_ceilings)


@command("ceilings")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg, device_as="torch")
        out_dir, overrides = c.pop("out_dir"), c.pop("overrides", [])
        result = measure_ceilings(CeilingsSpec.from_dict(c), log=stderr_log, context={"overrides": overrides},
                                  out_dir=out_dir, progress=True)  # ceilings.json rewritten after each group
        run_dir = write_ceilings(result, out_dir)
        print(format_summary(result))
        print(json.dumps({"run_dir": str(run_dir), "summary": result["summary"]}))


if __name__ == "__main__":
    main()
