"""Fit the step-time model to a run folder: `python -m experiments.fit results_dir=results/runs/<run>`."""

import json
from pathlib import Path

import hydra

from experiments.entry import fail_fast, plain
from roofline.io.fields import ConfigError
from roofline.analysis.costmodel import FitSettings, error_table, fit_run, params_table, save_fit
from roofline.report.sections import write_costmodel_section


@hydra.main(config_path="../conf", config_name="fit", version_base="1.3")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        if c.get("results_dir") in (None, "", "???"):
            raise ConfigError("results_dir is required: a sweep run folder")
        run_dir = Path(c["results_dir"])
        settings = FitSettings(folds=c["folds"], seed=c["seed"], q_split=c["q_split"], band=tuple(c["band"]),
                               collectives=c.get("collectives") or "")
        fit, points = fit_run(run_dir, settings, sliced_dir=c["sliced_dir"])
        path = save_fit(fit, run_dir / "fit.json")
        report = write_costmodel_section(fit, points, run_dir)
        errs = error_table(fit)
        print(params_table(fit).to_string(index=False))
        print(errs[errs["regime"] == "all"].round(2).to_string(index=False))
        print(json.dumps(dict(fit=str(path), report=str(report), groups=len(fit["groups"]))))


if __name__ == "__main__":
    main()
