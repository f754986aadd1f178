"""published multi-GPU measurements beside our what-if predictions

`python -m roofline.cli.anchors [out_dir=DIR]`: the table (and trends) on the console, anchors.csv,
anchors.json and anchors.md (the summaries and the test table as the docs show them) in out_dir; beside them
the held-out kernel benchmarks priced by the same kernel curves (kernel_checks.csv, kernel_checks.md; their
summary in anchors.json's `kernel_checks`), and each deployment's anchors priced calibrated to its other published
points (calibrated.csv, calibrated.md; anchors.json's `calibrated_leave_one_out`)."""

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from roofline.io import files
from roofline.io.fields import option
from roofline.io.files import write_atomic, write_csv_atomic, write_json_atomic
from roofline.analysis import calibrate
from roofline.parallel import anchors, kernel_checks


@dataclass(frozen=True)
class AnchorsKeys:
    """The anchors file, how the predictions are made, the trends printed, where the files go."""

    anchors: str | None = option(None, "another anchors file (default: roofline/data/deployments.yaml)")
    engine_known: bool = option(True, "false: predict as a user who names no engine (the interval spans the "
                                       "profiles)")
    trend: tuple[str, ...] = option((), "anchors whose metric is also printed against batch size")
    trend_B: tuple[int, ...] = option((1, 2, 4, 8, 16, 32, 64), "the batch sizes of the trends")
    kernel_checks: str | None = option(None, "another held-out kernel-benchmarks file (default: "
                                             "roofline/data/kernel_checks.yaml)")
    out_dir: str | None = option(None, "write anchors.csv, trend-<id>.csv, anchors.json, anchors.md, kernel_checks.csv "
                                       "and kernel_checks.md here")


CALIBRATED_HEAD = ("Each anchor of a deployment (one source, model, device, layout, engine, precision, client) priced "
                   "again calibrated to that deployment's other published points (`calibrate=`, never to itself), as a "
                   "user who measured them would price it (roofline.analysis.calibrate.anchors_leave_one_out); rows: "
                   "calibrated.csv. Error = predicted / published - 1.\n\n")

# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (AnchorsKeys,)


def run(c: dict) -> None:
    t = anchors.table(c["anchors"] or anchors.ANCHORS_PATH, c["engine_known"])
    cols = ["split", "id", "engine", "metric", "published", "predicted", "low", "high", "error_pct", "inside"]
    with pd.option_context("display.width", 200):
        print(t[cols].round(3).to_string(index=False))
        for aid in c["trend"]:
            print(f"\n{aid}: predicted vs batch (optimistic / typical / pessimistic priors)")
            print(anchors.trend(aid, tuple(c["trend_B"]), c["anchors"] or anchors.ANCHORS_PATH).round(3)
                  .to_string(index=False))
    kt = kernel_checks.table(c["kernel_checks"] or kernel_checks.CHECKS_PATH)
    print("\nheld-out kernel benchmarks (kernel_checks.yaml) beside the kernel curves' prices")
    print(kt[["id", "M", "published_us", "predicted_us", "low_us", "high_us", "error_pct", "inside"]].round(1)
          .to_string(index=False))
    deployments = calibrate.priced_deployments(c["anchors"], c["engine_known"])  # priced once for both
    loo = {mode: calibrate.leave_one_out(deployments, nearest)
           for mode, nearest in (("all other points", False), ("the nearest point", True))}
    loo_summary = {mode: calibrate.leave_one_out_summary(x) for mode, x in loo.items()}
    print("\ncalibrated to the deployment's own other published points (leave-one-out, calibrate=)")
    print(calibrate.leave_one_out_markdown(loo_summary))
    summary = dict(anchors=len(t), not_priced=int(t["predicted"].isna().sum()),
                   error_bands_pct={k: round(100 * (math.exp(v) - 1), 2) for k, v in t.attrs["bands_log"].items()},
                   error_bands_from=t.attrs["bands_from"],
                   **anchors.summary(t), kernel_checks=kernel_checks.summary(kt), calibrated_leave_one_out=loo_summary)
    if c["out_dir"]:
        out = Path(c["out_dir"])
        out.mkdir(parents=True, exist_ok=True)
        write_csv_atomic(t, out / "anchors.csv")
        for aid in c["trend"]:
            write_csv_atomic(anchors.trend(aid, tuple(c["trend_B"]), c["anchors"] or anchors.ANCHORS_PATH),
                             out / f"trend-{aid}.csv")
        write_json_atomic(out / "anchors.json", summary)
        write_atomic(out / "anchors.md", anchors.markdown(t))
        write_csv_atomic(pd.concat([x.assign(calibrated_to=mode) for mode, x in loo.items()], ignore_index=True),
                         out / "calibrated.csv")
        write_atomic(out / "calibrated.md", CALIBRATED_HEAD + calibrate.leave_one_out_markdown(loo_summary))
        write_csv_atomic(kt, out / "kernel_checks.csv")
        write_atomic(out / "kernel_checks.md", kernel_checks.markdown(kt))
    print(files.json_text(summary, indent=1))
