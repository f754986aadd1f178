"""Quality gates: what makes a number untrustworthy, said next to the number.

- A point that stopped on its time budget before its median's CI met the target is
  `converged=false` (the sweep row); runs list such points.
- A fitted group is refused when it has too few points, and marked (with the reason) when
  its parameters are physically impossible: an effective bandwidth above twice the device's
  measured or datasheet memory ceiling, a matmul or attention FLOP rate above twice the matmul ceiling, weight
  reads fitted as free, a negative time.
- A prediction is marked extrapolated by what it leaves: another model than the one
  measured (refused unless allowed), another dtype, another device, or a (q, B, L) outside
  the measured range.
- A speculative-decoding validation whose prediction is off by more than a factor of two
  is flagged as a gross mismatch.
"""

from __future__ import annotations

import math

MIN_POINTS = 6  # more than the fit's free parameters (t0, 1/BW, 1/BW_kv, 1/F, 1/F_attn) and its knee
CEILING_SLACK = 2.0  # a fitted roof above 2x the device's ceiling is not physics
GROSS_MISMATCH = 2.0  # predicted / measured speedup outside [1/2, 2]


def fit_problems(group: dict, ceilings: dict | None, datasheet) -> list[str]:
    """Reasons a fitted group's parameters cannot be trusted; [] when none."""
    p, out = group["params"], []
    n = group["n_points"]
    if n < MIN_POINTS:
        out.append(f"too few points: {n} < {MIN_POINTS} (the fit has 5 parameters and a knee)")
    if p["t0_ms"] < 0:
        out.append(f"negative fixed time t0 = {p['t0_ms']:.3g} ms")
    if math.isinf(p["BW_eff_GBps"]):
        out.append("weight reads fitted as free (BW_eff infinite): the points do not constrain the bandwidth")
    bw_roof, bw_src, f_roof, f_src = ceilings_for(group["key"].get("dtype"), ceilings, datasheet)
    for name in ("BW_eff_GBps", "BW_kv_GBps"):
        v = p[name]
        if bw_roof and math.isfinite(v) and v > CEILING_SLACK * bw_roof:
            out.append(f"{name} = {v:.4g} GB/s is above {CEILING_SLACK:g}x the {bw_src} of {bw_roof:.4g} GB/s")
    for name in ("F_eff_TFLOPs", "F_attn_TFLOPs"):  # attention runs on the same units: the same roof bounds it
        v = p.get(name, math.nan)
        if f_roof and math.isfinite(v) and v > CEILING_SLACK * f_roof:
            out.append(f"{name} = {v:.4g} TFLOP/s is above {CEILING_SLACK:g}x the {f_src} of {f_roof:.4g} TFLOP/s")
    for c in (group.get("term_checks") or []) if n >= MIN_POINTS else []:  # the fit's per-term gate (fit_coefs)
        if c.get("status") in ("unidentified", "at bound", "weakly identified"):
            out.append(f"term {c['term']} {c['status']}: {c['note']}")
    return out


def ceilings_for(dtype: str | None, ceilings: dict | None, datasheet) -> tuple:
    """(memory roof GB/s, its source, FLOP roof TFLOP/s, its source): the run's measured ceilings
    (ceilings.json summary) where present, else the datasheet row; None where neither has it."""
    from roofline.analysis.roofs import roofs_for
    try:
        r = roofs_for(dtype or "", ceilings, datasheet)
    except ValueError:  # a dtype without a datasheet column: the memory roof alone
        r = roofs_for("bfloat16", ceilings, datasheet)
        r = type(r)(r.dtype, r.bw_measured, None, r.bw_datasheet, None)
    scale = lambda v, k: v / k if v else None  # noqa: E731
    bw_roof, bw_src = (scale(r.bw_measured, 1e9), "measured ceiling") if r.bw_measured else \
        (scale(r.bw_datasheet, 1e9), "datasheet")
    f_roof, f_src = (scale(r.flops_measured, 1e12), "measured ceiling") if r.flops_measured else \
        (scale(r.flops_datasheet, 1e12), "datasheet")
    return bw_roof or None, bw_src, f_roof or None, f_src


def usable(group: dict) -> bool:
    return not any(r.startswith("too few points") for r in group.get("problems", []))


