"""The one adapter between Hydra and the library: plain dicts in, clean errors out."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from omegaconf import DictConfig, OmegaConf

from roofline.config import ConfigError


def plain(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


@contextmanager
def fail_fast():
    """Bad input exits 2 with the library's message (it names the field and the allowed values)."""
    try:
        yield
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
