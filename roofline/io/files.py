"""Writes that are never half-done: a reader sees the old file or the new one, never a torn one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write `data` to a temporary file beside `path`, fsync it, then rename it over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def write_json_atomic(path: str | Path, doc, indent: int | None = 1, default=str) -> Path:
    """`doc` as JSON; `default` converts what json cannot (str; float for numpy scalars)."""
    return write_atomic(path, json.dumps(doc, indent=indent, default=default))


def write_csv_atomic(df: pd.DataFrame, path: str | Path) -> Path:
    return write_atomic(path, df.to_csv(index=False))
