"""Two runs side by side: the same points joined, the ratio of their median step times, and
whether the difference is larger than the noise.

The noise test is the timer's own: each median's distribution-free 95% CI (from the saved
repetitions in samples.jsonl, else the row's t_ci_rel). Two medians differ beyond the noise
when their intervals do not overlap. ratio = T_b / T_a (above 1: b is slower).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from roofline.io import results
from roofline.measure.timer import median_ci
from roofline.io.fields import ConfigError

KEYS = ["point_id", "kind", "dtype", "mode", "q", "B", "L"]


def _ok_points(run_dir: Path | None, field: str) -> pd.DataFrame:
    df = results.load_run(run_dir, field)  # None (a required key left unset): "a is required"
    run_dir = Path(run_dir)
    if "t_median_s" not in df or "status" not in df:
        raise ConfigError(f"{field}={str(run_dir)!r}: no measured points (every point failed)")
    df = df[df["status"] == "ok"].copy()
    samples = results.read_samples(run_dir)
    lo, hi = [], []
    for pid, med, rel in zip(df["point_id"], df["t_median_s"], df.get("t_ci_rel", pd.Series(np.nan, df.index))):
        s = samples.get(pid)
        if s:
            a, b = median_ci(s)
        elif rel is not None and math.isfinite(rel):
            a, b = med * (1 - rel), med * (1 + rel)
        else:
            a, b = math.nan, math.nan
        lo.append(a)
        hi.append(b)
    return df.assign(ci_lo_s=lo, ci_hi_s=hi, n=df.get("t_n", pd.Series(np.nan, df.index)),
                     from_samples=[pid in samples for pid in df["point_id"]])


def _models(df: pd.DataFrame) -> list[str]:
    return sorted(set(df["model"].astype(str))) if "model" in df else []


def check_threshold(fail_above) -> float | None:
    """compare's CI threshold: a ratio b/a above which a point beyond the noise is a regression."""
    if fail_above is None:
        return None
    if isinstance(fail_above, bool) or not isinstance(fail_above, (int, float)) or not 1 <= fail_above < math.inf:
        raise ConfigError(f"fail_above={fail_above!r}: allowed null or a ratio >= 1 (1.05: fail when a point is "
                          "more than 5% slower in b, beyond the noise)")
    return float(fail_above)


def compare_runs(a, b, allow_other_model: bool = False, fail_above: float | None = None) -> tuple[pd.DataFrame, dict]:
    """(one row per point in both runs, summary) for run folders a and b. Runs of different
    models are refused unless allow_other_model (their point ids may coincide). With
    `fail_above`, summary["regressions"] counts the points slower in b beyond the noise by
    more than that ratio (the CLI then exits non-zero)."""
    threshold = check_threshold(fail_above)
    A, B = _ok_points(a, "a"), _ok_points(b, "b")
    if _models(A) != _models(B) and not allow_other_model:
        raise ConfigError(f"a={str(a)!r} is a run of {_models(A)}, b={str(b)!r} of {_models(B)}: compare joins runs of "
                          "one model; allow_other_model=true joins them anyway (point by point id)")
    keys = [k for k in KEYS if k in A and k in B]
    m = A[keys + ["t_median_s", "ci_lo_s", "ci_hi_s", "n"]].merge(
        B[keys + ["t_median_s", "ci_lo_s", "ci_hi_s", "n"]], on=keys, suffixes=("_a", "_b"))
    if m.empty:
        raise ConfigError(f"a={str(a)!r}, b={str(b)!r}: no ok point in common (compare runs of the same grid)")
    m["ratio"] = m["t_median_s_b"] / m["t_median_s_a"]
    unknown = m[["ci_lo_s_a", "ci_hi_s_a", "ci_lo_s_b", "ci_hi_s_b"]].isna().any(axis=1)
    apart = (m["ci_hi_s_a"] < m["ci_lo_s_b"]) | (m["ci_hi_s_b"] < m["ci_lo_s_a"])
    m["beyond_noise"] = apart & ~unknown
    m["verdict"] = np.where(unknown, "no CI", np.where(~apart, "same within noise",
                                                       np.where(m["ratio"] > 1, "b slower", "b faster")))
    dev = lambda df: sorted(set(df["device_name"].astype(str))) if "device_name" in df else []  # noqa: E731
    summary = dict(a=str(a), b=str(b), points_compared=len(m), only_in_a=int((~A["point_id"].isin(m["point_id"])).sum()),
                   only_in_b=int((~B["point_id"].isin(m["point_id"])).sum()),
                   geomean_ratio=float(np.exp(np.log(m["ratio"]).mean())),
                   beyond_noise=int(m["beyond_noise"].sum()), b_slower=int((m["verdict"] == "b slower").sum()),
                   b_faster=int((m["verdict"] == "b faster").sum()), device_a=dev(A), device_b=dev(B),
                   model_a=_models(A), model_b=_models(B), fail_above=threshold,
                   regressions=None if threshold is None else
                   int(((m["verdict"] == "b slower") & (m["ratio"] > threshold)).sum()))
    return m, summary


def format_comparison(m: pd.DataFrame, summary: dict) -> str:
    t = pd.DataFrame({"point": m["point_id"], "a ms": 1e3 * m["t_median_s_a"], "b ms": 1e3 * m["t_median_s_b"],
                      "b/a": m["ratio"], "a 95% CI ms": [f"{1e3 * x:.4g}-{1e3 * y:.4g}" for x, y in
                                                          zip(m["ci_lo_s_a"], m["ci_hi_s_a"])],
                      "b 95% CI ms": [f"{1e3 * x:.4g}-{1e3 * y:.4g}" for x, y in zip(m["ci_lo_s_b"], m["ci_hi_s_b"])],
                      "verdict": m["verdict"]})
    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.max_colwidth", 60):
        table = t.round(4).to_string(index=False)
    head = (f"{summary['points_compared']} points in both runs (ratio = b/a of the median step time): geometric "
            f"mean {summary['geomean_ratio']:.3f}; {summary['beyond_noise']} differ beyond the noise "
            f"({summary['b_slower']} b slower, {summary['b_faster']} b faster; 95% CIs of the medians do not "
            f"overlap); only in a: {summary['only_in_a']}, only in b: {summary['only_in_b']}")
    if summary["device_a"] != summary["device_b"]:
        head += f"\nwarning: different devices: a {summary['device_a']}, b {summary['device_b']}"
    if summary.get("model_a") != summary.get("model_b"):
        head += f"\nwarning: different models: a {summary['model_a']}, b {summary['model_b']}"
    if summary.get("regressions"):
        head += (f"\nREGRESSION: {summary['regressions']} point(s) slower in b by more than "
                 f"{summary['fail_above']:g}x, beyond the noise")
    return head + "\n" + table


def write_table(m: pd.DataFrame, out) -> Path:
    """The joined table as CSV at `out`; a folder that does not exist is bad input naming `out`."""
    out = Path(out)
    if not out.parent.is_dir():
        raise ConfigError(f"out={str(out)!r}: no such folder {str(out.parent)!r}")
    m.to_csv(out, index=False)
    return out
