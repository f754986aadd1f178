"""fit the step-time cost model to a run folder

`python -m roofline.cli.fit results_dir=results/runs/<run>`: fit.json and report_costmodel.md in
the run folder, the parameters and errors on the console."""

from dataclasses import dataclass

from roofline.analysis import costmodel, quality
from roofline.analysis.costmodel import FitSettings
from roofline.io import files
from roofline.io.fields import option
from roofline.report.sections import fit_and_save


@dataclass(frozen=True)
class FitKeys:
    """The run folders the fit reads (the fit's own settings: roofline.analysis.costmodel.FitSettings)."""

    results_dir: str = option(help="a sweep run folder (points.csv / points.jsonl, run.json)")
    sliced_dir: str | None = option(None, "a layer-sliced run of the same model and grid (layers=n): adds the "
                                          "\"fewer layers -> full depth\" split")


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (FitKeys, FitSettings)


def run(c: dict) -> None:
    settings = FitSettings(folds=c["folds"], seed=c["seed"], q_split=c["q_split"], band=tuple(c["band"]) if isinstance(c["band"], (list, tuple)) else c["band"],
                           collectives=c.get("collectives") or "")
    fit, fit_path, report = fit_and_save(c.get("results_dir"), settings, sliced_dir=c["sliced_dir"])
    errs = costmodel.error_table(fit)
    print("\n".join([costmodel.params_table(fit).to_string(index=False),
                     errs[errs["regime"] == "all"].round(2).to_string(index=False)]
                    + [f"warning: {w}" for w in quality.fit_warnings(fit)]))
    print(files.json_text(dict(fit=str(fit_path), report=str(report), groups=len(fit["groups"]))))
