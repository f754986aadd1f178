"""When a layer-sliced extrapolation can be trusted, and why not when it cannot.

A sliced sweep times n and 2n layers and extrapolates T(ℓ) = (1 − m)·T_n + m·T_2n with the
lever m = (ℓ − n)/n. The lever multiplies the measurement error: with 95% confidence
half-widths c_n, c_2n of the two medians (the timer's `ci_rel`), the extrapolated median's is

    δ = sqrt(((m − 1)·c_n·T_n)² + (m·c_2n·T_2n)²) / T(ℓ)

A point whose δ exceeds `max_rel_err` (10%), or whose inputs the busy-machine check marked
noisy (roofline.measure.noise), is not extrapolated: its full-depth row gets status
"refused" and the reason, and the fit never sees it. δ is the statistical part only; the
physical part (does the per-layer cost stay the same from 2n to ℓ layers?) is what the
fit's "train on fewer layers, predict full depth" split measures when a full-depth run exists.
"""

from __future__ import annotations

import math

import pandas as pd

from roofline.io.fields import ConfigError
from roofline.io.results import load_run

MAX_REL_ERR = 0.10


def _flag(row: dict) -> bool:
    v = row.get("noisy")
    return v is True or str(v).lower() == "true"


def judge(shallow: dict, deep: dict, layers_full: int, max_rel_err: float = MAX_REL_ERR) -> dict:
    """Columns for the extrapolated row: its 95% relative uncertainty, and status "ok" or
    "refused" with the reason."""
    n, n2 = shallow["layers_run"], deep["layers_run"]
    m = (layers_full - n) / (n2 - n)
    t_n, t_2n = shallow["t_median_s"], deep["t_median_s"]
    t = (1 - m) * t_n + m * t_2n
    c_n, c_2n = (float(r.get("t_ci_rel") or math.nan) for r in (shallow, deep))
    rel = math.hypot((m - 1) * c_n * t_n, m * c_2n * t_2n) / t if t > 0 else math.inf
    why = None
    if _flag(shallow) or _flag(deep):
        why = f"the {n}- or {n2}-layer time was marked noisy (busy machine)"
    elif not rel <= max_rel_err:  # NaN (no CI recorded) refuses too
        why = (f"extrapolating {n},{n2} -> {layers_full} layers multiplies the medians' 95% CI "
               f"({100 * c_n:.1f}%, {100 * c_2n:.1f}%) by a lever of {m:.1f}: +-{100 * rel:.0f}% > "
               f"{100 * max_rel_err:.0f}%; measure longer (timer.rel_ci, timer.budget_s) or slice deeper (layers=)")
    return dict(extrapolation_rel_err=rel, status="refused" if why else "ok", error=why)


def slicing_error(full: pd.DataFrame, sliced: pd.DataFrame) -> pd.DataFrame:
    """Extrapolated full-depth times of a sliced run against a full-depth run of the same points:
    relative error (extrapolated / measured − 1) per point."""
    keys = ["kind", "dtype", "mode", "q", "B", "L"]
    for name, t, need in (("full_dir", full, ["status", "layers_run", "layers_full", "t_median_s"]),
                          ("sliced_dir", sliced, ["extrapolated", "t_median_s", "layers_measured"])):
        missing = [c for c in keys + need if c not in t.columns]
        if missing:
            raise ConfigError(f"{name}: the run has no {missing} columns (every point failed, or a "
                              + ("sliced run (layers=n)" if name == "sliced_dir" else "sweep") + " is needed)")
    f = full[(full["status"] == "ok") & (full["layers_run"] == full["layers_full"]) & (~full["extrapolated"].astype(bool))]
    s = sliced[sliced["extrapolated"].astype(bool)]
    m = f[keys + ["t_median_s"]].merge(s[keys + ["t_median_s", "layers_measured", "status"]], on=keys,
                                       suffixes=("_measured", "_extrapolated"))
    if m.empty:
        raise ConfigError("full_dir, sliced_dir: no point in common (the sliced run needs layers=n and the same "
                          "grid as a full-depth run of the same model)")
    m["rel_err"] = m["t_median_s_extrapolated"] / m["t_median_s_measured"] - 1
    return m


def slicing_check(full_dir, sliced_dir) -> tuple[pd.DataFrame, dict]:
    """The slicing command: per-point error of a sliced run's extrapolation against a full-depth
    run of the same grid, and its summary (errors as fractions of the measured time)."""
    t = slicing_error(load_run(full_dir, "full_dir"), load_run(sliced_dir, "sliced_dir"))
    e = t["rel_err"].abs()
    ok = t["status"] == "ok"
    return t, dict(points=len(t), median_abs_err=float(e.median()), max_abs_err=float(e.max()),
                   mean_signed_err=float(t["rel_err"].mean()), refused=int((~ok).sum()),
                   median_abs_err_not_refused=float(e[ok].median()) if ok.any() else None)
