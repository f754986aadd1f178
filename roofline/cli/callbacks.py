"""Hydra callback: after a multirun, one table of every job's rows, failed jobs included."""

from __future__ import annotations

import json
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from roofline.cli.entry import JOB_FILE
from roofline.io.results import aggregate_jobs


class AggregateRuns(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        summary = aggregate_jobs(sweep_dir, JOB_FILE)
        print(json.dumps(summary))
        if summary["jobs_failed"]:
            raise SystemExit(f"{len(summary['jobs_failed'])} of {summary['jobs']} jobs failed; "
                             f"the others are aggregated in {summary['aggregate']}")
