"""The one results schema: an append-only JSONL per run, a CSV for people and pandas.

A run folder holds `run.json` (what was asked), `points.jsonl` (one line per completed
point, written and fsynced as the point completes) and `points.csv` (the table, rebuilt
from the JSONL). A run killed at any moment leaves at worst one torn last line, which the
next start drops before appending; a point is done iff its line is complete, so a resumed
run neither loses nor repeats a point.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import pandas as pd

from roofline.io import files
from roofline.io.files import REPO_ROOT
from roofline.io import runfolder
# the row schema's version, its statuses and the corrections file are runfolder's (which checks rows)
from roofline.io.runfolder import CORRECTIONS, SCHEMA_VERSION, STATUSES  # noqa: F401


def runs_root() -> Path:
    """The one results root every command writes under unless told otherwise: $ROOFLINE_RESULTS,
    else results/runs of the source checkout, else results/runs under the working directory
    (an installed package never writes into site-packages)."""
    if os.environ.get("ROOFLINE_RESULTS"):
        return Path(os.environ["ROOFLINE_RESULTS"])
    if (REPO_ROOT / "pyproject.toml").is_file():
        return REPO_ROOT / "results" / "runs"
    return Path.cwd() / "results" / "runs"


RUNS_ROOT = runs_root()  # default output root (not committed)

# Columns every row has, in order; physics columns are NaN on failed rows.
KEY_COLUMNS = ["point_id", "kind", "model", "dtype", "mode", "q", "B", "L", "layers_run", "layers_full"]
TIMING_COLUMNS = ["t_median_s", "t_p10_s", "t_p90_s", "t_p99_s", "t_mean_s", "t_min_s", "t_cv", "t_n", "t_ci_rel",
                  "t_stopped_by", "t_clock", "t_l2", "t_threads", "t_cpu_share"]
PHYSICS_COLUMNS = ["kv_len", "tokens", "moe_impl", "experts_touched", "weight_bytes", "expert_bytes",
                   "kv_read_bytes", "kv_write_bytes", "embed_bytes", "mask_bytes", "activation_bytes_est", "bytes_total",
                   "flops_matmul", "flops_attention", "flops", "intensity", "achieved_GBps",
                   "achieved_TFLOPs", "tokens_per_s", "ridge_datasheet", "bound_datasheet",
                   "pct_datasheet_bw", "pct_datasheet_flops",
                   "attn_backend", "kernels_per_forward", "kernels_counted",  # what the forward ran (measure.forward)
                   "energy_J_per_token"]  # NVML's counter over the step / (B·q), or 'n/a (why)' (measure.telemetry)
CEILING_COLUMNS = ["ceiling_bw_GBps", "ceiling_TFLOPs", "ridge_measured", "pct_measured_bw",
                   "pct_measured_flops", "bound_measured"]  # present when the sweep had a ceilings file
STATUS_COLUMNS = ["status", "error", "converged", "extrapolated", "schema_version"]


def append_row(path: Path, row: dict) -> None:
    line = json.dumps(row, default=str, allow_nan=True)
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


SAMPLES = "samples.jsonl"  # every repetition's time of each ok point, one line per point


def append_samples(run_dir: Path, point_id: str, samples_s: list[float]) -> None:
    append_row(Path(run_dir) / SAMPLES, dict(point_id=point_id, samples_s=[float(t) for t in samples_s]))


def read_samples(run_dir: Path) -> dict[str, list[float]]:
    """point_id -> the repetition times (s) of a run folder; the last line of a point wins."""
    out = {}
    for r in read_rows(Path(run_dir) / SAMPLES):
        if isinstance(r, dict) and isinstance(r.get("samples_s"), list):
            out[r.get("point_id")] = r["samples_s"]
    return out


def read_rows(path: Path, repair: bool = False) -> list[dict]:
    """Complete rows of a JSONL; a line that does not parse is skipped (the rows after it are
    kept); a torn last line (a kill mid-write) is dropped, and with repair=True cut from the
    file so that appending continues on a line boundary."""
    path = Path(path)
    if not path.exists():
        return []
    raw = path.read_bytes()
    rows, good_end, start = [], 0, 0
    while True:
        nl = raw.find(b"\n", start)
        if nl < 0:
            break
        try:
            rows.append(json.loads(raw[start:nl]))
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass
        good_end = start = nl + 1
    if repair and good_end < len(raw):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return rows


def to_frame(rows: Iterable[dict]) -> pd.DataFrame:
    df = pd.DataFrame(list(rows))
    known = KEY_COLUMNS + TIMING_COLUMNS + PHYSICS_COLUMNS + CEILING_COLUMNS + STATUS_COLUMNS
    order = [c for c in known if c in df.columns]
    return df[order + [c for c in df.columns if c not in order]]


def write_csv(rows: Iterable[dict], path: Path) -> pd.DataFrame:
    df = to_frame(rows)
    files.write_csv_atomic(df, path)
    return df


def load_run(run_dir: Path, field: str = "results_dir") -> pd.DataFrame:
    """The table of a run folder; bad input names `field`.

    points.jsonl is the record (every row is appended as its point finishes); points.csv is the
    table the sweep rebuilds at its end (with the extrapolated rows of a sliced run). The csv is
    used only while it holds every valid row of the jsonl; otherwise (a sweep killed before its
    end, an unreadable csv) the table is rebuilt from the jsonl. Bad jsonl lines are skipped
    (the rows after them kept) with the checks of the resume. What was done is said in
    `df.attrs["load_warnings"]` (roofline.analysis.quality.run_warnings shows it) and on stderr."""
    import sys

    from roofline.io.fields import ConfigError
    if run_dir is None or str(run_dir).strip() in ("", "None"):
        raise ConfigError(f"{field} is required: a run folder holding points.csv or points.jsonl")
    run_dir = Path(run_dir)
    csv, jsonl = run_dir / "points.csv", run_dir / runfolder.POINTS
    if not (csv.is_file() or jsonl.is_file()):
        raise ConfigError(f"{field}={str(run_dir)!r}: not a run folder (no points.csv or points.jsonl)")
    warnings, rows, bad = [], [], []
    if jsonl.is_file():
        rows, bad = runfolder.read_points(run_dir)
        rows = apply_corrections(run_dir, rows)
        if bad:
            warnings.append(f"{len(bad)} bad line(s) of {jsonl.name} skipped (first: line {bad[0]['line']}, "
                            f"{bad[0]['reason']}); {len(rows)} valid rows read")
    df = None
    if csv.is_file():
        try:
            df = pd.read_csv(csv)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            if not jsonl.is_file():
                raise ConfigError(f"{field}={str(run_dir)!r}: {csv.name} is unreadable "
                                  f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
            warnings.append(f"{csv.name} is unreadable ({type(e).__name__}); the table is rebuilt from {jsonl.name}")
    if df is not None and jsonl.is_file():
        have = set(df["point_id"].astype(str)) if "point_id" in df else set()
        missing = [r["point_id"] for r in rows if r["point_id"] not in have]
        if missing:
            warnings.append(f"{csv.name} is stale: it lacks {len(missing)} of the {len(rows)} rows of {jsonl.name} "
                            f"(the sweep was stopped before its end; the same sweep command rebuilds it); "
                            f"the table is rebuilt from {jsonl.name}"
                            + (" without the extrapolated full-depth rows" if df.get("extrapolated", pd.Series(
                                dtype=object)).astype(str).str.lower().eq("true").any() else ""))
            df = None
    if df is None:
        df = to_frame(rows)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    df.attrs["load_warnings"] = warnings
    return df


def aggregate(run_dirs: Iterable[Path], out_csv: Path) -> pd.DataFrame:
    """Concatenate the tables of several runs (a multirun's jobs); a folder without points
    (a job that failed before its first point) contributes no rows."""
    frames = [load_run(d).assign(run_dir=str(d)) for d in run_dirs if (Path(d) / "points.jsonl").exists()]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    df.to_csv(out_csv, index=False)
    return df


def aggregate_jobs(sweep_dir: Path, job_file: str) -> dict:
    """One table (sweep_dir/aggregate.csv) from a multirun's job folders. A job that failed
    left no job file: it is counted and named, and the other jobs' rows still aggregate."""
    sweep_dir = Path(sweep_dir)
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit())
    run_dirs, failed = [], []
    for j in jobs:
        f = j / job_file
        job = json.loads(f.read_text()) if f.exists() else dict(status="failed", error="no job file")
        if job.get("run_dir"):
            run_dirs.append(Path(job["run_dir"]))
        if job.get("status") != "ok":
            failed.append(dict(job=j.name, error=job.get("error")))
    df = aggregate(run_dirs, sweep_dir / "aggregate.csv")
    return dict(aggregate=str(sweep_dir / "aggregate.csv"), jobs=len(jobs), jobs_failed=failed, rows=len(df))


# --------------------------------------------------------------------------- corrections
# A row is written the moment its point is measured; what is learnt about it later (the
# busy-machine verdict, a re-measurement: roofline.measure.noise) is appended here, never
# held back. Readers of points.jsonl apply them; points.csv is written with them applied.
def append_correction(run_dir: Path, point_id: str, fields: dict) -> None:
    """Amend the row of `point_id`: `fields` replace the row's own (appended and fsynced)."""
    append_row(Path(run_dir) / CORRECTIONS, dict(point_id=point_id, set=fields))


def apply_corrections(run_dir: Path, rows: list[dict]) -> list[dict]:
    """`rows` (of run_dir's points.jsonl, in file order) with run_dir's corrections applied in
    the order they were appended; a correction of a point not among `rows` is ignored."""
    fixes: dict[str, dict] = {}
    for c in read_rows(Path(run_dir) / CORRECTIONS):
        if isinstance(c, dict) and isinstance(c.get("point_id"), str) and isinstance(c.get("set"), dict):
            fixes.setdefault(c["point_id"], {}).update(c["set"])
    if not fixes:
        return rows
    return [{**r, **fixes[r["point_id"]]} if isinstance(r, dict) and r.get("point_id") in fixes else r for r in rows]
