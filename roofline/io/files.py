"""Writes that are never half-done: a reader sees the old file or the new one, never a torn one."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd

from roofline.io.fields import ConfigError

# the folder holding roofline/ (a checkout, or site-packages); results/ lives beside it in a checkout
REPO_ROOT = Path(__file__).resolve().parents[2]


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write `data` to a temporary file beside `path`, fsync it, then rename it over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, a Ctrl-C: no half-written temporary file is left behind
        tmp.unlink(missing_ok=True)
        raise
    return path


def _strict(doc, default):
    """`doc` with NaN and infinities as null (JSON has no such numbers) and what json cannot
    hold converted by `default` first."""
    if isinstance(doc, dict):
        return {k: _strict(v, default) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_strict(v, default) for v in doc]
    if isinstance(doc, (str, int, bool)) or doc is None:
        return doc
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    return _strict(default(doc), default) if default is not None else doc


def json_text(doc, indent: int | None = None, default=str) -> str:
    """Strict JSON (RFC 8259: no NaN, no Infinity; they become null), as every reader parses it."""
    return json.dumps(_strict(doc, default), indent=indent, allow_nan=False)


def write_json_atomic(path: str | Path, doc, indent: int | None = 1, default=str) -> Path:
    """`doc` as strict JSON (NaN/inf as null); `default` converts what json cannot (str; float for numpy scalars)."""
    return write_atomic(path, json_text(doc, indent=indent, default=default))


def write_csv_atomic(df: pd.DataFrame, path: str | Path) -> Path:
    return write_atomic(path, df.to_csv(index=False))


def read_json(path: str | Path, where: str, what: str = "the file", obj: bool = False):
    """The JSON document at `path`, which the user gave as `where` (e.g. "overhead='x.json'"):
    a missing file, one that is not JSON or (obj=True) not a JSON object is ConfigError naming
    `where` and `what` (not the decoder's bare 'line 2 column 1')."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{where}: no such file")
    try:
        doc = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: {what} is not JSON ({e})") from None
    if obj and not isinstance(doc, dict):
        raise ConfigError(f"{where}: {what} is not a JSON object (a JSON {type(doc).__name__})")
    return doc
