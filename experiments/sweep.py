"""Time forward passes of a preset over a grid: `python -m experiments.sweep model=cpu-demo`.

Multirun: `python -m experiments.sweep -m model=cpu-demo,tiny 'dtypes=[bfloat16],[float32]'`
(add `hydra/launcher=submitit_local` or `hydra/launcher=slurm` to go through submitit).
A Hugging Face model folder in place of a preset: `python -m experiments.sweep checkpoint=path/to/folder`.
Several ranks: `python -m experiments.sweep tp=2 [ep=2]` (spawned here; or under torchrun / srun).
"""

import json
from pathlib import Path

from experiments.entry import axis, command, fail_fast, job_dir, plain, not_both
from roofline.checkpoints.loader import checkpoint_config
from roofline.io.fields import from_dict
from roofline.model.config import ModelConfig
from roofline.model.formats import with_overrides
from roofline.io.results import RUNS_ROOT
from roofline.measure.noise import NoiseSettings
from roofline.measure.sweep import SweepSpec, dry_run, run_sweep, summary_text
from roofline.measure.timer import TimerSettings
from roofline.parallel.layout import Layout


def build_spec(c: dict) -> SweepSpec:
    """The sweep a composed config asks for, validated (also what the device check's dry run
    calls on the GPU branch's overrides: nothing here needs the device itself)."""
    not_both(c, "checkpoint", "model")
    model = checkpoint_config(c["checkpoint"]) if c["checkpoint"] else ModelConfig.from_dict(c["model"])
    return SweepSpec(model=model, q=axis(c["q"], "q"), B=axis(c["B"], "B"),
                     L=axis(c["L"], "L"), modes=axis(c["modes"], "modes"),
                     dtypes=tuple(d if d == "auto" else with_overrides((d,), c["weights"], c["kv"], c["lm_head"], model.native_weights)[0]
                                  for d in axis(c["dtypes"], "dtypes")),
                     timer=from_dict(TimerSettings, c["timer"], "timer"), device=c["device"], layers=c["layers"],
                     mtp_q=axis(c["mtp_q"], "mtp_q"), seed=c["seed"], ceilings=c["ceilings"] or "",
                     overrides=tuple(c["overrides"]), checkpoint=c["checkpoint"] or "",
                     parallel=Layout(tp=c["tp"], ep=c["ep"], dp_attention=c["dp_attention"]))


@command("sweep")
def main(cfg) -> None:
    with fail_fast() as done:
        c = plain(cfg, device_as="torch")
        spec = build_spec(c)
        run_dir = Path(c["out_dir"]) if c["out_dir"] else spec.default_out_dir(RUNS_ROOT)
        noise = {k: v for k, v in c["noise"].items() if k != "enabled"}
        noise = NoiseSettings(**noise) if c["noise"]["enabled"] else None  # checked in a dry run too
        if c["dry_run"]:
            print(dry_run(spec, run_dir, force=c["force"], extend=c["extend"]))
            job_dir(dict(status="ok", dry_run=True))
            return
        summary = run_sweep(spec, run_dir, progress=c["progress"], force=c["force"], extend=c["extend"],
                            retry_failed=c["retry_failed"],
                            noise=noise)
        if summary is None:  # a follower rank of a torchrun / srun launch: rank 0 reports
            return
        done.summary = summary  # a signal from here on still says what was saved
        print(summary_text(run_dir))
        job_dir(dict(status="ok", **summary))
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