def extrapolation(fit: dict, model: str, dtype: str, q=None, B=None, L=None, device_name: str | None = None) -> list[str]:
    """Why a prediction for (model, dtype, device, q, B, L) leaves what the fit measured; [] when it does not."""
    out = []
    groups = fit.get("groups", [])
    fitted_models = sorted({g["key"]["model"] for g in groups})
    if model not in fitted_models:
        out.append(f"model: fit of {', '.join(fitted_models)} applied to {model}")
    dtypes = sorted({g["key"]["dtype"] for g in groups})
    if dtype not in dtypes:
        out.append(f"dtype: fitted {', '.join(dtypes)}, predicted {dtype}")
    fitted_dev = (fit.get("provenance") or {}).get("device_name")
    if device_name and fitted_dev and device_name != fitted_dev:
        out.append(f"device: fitted on {fitted_dev}, predicted for {device_name}")
    same = [g for g in groups if g["key"]["model"] == model and g["key"]["dtype"] == dtype] or groups
    for axis, v in (("q", q), ("B", B), ("L", L)):
        if v is None or not same:
            continue
        lo = min(g["domain"][axis][0] for g in same)
        hi = max(g["domain"][axis][1] for g in same)
        vals = v if isinstance(v, (list, tuple)) else [v]
        outside = [x for x in vals if not lo <= x <= hi]
        if outside:
            out.append(f"range: {axis}={outside} outside the measured [{lo}, {hi}]")
    return out


def check_model(fit: dict, model: str, allow_other_model: bool) -> None:
    """Refuse a fit of one model applied to another unless asked (allow_other_model=true)."""
    from roofline.io.fields import ConfigError
    fitted = sorted({g["key"]["model"] for g in fit.get("groups", [])})
    if fitted and model not in fitted and not allow_other_model:
        raise ConfigError(f"model {model!r}: the fit measured {fitted}; applying it to another model is a "
                          "device-fit transfer (an extrapolation): pass allow_other_model=true to do it anyway")


def untimed_note(df) -> dict:
    """ok rows whose median time is no usable number (NaN, inf, zero, negative, text): the fit
    cannot use them; counted so that the fit says how many it left out."""
    import pandas as pd
    if "status" not in df or "t_median_s" not in df:
        return {}
    ok = df[df["status"] == "ok"]
    t = pd.to_numeric(ok["t_median_s"], errors="coerce")
    bad = ok[~(t.notna() & (t > 0) & (t < float("inf")))]
    return dict(untimed_ok_rows=len(bad), untimed_examples=[str(p) for p in bad.get("point_id", pd.Series())[:3]]) \
        if len(bad) else {}


def fit_warnings(fit: dict) -> list[str]:
    out = [f"fit {g['key']['model']}/{g['key']['dtype']}/{g['key']['mode']}/{g['key']['kind']}: {r}"
           for g in fit.get("groups", []) for r in g.get("problems", [])]
    ex = fit.get("excluded") or {}
    if ex.get("untimed_ok_rows"):
        out.append(f"fit: {ex['untimed_ok_rows']} ok row(s) left out: t_median_s is not a positive finite time "
                   f"(e.g. {', '.join(ex.get('untimed_examples') or [])})")
    return out + noise_warnings(fit)


def noise_warnings(fit: dict) -> list[str]:
    """A fit that rests on points timed on a busy machine (too few clean ones to leave them out)."""
    ex = fit.get("excluded") or {}
    if ex.get("noisy_points") and not ex.get("left_out"):
        return [f"fit: {ex['noisy_points']} of {ex['of_points']} points were timed on a busy machine and are "
                "KEPT in the fit (too few clean points remain): re-measure on a quiet machine before trusting it"]
    return []


def mismatch(S_pred: float, S_meas: float) -> bool:
    """A gross mismatch: prediction and measurement more than a factor GROSS_MISMATCH apart."""
    if not (S_pred > 0 and S_meas > 0):
        return True
    return max(S_pred / S_meas, S_meas / S_pred) > GROSS_MISMATCH


