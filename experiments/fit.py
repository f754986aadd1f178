"""Fit the step-time model to a run folder: `python -m experiments.fit results_dir=results/runs/<run>`."""

import json

import hydra

from experiments.entry import fail_fast, plain
from roofline.analysis.costmodel import FitSettings
from roofline.report.sections import fit_and_report


@hydra.main(config_path="../conf", config_name="fit", version_base="1.3")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        settings = FitSettings(folds=c["folds"], seed=c["seed"], q_split=c["q_split"], band=tuple(c["band"]),
                               collectives=c.get("collectives") or "")
        _, text, summary = fit_and_report(c.get("results_dir"), settings, sliced_dir=c["sliced_dir"])
        print(text)
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
