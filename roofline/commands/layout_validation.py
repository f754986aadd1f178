"""fit the cost model on some sweeps, predict layouts it never saw

`python -m roofline.cli.layout_validation 'train=[A,B]' 'test=[C,D]' collectives=.../collectives.json`:
Does the cost model predict a layout it never saw? Fit on some sweeps, predict others.

Typical use: fit on single-rank sweeps (several depths, so the per-block fixed cost is
identified; forward and MTP steps together, one block vs many) and predict tp=2 / ep=2 sweeps
of the same shapes. The fit's byte and FLOP terms are per rank (each rank reads its shard at
the bandwidth one rank had alone), the per-block floor is counted in blocks, and the collectives
are priced by the measured collective fit (collectives.json), which the fit never adjusts.

Two things decide whether that transfers (results/parallel/README.md has the numbers):
- the training sweeps must separate the per-block cost from the weight reads. Two depths of one
  model cannot (both grow with layers); dense and MoE sweeps together can (same blocks, other
  bytes);
- the collectives must be priced at their in-step latency (`roofline.cli.collectives
  flush_bytes=...`): inside a step each collective follows a layer's weight stream, and on a
  CPU a 2 KB gloo all-reduce then costs ~1.5 ms instead of the 0.26 ms of a back-to-back loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from roofline.io import files
from roofline.analysis.costmodel import comm_seconds, features, fit_coefs, fit_rows, full_coefs, physical, terms
from roofline.io.files import write_csv_atomic, write_json_atomic
from roofline.io.results import load_run
from roofline.io.fields import ConfigError, option
from roofline.parallel import collectives


@dataclass(frozen=True)
class LayoutValidationKeys:
    """The sweeps fitted, the sweeps predicted, the collectives' price, where the files go."""

    train: tuple[str, ...] = option((), "run folders the fit sees")
    test: tuple[str, ...] = option((), "run folders it predicts (their fingerprints must not be in train)")
    collectives: str | None = option(None, "collectives.json (python -m roofline.cli.collectives) that prices "
                                               "T_comm")
    out_dir: str | None = option(None, "write layout_validation.csv / .json here")


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (LayoutValidationKeys,)


def _rows(dirs, comm_fit: dict) -> pd.DataFrame:
    frames = []
    for d in dirs:
        d = Path(d)
        if not (d / "points.jsonl").exists() and not (d / "points.csv").exists():
            raise ConfigError(f"{str(d)!r}: not a run folder (no points.jsonl / points.csv)")
        frames.append(fit_rows(load_run(d)).assign(run=d.name))
    df = pd.concat(frames, ignore_index=True)
    for col, default in (("tp", 1), ("ep", 1)):
        df[col] = df[col].fillna(default) if col in df else default
    df["collectives"] = df["collectives"].astype(object).where(df["collectives"].notna(), "") \
        if "collectives" in df else ""
    df["comm_s"] = comm_seconds(df, comm_fit)
    return df


def held_out(train_dirs, test_dirs, collectives_json, out_dir=None) -> tuple[pd.DataFrame, dict]:
    """(per-point table of the test runs, summary) from a fit on the train runs only; with
    out_dir, also written there as layout_validation.csv and .json."""
    for key, value in (("train", train_dirs), ("test", test_dirs), ("collectives", collectives_json)):
        if not value:
            raise ConfigError(f"{key} is required")
    comm_doc = collectives.load(collectives_json)
    comm_fit = comm_doc["fit"]
    train, test = _rows(train_dirs, comm_fit), _rows(test_dirs, comm_fit)
    overlap = set(train["fingerprint"]) & set(test["fingerprint"]) if "fingerprint" in train else set()
    if overlap:
        raise ConfigError(f"train and test share run fingerprints {sorted(overlap)}: the test must be unseen")
    coefs, knee = fit_coefs(train)
    t = terms(test, coefs, knee)
    test = test.assign(t_pred_s=t.sum(axis=1), comm_pred_s=t[:, 6], per_block_s=t[:, 5])
    test["error_pct"] = 100.0 * (test["t_pred_s"] / test["t_median_s"] - 1.0)
    cols = ["run", "kind", "tp", "ep", "q", "B", "L", "blocks", "t_median_s", "t_pred_s", "comm_pred_s", "error_pct"]
    table = test[[c for c in cols if c in test]]
    by = table.groupby(["kind", "tp", "ep"])["error_pct"].agg(lambda e: float(np.median(np.abs(e))))
    train_err = 100.0 * (features(train, knee) @ full_coefs(coefs) / train["t_median_s"] - 1.0)
    summary = dict(n_train=len(train), n_test=len(test), median_abs_error_pct=float(table["error_pct"].abs().median()),
                   max_abs_error_pct=float(table["error_pct"].abs().max()),
                   median_abs_error_pct_by=[dict(kind=k, tp=int(tp), ep=int(ep), value=v) for (k, tp, ep), v in by.items()],
                   train_in_sample_median_abs_pct=float(np.median(np.abs(train_err))),
                   params=physical(coefs, knee),
                   collectives_flush_bytes=int(comm_doc.get("spec", {}).get("flush_bytes", 0)), collectives_fit={k: dict(latency_us=v["latency_us"],
                                                                         algbw_GBps=v["algbw_GBps"])
                                                                  for k, v in comm_fit.items()})
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_csv_atomic(table, out / "layout_validation.csv")
        write_json_atomic(out / "layout_validation.json", summary, default=float)
    return table, summary


def run(c: dict) -> None:
    table, summary = held_out(c["train"], c["test"], c["collectives"], c["out_dir"])
    print(table.round(5).to_string(index=False))
    print(files.json_text(summary, default=float))
