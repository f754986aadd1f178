"""Atomic file writes: a reader (or a run that resumes after a crash) sees the old file or
the new one, never half of one. Write beside the target, flush to disk, rename over it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd


def write_text(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def write_json(path: str | Path, obj: Any, indent: int | None = 1, default=str) -> Path:
    return write_text(path, json.dumps(obj, indent=indent, default=default))


def write_csv(df: pd.DataFrame, path: str | Path) -> Path:
    return write_text(path, df.to_csv(index=False))