def key_figure(df, ceilings: dict | None = None) -> str:
    """The headline: what fraction of the memory roof decode (q=1 forward passes) reaches (the rows' % of
    the measured ceiling, else of `ceilings`, else of the datasheet), per precision and mode where a run
    holds several (a median across them would mix kernels that reach different rooflines), the best first."""
    import numpy as np
    if df is None or df.empty or "status" not in df or "achieved_GBps" not in df:
        return "no successful decode points"
    d = df[(df["status"] == "ok") & (df["kind"] == "forward") & (df["q"] == 1)]
    if "layers_run" in d and "layers_full" in d:
        d = d[d["layers_run"] == d["layers_full"]]
    if d.empty:
        return "no successful decode (q=1) points"
    roof = ((ceilings or {}).get("summary") or {}).get("mem_bw_GBps")
    if roof and not ("pct_measured_bw" in d and d["pct_measured_bw"].notna().any()):
        d = d.assign(pct_measured_bw=100 * d["achieved_GBps"].astype(float) / roof, ceiling_bw_GBps=roof)
    keys = [k for k in ("dtype", "mode") if k in d and d[k].nunique() > 1]
    groups = [(" ".join(str(v) for v in (name if isinstance(name, tuple) else (name,))), g)
              for name, g in d.groupby(keys, sort=False)] if keys else [("", d)]
    for col, roof_col, what in (("pct_measured_bw", "ceiling_bw_GBps", "measured"),
                                ("pct_datasheet_bw", None, "datasheet")):
        if col in d and d[col].notna().any():
            parts = []
            for label, g in groups:
                pct, gb = g[col].astype(float).dropna(), g["achieved_GBps"].astype(float)
                if pct.empty:
                    continue
                top = (float(g[roof_col].dropna().iloc[0]) if roof_col and roof_col in g and g[roof_col].notna().any()
                       else float(np.median(gb / (g[col].astype(float) / 100))))
                parts.append((pct.median(), f"{pct.median():.0f}%{' in ' + label if label else ''}",
                              f"{gb.median():.3g} of {top:.3g} GB/s, median of {len(pct)} points; "
                              f"range {pct.min():.0f}-{pct.max():.0f}%"))
            parts.sort(key=lambda p: -p[0])
            if len(parts) == 1:
                return f"decode (q=1) reaches {parts[0][1]} of the {what} memory roof ({parts[0][2]})"
            return (f"decode (q=1) reaches, of the {what} memory roof, "
                    + ", ".join(f"{head} ({detail})" for _, head, detail in parts))
    gb = d["achieved_GBps"].astype(float)
    return (f"decode (q=1) moves {gb.median():.3g} GB/s (median of {len(gb)} points); no measured or datasheet "
            "roof to compare with (sweep with ceilings=quick)")


def run_warnings(run_dir, df) -> list[str]:
    """Everything a reader must know before trusting a run folder's numbers."""
    import json
    from pathlib import Path
    run_dir, out = Path(run_dir), list(getattr(df, "attrs", {}).get("load_warnings", []))
    if "status" in df:
        bad = df[df["status"] != "ok"]
        if len(bad):
            out.append(f"{len(bad)} of {len(df)} points failed ({', '.join(sorted(set(bad['status'].astype(str))))})")
        if "converged" in df:
            ok = df[(df["status"] == "ok") & ~df.get("extrapolated", False).astype(bool)]
            slow = ok[ok["converged"].astype(str).str.lower().isin(["false", "0", "0.0"])]
            if len(slow):
                worst = slow.sort_values("t_ci_rel", ascending=False).iloc[0] if "t_ci_rel" in slow else None
                out.append(f"{len(slow)} of {len(ok)} points did not converge (median's 95% CI above the target)"
                           + (f"; worst {worst['point_id']} at ±{100 * float(worst['t_ci_rel']):.0f}%"
                              if worst is not None else ""))
        if "noisy" in df:
            noisy = df[df["noisy"].astype(str).str.lower() == "true"]
            if len(noisy):
                out.append(f"{len(noisy)} of {len(df)} points were timed on a busy machine and marked noisy "
                           f"(roofline.measure.noise: left out of the fit and of the measured step table); "
                           f"e.g. {noisy.iloc[0]['point_id']}: {noisy.iloc[0].get('noise_reason')}")
    q = run_dir / "points.quarantine.jsonl"
    if q.exists():
        out.append(f"{len(q.read_text().splitlines())} bad line(s) of points.jsonl were moved to {q.name}")
    fit_path = run_dir / "fit.json"
    if fit_path.exists():
        try:
            out += fit_warnings(json.loads(fit_path.read_text()))
        except (OSError, ValueError):
            out.append("fit.json is unreadable")
    spec_csv = run_dir.parent / "specdec.csv" if run_dir.name == "sweep" else run_dir / "specdec.csv"
    if spec_csv.exists():
        import pandas as pd
        t = pd.read_csv(spec_csv)
        if {"S_pred", "S_meas"} <= set(t.columns):
            gross = t[[mismatch(p, m) for p, m in zip(t["S_pred"], t["S_meas"])]]
            for r in gross.itertuples():
                out.append(f"speculative decoding {getattr(r, 'drafter', '?')} k={getattr(r, 'k', '?')} "
                           f"B={getattr(r, 'B', '?')}: S measured {r.S_meas:.3g}, predicted {r.S_pred:.3g} "
                           f"(off by more than {GROSS_MISMATCH:g}x)")
    for col in ("busy", "machine_busy"):
        if col in df and df[col].astype(str).str.lower().isin(["true", "1", "1.0"]).any():
            out.append(f"{int(df[col].astype(str).str.lower().isin(['true', '1', '1.0']).sum())} points were "
                       "measured while the machine was busy")
    return out
