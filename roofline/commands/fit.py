"""fit the step-time cost model to a run folder

`python -m roofline.cli.fit results_dir=results/runs/<run>`: fit.json and report_costmodel.md in
the run folder, the parameters and errors on the console."""


from roofline.io import files
from roofline.analysis.costmodel import FitSettings
from roofline.report.sections import fit_and_report


def run(c: dict) -> None:
    settings = FitSettings(folds=c["folds"], seed=c["seed"], q_split=c["q_split"], band=tuple(c["band"]) if isinstance(c["band"], (list, tuple)) else c["band"],
                           collectives=c.get("collectives") or "")
    _, text, summary = fit_and_report(c.get("results_dir"), settings, sliced_dir=c["sliced_dir"])
    print(text)
    print(files.json_text(summary))
