"""Fit the step-time model to a run folder: `python -m experiments.fit results_dir=results/runs/<run>`."""

import json

from experiments.entry import command, fail_fast, plain
from roofline.analysis.costmodel import FitSettings
from roofline.report.sections import fit_and_report


@command("fit")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        settings = FitSettings(folds=c["folds"], seed=c["seed"], q_split=c["q_split"], band=tuple(c["band"]) if isinstance(c["band"], (list, tuple)) else c["band"],
                               collectives=c.get("collectives") or "")
        _, text, summary = fit_and_report(c.get("results_dir"), settings, sliced_dir=c["sliced_dir"])
        print(text)
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
