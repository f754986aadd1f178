"""Speculative decoding measured against its prediction, in one run:
`python -m experiments.specdec model=cpu-demo` (see conf/specdec.yaml). With
`checkpoint=DIR prompts=chats.jsonl` it measures the checkpoint's real per-position
acceptance instead (the same as `python -m experiments.acceptance`)."""

import json
from pathlib import Path

import hydra

from experiments.entry import fail_fast, plain
from roofline.io.fields import from_dict
from roofline.model.config import ModelConfig
from roofline.spec.real_acceptance import AcceptanceRequest, measure_acceptance
from roofline.report.document import write_report
from roofline.io.results import RUNS_ROOT
from roofline.report.sections import write_specdec_section
from roofline.spec.validation import SpecValSpec, run_validation
from roofline.measure.timer import TimerSettings


@hydra.main(config_path="../conf", config_name="specdec", version_base="1.3")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        if c["checkpoint"]:
            out = measure_acceptance(AcceptanceRequest(
                checkpoint=c["checkpoint"], prompts=c["prompts"] or "", drafter=c["drafter"],
                draft_checkpoint=c["draft_checkpoint"], k=max(c["ks"]), max_new=c["max_new"], batch=max(c["Bs"]),
                dtype=c["dtype"], device=c["device"], seed=c["seed"]))
            print(json.dumps(out))
            return
        spec = SpecValSpec(model=ModelConfig.from_dict(c["model"]), alphas=tuple(c["alphas"]), ks=tuple(c["ks"]),
                           Bs=tuple(c["Bs"]), prompt_len=c["prompt_len"], max_new=c["max_new"], reps=c["reps"],
                           real_drafters=tuple(c["real_drafters"]), dtype=c["dtype"], device=c["device"],
                           seed=c["seed"], timer=from_dict(TimerSettings, c["timer"], "timer"))
        run_dir = Path(c["out_dir"] or RUNS_ROOT / f"specdec-{spec.model.name}")
        table = run_validation(spec, run_dir)
        write_specdec_section(table, run_dir)
        # the run's report: its sweep, cost-model fit and this validation, one document
        write_specdec_section(table, run_dir / "sweep")
        report, _ = write_report(run_dir / "sweep")
        e = table["err"].abs()
        print(table[["drafter", "k", "B", "tau_meas", "alpha_meas", "S_meas", "S_pred", "err"]].round(3).to_string(index=False))
        print(json.dumps(dict(run_dir=str(run_dir), report=str(report), points=len(table),
                              median_abs_err=float(e.median()), max_abs_err=float(e.max()))))


if __name__ == "__main__":
    main()
