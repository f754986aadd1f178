"""The one adapter between Hydra and the library: plain dicts in, clean errors out."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from roofline.model.config import ConfigError

JOB_FILE = "job.json"


def plain(cfg: DictConfig) -> dict:
    """The composed config as a dict, with the command-line overrides (provenance)."""
    c = OmegaConf.to_container(cfg, resolve=True)
    c["overrides"] = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    return c


def _multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def job_dir(record: dict) -> None:
    """In a multirun, leave the job's summary where the aggregation callback looks for it."""
    if _multirun():
        out = Path(HydraConfig.get().runtime.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / JOB_FILE).write_text(json.dumps(record))


@contextmanager
def fail_fast():
    """Bad input exits 2 with the library's message (it names the field and the allowed values).

    In a multirun a failed job records its error in its job.json and returns, so the other
    jobs run and the aggregation callback sees every job (and then exits non-zero)."""
    try:
        yield
    except Exception as e:
        print(f"error: {e}", file=sys.stderr)
        if _multirun():
            job_dir(dict(status="failed", error=f"{type(e).__name__}: {e}"))
            return
        if isinstance(e, (ConfigError, ValueError)):
            sys.exit(2)
        raise
