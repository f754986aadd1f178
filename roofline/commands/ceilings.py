"""measure this device's memory and matmul roofs

`python -m roofline.cli.ceilings device=cpu quick=true`: ceilings.json (rewritten after each
group), the summary on the console."""

from dataclasses import dataclass

from roofline.io import files
from roofline.io.fields import option
from roofline.measure.ceilings import (CeilingsRequest, format_summary, measure_ceilings, stderr_log,
                                       write_ceilings)


# what the `device` entry (roofline/conf/device/) means to this command: the torch device to run on
DEVICE_AS = "torch"


@dataclass(frozen=True)
class CeilingsKeys:
    """The keys that are not fields of the request: the device to measure and where the results go."""

    device: dict | None = option(None, "roofline/conf/device/: cpu | cuda | a datasheet GPU row (h200_sxm, ...); "
                                       "device.torch=cuda:N picks a GPU")
    out_dir: str | None = option(None, "the run folder of ceilings.json and its CSVs (roofline/conf/ceilings.yaml "
                                       "sets it: <results root>/ceilings-<device.torch>)")


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (CeilingsRequest, CeilingsKeys)


def run(c: dict) -> None:
    c = dict(c)
    out_dir, overrides = c.pop("out_dir"), c.pop("overrides", [])
    result = measure_ceilings(CeilingsRequest.from_dict(c), log=stderr_log, context={"overrides": overrides},
                              out_dir=out_dir, progress=True)  # ceilings.json rewritten after each group
    run_dir = write_ceilings(result, out_dir)
    print(format_summary(result))
    print(files.json_text({"run_dir": str(run_dir), "summary": result["summary"]}))
