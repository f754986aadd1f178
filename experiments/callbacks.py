"""Hydra callback: after a multirun, one table of every job's rows, failed jobs included."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from experiments.entry import JOB_FILE
from roofline.io.results import aggregate_jobs


def interrupted_multirun(saved: dict | None) -> None:
    """A multirun stopped by Ctrl-C or SIGTERM (Hydra calls no end callback then): the job it
    stopped records its run folder, and every finished point of every job is aggregated."""
    from hydra.core.hydra_config import HydraConfig
    hc = HydraConfig.get()
    job = Path(hc.runtime.output_dir)
    job.mkdir(parents=True, exist_ok=True)
    (job / JOB_FILE).write_text(json.dumps(dict(status="interrupted", **(saved or {}))))
    aggregate_finished()


def aggregate_finished() -> None:
    """Every finished point of every job so far, aggregated, and said on stderr."""
    from hydra.core.hydra_config import HydraConfig
    summary = aggregate_jobs(Path(HydraConfig.get().sweep.dir), JOB_FILE)
    print(f"multirun interrupted: {summary['rows']} points saved across {summary['jobs']} job(s), "
          f"aggregated in {summary['aggregate']}", file=sys.stderr)


class AggregateRuns(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        summary = aggregate_jobs(sweep_dir, JOB_FILE)
        print(json.dumps(summary))
        if summary["jobs_failed"]:
            raise SystemExit(f"{len(summary['jobs_failed'])} of {summary['jobs']} jobs failed; "
                             f"the others are aggregated in {summary['aggregate']}")
