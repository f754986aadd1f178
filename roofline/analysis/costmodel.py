"""A fitted step-time model T(q, B, L) per (device, model, dtype, mode, kind), with honest errors.

Form (linear in its physical parameters, one knee chosen by search):

    T = t0 + W / BW_eff + KV / BW_kv + F_mm · max(0, 1 − m0 / N) / F_eff + F_attn / F_at

W = weight bytes read once per forward (dense weights + the experts the batch touched + the
gathered embedding rows), KV = KV-cache bytes read and written, F_mm = matmul FLOPs,
F_attn = attention FLOPs, N = B·q tokens in the pass, m0 = the knee (tokens).

Why this form: the roofline max(W/BW, F_mm/F) is NOT linear in 1/BW and 1/F, but it is
exactly W/BW + max(0, (N − m0)·f/F) with f = F_mm/N the FLOPs per token and m0 = W·F/(f·BW)
the ridge in tokens. Freeing m0 from the ridge (it is chosen by a 1-D search over the measured
token counts, minimising the relative fit error) lets the knee sit where the kernels really
switch (GEMV → GEMM, split-K): "flat, then linear in q". For a fixed m0 every term is linear in
(t0, 1/BW_eff, 1/BW_kv, 1/F_eff, 1/F_at), so the fit is scipy.optimize.nnls (non-negative:
no negative bandwidths) on relative residuals (rows scaled by 1/T: a 1 ms and a 100 ms point
weigh the same). Because W/f ≈ bytes per weight / 2 for every model, m0 in tokens is a property
of device + dtype + kernels, which is what lets a fit be transferred to an unmeasured preset.

Honesty: K-fold held-out errors (the knee is searched again inside each fold), four
extrapolation tests (train on q <= q_split, predict q > q_split; train on the smallest B,
predict larger B; train on the shorter contexts, predict the longest L; train on fewer
layers, predict full depth — when the run folder holds sliced depths beside full-depth
measurements), and two baselines on the same points: the plain roofline max(bytes/BW,
FLOPs/F) with the run's ceilings (ceilings.json) or the datasheet, and "verify is free"
T(q) = T(1) measured at the same (B, L). Errors are signed relative errors pred/meas − 1.

Points a sweep marked as timed on a busy machine (`noisy`, roofline.measure.noise) are left
out of the fit and its errors; the report says how many. Prediction inside the measured
range uses the measured table (roofline.analysis.steptable), the fit outside it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, nnls

from roofline.analysis.roofs import predict_step_time, roofs_for

from roofline.analysis import quality
from roofline.io import files
from roofline.measure import provenance
from roofline.model.accounting import forward_cost, moe_impl_for_mode, mtp_cost
from roofline.io.fields import ConfigError, option
from roofline.model.config import ModelConfig
from roofline.io.results import load_run
from roofline.measure.devices import detect
from roofline.analysis.steptable import StepModel, kernel_factor, measured_table

FIT_SCHEMA = "roofline.fit/1"
GROUP_KEYS = ("device_name", "model", "dtype", "mode", "kind")
TERMS = ("t0", "weights", "kv", "matmul", "attention", "per_layer", "comm")
COEF_UNITS = ["s", "s/B", "s/B", "s/FLOP", "s/FLOP", "s/block", "1 (collectives.json fit, not fitted here)"]
# The held-out use of the measured step table (roofline.analysis.steptable): the split's fit
# times the trained rows' measured/fitted ratio at the same (q, B), as predict does past the
# measured contexts; n counts the test rows whose (q, B) were trained.
TABLE_METHOD = "fit x measured kernel factor at (q,B)"
ERROR_COLUMNS = ("split", "method", "regime", "n", "MAPE_pct", "median_abs_pct", "max_abs_pct", "bias_pct")

FORM = ("T = t0 + W / BW_eff + KV / BW_kv + F_mm * max(0, 1 - m0 / N) / F_eff + F_attn / F_at + n_blocks * t_layer "
        "+ T_comm; W weight bytes, KV cache bytes read + written, F_mm matmul FLOPs, F_attn attention FLOPs (all per "
        "rank), N = B*q tokens, m0 the knee (tokens), n_blocks decoder blocks run (fitted only when the rows vary it), "
        "T_comm the forward's collectives priced by the measured collective fit (latency + bytes / bandwidth)")


@dataclass(frozen=True)
class FitSettings:
    folds: int = option(5, "K of the K-fold held-out error")
    seed: int = option(0, "fold assignment")
    q_split: int = option(16, "extrapolation test: train on q <= q_split, predict q > q_split")
    band: tuple[float, float] = option((0.1, 0.9), "quantiles of held-out pred/meas giving the prediction interval")
    collectives: str = option("", "a collectives.json (python -m roofline.cli.collectives) pricing the rows' "
                                  "collectives; empty or null: the run folder's")

    def __post_init__(self) -> None:
        from roofline.analysis.fitcheck import check_fit_settings
        check_fit_settings(self)


# ---- the model ----------------------------------------------------------------------------

def _col(df, name: str) -> np.ndarray:
    return np.asarray(df[name], dtype=float) if name in df else np.zeros(len(df))


def blocks(df: pd.DataFrame) -> np.ndarray:
    """Decoder blocks each row ran: the `blocks` column, else layers_run (forward) or 1 (an MTP module)."""
    if "blocks" in df and df["blocks"].notna().all():
        return _col(df, "blocks")
    mtp = np.asarray(df["kind"] == "mtp") if "kind" in df else np.zeros(len(df), bool)
    return np.where(mtp, 1.0, _col(df, "layers_run"))


def features(df: pd.DataFrame, knee: float) -> np.ndarray:
    """Columns [1, W, KV, F_mm·max(0, 1 − m0/N), F_attn, n_blocks, T_comm] of the form above
    (bytes, FLOPs, blocks, seconds; T_comm is the `comm_s` column, 0 where absent)."""
    tokens = np.maximum(_col(df, "tokens"), 1.0)
    w = _col(df, "weight_bytes") + _col(df, "embed_bytes")
    kv = _col(df, "kv_read_bytes") + _col(df, "kv_write_bytes")
    mm = _col(df, "flops_matmul") * np.maximum(0.0, 1.0 - knee / tokens)
    return np.column_stack([np.ones(len(df)), w, kv, mm, _col(df, "flops_attention"), blocks(df), _col(df, "comm_s")])


def full_coefs(coefs) -> np.ndarray:
    """Coefficients of every TERMS column (fits written before the per-layer and comm terms have 5)."""
    c = np.zeros(len(TERMS))
    c[:len(coefs)] = coefs
    if len(coefs) < len(TERMS):
        c[-1] = 1.0
    return c


ROBUST_SCALE = 0.05  # relative residual beyond which a point's pull grows only linearly
ID_SHARE = 0.01  # a design column with < 1% of its norm outside the other columns' span is not identified


def _solve(X: np.ndarray, y: np.ndarray, offset: np.ndarray | None = None,
           lower: np.ndarray | None = None) -> np.ndarray:
    """Bounded fit of relative residuals (columns scaled for conditioning): coefficients >= `lower`
    (0 where not given: no negative bandwidths; a rate's bound where the hardware caps it), nnls of
    the shifted problem for the start, then scipy's least_squares with those bounds and a soft-L1
    loss, so a few points timed while the machine was busy (shared CPUs) do not drag the physics. A column
    the points do not see (all zero: a matmul hinge whose knee lies at or above every point's tokens) takes
    its bound, the hardware's rate: the optimiser would leave it wherever its start put it, and a point
    beyond the knee (a held-out fold's) would be priced by that arbitrary value."""
    A = X / y[:, None]
    scale = np.abs(A).max(axis=0)
    unseen = scale == 0
    scale[unseen] = 1.0
    A = A / scale
    lb = np.zeros(X.shape[1]) if lower is None else np.asarray(lower, float) * scale
    target = np.ones(len(y)) if offset is None else 1.0 - offset / y  # a known term (T_comm) moved to the left
    d, _ = nnls(A, target - A @ lb, maxiter=50 * X.shape[1])  # z = lb + d, d >= 0
    z = lb + d
    if len(y) > X.shape[1]:
        z = least_squares(lambda v: A @ v - target, np.maximum(z, lb + 1e-9), jac=lambda v: A,
                          bounds=(lb, np.inf), loss="soft_l1", f_scale=ROBUST_SCALE, method="trf").x
    z[unseen] = lb[unseen]
    return z / scale


def outside_share(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per design column: the share of its (relative, scaled) norm outside the span of the other
    columns; ~0 when the grid cannot tell that term from the others (t0 and W/BW for a dense model
    whose bytes do not vary), 0 for a column of zeros."""
    A = X / y[:, None]
    norms = np.linalg.norm(A, axis=0)
    out = np.zeros(A.shape[1])
    for j in range(A.shape[1]):
        if norms[j] == 0:
            continue
        a = A[:, j] / norms[j]
        others = np.delete(A, j, axis=1)
        others = others[:, np.linalg.norm(others, axis=0) > 0]
        if others.shape[1] == 0:
            out[j] = 1.0
            continue
        others = others / np.linalg.norm(others, axis=0)
        coef, *_ = np.linalg.lstsq(others, a, rcond=None)
        out[j] = float(np.linalg.norm(a - others @ coef))
    return out


@dataclass(frozen=True)
class Roofs:
    """What bounds a fitted rate: the memory and FLOP ceilings (B/s, FLOP/s; None where unknown) and
    their sources, times `slack` (the fit may not claim more than slack x the ceiling)."""
    bw_Bps: float | None = None
    flops: float | None = None
    bw_source: str = ""
    flops_source: str = ""
    slack: float = 1.15

    def lower(self, names) -> np.ndarray:
        """Lower bounds of the coefficients of the design columns `names` (s/B, s/FLOP; 0 else)."""
        rate = dict(weights=self.bw_Bps, kv=self.bw_Bps, matmul=self.flops, attention=self.flops)
        return np.array([1.0 / (self.slack * rate[n]) if rate.get(n) else 0.0 for n in names])


def weights_vary(df: pd.DataFrame, spread: float = 0.02) -> bool:
    """Whether weight bytes vary enough (MoE experts touched, several depths) to separate t0 from W/BW."""
    w = _col(df, "weight_bytes")
    return bool(w.size and (w.max() - w.min()) > spread * w.max())


def blocks_vary(df: pd.DataFrame) -> bool:
    """Whether the rows ran different numbers of blocks (else t0 and n_blocks · t_layer are one column)."""
    n = blocks(df)
    return bool(n.size and n.max() > n.min())


def _design(X: np.ndarray, tie_kv: bool, per_layer: bool, with_t0: bool) -> tuple[np.ndarray, list[str]]:
    cols = [("t0", X[:, 0])] if with_t0 else []
    if tie_kv:
        cols.append(("weights", X[:, 1] + X[:, 2]))
    else:
        cols += [("weights", X[:, 1]), ("kv", X[:, 2])]
    cols += [("matmul", X[:, 3]), ("attention", X[:, 4])] + ([("per_layer", X[:, 5])] if per_layer else [])
    return np.column_stack([c for _, c in cols]), [n for n, _ in cols]


def _expand(c: np.ndarray, names: list[str], tie_kv: bool) -> np.ndarray:
    v = dict(zip(names, c))
    if tie_kv:
        v["kv"] = v["weights"]
    return np.array([v.get(n, 0.0) for n in TERMS[:6]] + [1.0])


def fit_coefs(df: pd.DataFrame, tie_kv: bool | None = None, roofs: Roofs | None = None,
              checks: list | None = None) -> tuple[np.ndarray, float]:
    """(coefficients in s, s/B, s/B, s/FLOP, s/FLOP, s/block, 1; knee in tokens) minimising relative error.

    A dense model reads the same weight bytes in every pass, so t0 and W/BW_eff are the same
    column; then (tie_kv=None → auto) the cache is taken to stream at the weights' bandwidth
    (one BW for W + KV) and t0 is identified through the KV traffic, which varies with B and L.
    Bounded by physics: t0 >= 0; with `roofs`, no bandwidth above slack x the memory ceiling and no
    matmul or attention rate above slack x the FLOP ceiling. Identified by the grid: where the
    t0 column lies in the span of the others (no byte or block variation separates it), t0 is
    not fitted (0: the fixed time is inside W/BW_eff). `checks`, when a list, receives one entry
    per term (`term_checks`): identified, unidentified (with its share outside the others' span),
    at its bound, or not in the rows.
    """
    tie_kv = not weights_vary(df) if tie_kv is None else tie_kv
    per_layer = blocks_vary(df)
    roofs = roofs or Roofs()
    y = _col(df, "t_median_s")
    best = None
    for knee in [0.0] + sorted(set(_col(df, "tokens"))):
        X = features(df, knee)
        D, names = _design(X, tie_kv, per_layer, with_t0=True)
        share = dict(zip(names, outside_share(D, y)))
        layered = per_layer and share["per_layer"] >= ID_SHARE  # depth that moves only with W: no per-block term
        if not layered:
            D, names = _design(X, tie_kv, False, with_t0=True)
            share.update({n: v for n, v in zip(names, outside_share(D, y)) if n == "t0"})
        if share["t0"] < ID_SHARE:
            D, names = _design(X, tie_kv, layered, with_t0=False)
        share.update({n: v for n, v in zip(names, outside_share(D, y)) if n not in ("t0", "per_layer")})
        lower = roofs.lower(names)
        z = _solve(D, y, X[:, 6], lower)
        c = _expand(z, names, tie_kv)
        r = np.abs(X @ c / y - 1.0) / ROBUST_SCALE
        err = float(np.sum(2 * (np.sqrt(1 + r**2) - 1)))  # the same soft-L1 loss
        if best is None or err < best[0] - 1e-12:
            best = (err, c, knee, share, names, z, lower, D)
    _, c, knee, share, names, z, lower, D = best
    if checks is not None:
        comm = features(df, knee)[:, 6]
        checks.extend(_term_checks(share, names, z, lower, D / y[:, None], roofs, tie_kv, 1.0 - comm / y))
    return c, knee


WEAK_REL_SE = 0.5  # a fitted term whose standard error is above half its value is weakly identified


def standard_errors(A: np.ndarray, z: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Standard errors of the coefficients z of the relative-residual problem A z ≈ target (the
    Gauss-Newton covariance s² (AᵀA)⁻¹, s² the residual variance); inf without spare points."""
    n, p = A.shape
    if n <= p:
        return np.full(p, np.inf)
    sc = np.abs(A).max(axis=0)
    sc[sc == 0] = 1.0
    As = A / sc
    s2 = float(np.sum((A @ z - target) ** 2)) / (n - p)
    return np.sqrt(np.maximum(np.diag(np.linalg.pinv(As.T @ As)), 0.0) * s2) / sc


def _term_checks(share: dict, names: list[str], z, lower, A, roofs: Roofs, tie_kv: bool,
                 target: np.ndarray | None = None) -> list[dict]:
    """One entry per term of the design (A: its columns relative to the measured times)."""
    se = standard_errors(A, z, np.ones(len(A)) if target is None else target)
    fitted = dict(zip(names, zip(z, lower, np.abs(A).max(axis=0), se)))
    out = []
    for term, s in share.items():
        if term not in fitted:  # t0 or the per-block term dropped: the grid does not separate it
            inside = ("the fixed time is inside W/BW_eff; vary B or L (bytes) to measure it" if term == "t0" else
                      "the depth moves only with the weight bytes, a per-block floor is inside W/BW_eff and t0")
            out.append(dict(term=term, status="unidentified", outside_share=float(s),
                            note=f"the grid does not separate it from the other terms ({100 * s:.2g}% of its "
                                 f"column outside their span, < {100 * ID_SHARE:g}%): not fitted (0), {inside}"))
            continue
        v, lb, size, err = fitted[term]
        what = "weights + kv" if term == "weights" and tie_kv else term
        if size == 0:
            out.append(dict(term=what, status="absent", outside_share=0.0, note="the rows carry none of it"))
        elif s < ID_SHARE:
            out.append(dict(term=what, status="unidentified", outside_share=float(s),
                            note=f"the grid does not separate it from the other terms ({100 * s:.2g}% of its column "
                                 f"outside their span, < {100 * ID_SHARE:g}%)"))
        elif (v - lb) * size < 1e-6:  # within a millionth of a step of its bound
            src = roofs.bw_source if term in ("weights", "kv") else roofs.flops_source
            note = (f"at its bound ({roofs.slack:g}x the {src}): the points would have it faster than the hardware, "
                    "the bound prices it") if lb > 0 else (
                "held at 0 (no negative fixed time)" if term == "t0" else
                "fitted as free (0 s): the points give it no time and no ceiling bounds it")
            out.append(dict(term=what, status="at bound", outside_share=float(s), note=note))
        elif err > WEAK_REL_SE * v:
            out.append(dict(term=what, status="weakly identified", outside_share=float(s), rel_se=float(err / v),
                            note=f"its standard error is {100 * err / v:.0f}% of its value (> {100 * WEAK_REL_SE:g}%): "
                                 "the points' scatter leaves it open; more or quieter points, or a wider grid"))
        else:
            out.append(dict(term=what, status="identified", outside_share=float(s), rel_se=float(err / v), note=""))
    return out


def terms(df: pd.DataFrame, coefs, knee: float) -> np.ndarray:
    """Seconds each term contributes, one column per TERMS entry."""
    return features(df, knee) * full_coefs(coefs)


def regime(term_s: np.ndarray) -> np.ndarray:
    """Which term dominates: overhead (t0 + per-block floor), kv, compute (matmul + attention
    FLOPs), comm (collectives), else memory."""
    parts = np.column_stack([term_s[:, 0] + term_s[:, 5], term_s[:, 1], term_s[:, 2], term_s[:, 3] + term_s[:, 4],
                             term_s[:, 6]])
    return np.array(["overhead", "memory", "kv", "compute", "comm"])[parts.argmax(axis=1)]


def physical(coefs, knee: float) -> dict:
    """The coefficients as physics with units (inf where a term was fitted as free)."""
    inv = lambda c, unit: float("inf") if c <= 0 else 1.0 / c / unit  # noqa: E731
    coefs = full_coefs(coefs)
    return dict(t0_ms=float(coefs[0]) * 1e3, BW_eff_GBps=inv(coefs[1], 1e9), BW_kv_GBps=inv(coefs[2], 1e9),
                F_eff_TFLOPs=inv(coefs[3], 1e12), F_attn_TFLOPs=inv(coefs[4], 1e12), knee_tokens=float(knee),
                per_block_us=float(coefs[5]) * 1e6)


# ---- errors -------------------------------------------------------------------------------

def error_row(split: str, method: str, rg: str, pred, meas) -> dict:
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    ok = np.isfinite(pred) & np.isfinite(meas) & (meas > 0)
    e = 100.0 * (pred[ok] / meas[ok] - 1.0)
    if e.size == 0:
        return dict(split=split, method=method, regime=rg, n=0, MAPE_pct=np.nan, median_abs_pct=np.nan,
                    max_abs_pct=np.nan, bias_pct=np.nan)
    return dict(split=split, method=method, regime=rg, n=int(e.size), MAPE_pct=float(np.mean(np.abs(e))),
                median_abs_pct=float(np.median(np.abs(e))), max_abs_pct=float(np.max(np.abs(e))),
                bias_pct=float(np.mean(e)))


def kfold_predictions(df: pd.DataFrame, folds: int, seed: int, roofs: Roofs | None = None) -> np.ndarray:
    """Held-out predictions: each point predicted by a fit (knee included) that never saw it."""
    n = len(df)
    k = min(folds, n)
    pred = np.full(n, np.nan)
    if k < 2 or n < 4:
        return pred
    perm = np.random.default_rng(seed).permutation(n)
    for test in np.array_split(perm, k):
        train = np.setdiff1d(perm, test)
        c, knee = fit_coefs(df.iloc[train], roofs=roofs)
        pred[test] = features(df.iloc[test], knee) @ c
    return pred


def verify_is_free(df: pd.DataFrame) -> np.ndarray:
    """T(q) = T(1) measured at the same (B, L): the Leviathan assumption; NaN without a q=1 point."""
    t1 = df[df["q"] == 1].groupby(["B", "L"])["t_median_s"].median()
    return np.array([t1.get((b, l), np.nan) for b, l in zip(df["B"], df["L"])], dtype=float)


def roofline_baseline(df: pd.DataFrame, dtype: str, ceilings: dict | None) -> tuple[np.ndarray, str]:
    """max(bytes/BW, FLOPs/F) from the run's measured ceilings, else the datasheet row."""
    name = str(df["device_name"].iloc[0]) if "device_name" in df else ""
    sheet = detect(name)
    sheet = None if sheet is None or sheet.measured_only else sheet
    roofs = roofs_for(dtype, ceilings, sheet)
    bw, flops, source = roofs.for_prediction()
    if bw is None:
        return np.full(len(df), np.nan), (f"n/a: no ceilings.json summary in the run folder and no datasheet "
                                          f"row for {name!r}")
    label = f"roofline max(bytes/{bw / 1e9:.0f} GB/s, FLOPs/{(flops or 0) / 1e12:.3g} TFLOP/s) [{source}]"
    return np.asarray(predict_step_time(df, roofs), dtype=float), label


def _error_tables(df, full_pred, regimes, settings: FitSettings, ceilings, dtype,
                  sliced: pd.DataFrame | None = None, roofs: Roofs | None = None) -> tuple[list[dict], dict]:
    meas = _col(df, "t_median_s")
    roof, roof_label = roofline_baseline(df, dtype, ceilings)
    free = verify_is_free(df)
    cv = kfold_predictions(df, settings.folds, settings.seed, roofs)
    splits = {f"{settings.folds}-fold held-out": (np.ones(len(df), bool), cv)}
    qs, Bs = _col(df, "q"), _col(df, "B")
    train = qs <= settings.q_split
    if (~train).any() and train.sum() >= 4:
        c, knee = fit_coefs(df[train], roofs=roofs)
        splits[f"train q<={settings.q_split}, predict q>{settings.q_split}"] = (~train, features(df, knee) @ c)
    train = Bs == Bs.min()
    if (~train).any() and train.sum() >= 4:
        c, knee = fit_coefs(df[train], roofs=roofs)
        splits[f"train B={int(Bs.min())}, predict B>{int(Bs.min())}"] = (~train, features(df, knee) @ c)
    tabled = {}  # split -> the same fit times the trained rows' measured kernel factor (steptable)
    Ls = _col(df, "L")
    if len(set(Ls)) >= 3:  # two contexts to train on (the KV slope), the longest to predict
        train = Ls < Ls.max()
        c, knee = fit_coefs(df[train], roofs=roofs)
        name = f"train L<{int(Ls.max())}, predict L={int(Ls.max())}"
        pred = features(df, knee) @ c
        splits[name] = (~train, pred)
        tabled[name] = kernel_factor(df[train], pred[train], df, pred)
    if sliced is not None and len(sliced) >= 4:
        c, knee = fit_coefs(sliced, roofs=roofs)
        depths = ",".join(map(str, sorted(set(sliced["layers_run"].astype(int)))))
        name = f"train layers {depths}, predict full depth"
        splits[name] = (np.ones(len(df), bool), features(df, knee) @ c)
        deepest = sliced[sliced["layers_run"] == sliced["layers_run"].max()]
        tabled[name] = kernel_factor(deepest, features(deepest, knee) @ c, df, splits[name][1])
    rows = []
    for split, (mask, pred) in splits.items():
        methods = [("fit", pred), (roof_label, roof), ("verify is free T(q)=T(1)", free)]
        if split in tabled:
            methods.insert(1, (TABLE_METHOD, tabled[split]))
        for method, p in methods:
            for rg in ["all"] + sorted(set(regimes[mask])):
                sel = mask & ((regimes == rg) if rg != "all" else True)
                rows.append(error_row(split, method, rg, p[sel], meas[sel]))
    ratio = cv / meas
    ratio = ratio[np.isfinite(ratio)]
    q_lo, q_hi = settings.band
    band = dict(p10=float(np.quantile(ratio, q_lo)), p90=float(np.quantile(ratio, q_hi)),
                meaning="measured T lies in [pred/p90, pred/p10] for 80% of held-out points") if ratio.size \
        else dict(p10=np.nan, p90=np.nan, meaning="too few points for a held-out band")
    return rows, band


# ---- fitting a run folder -------------------------------------------------------------------

CLEAN_SHARE = 2 / 3  # noisy points are left out when at least this share of the ok points is clean


def _noisy(df: pd.DataFrame) -> pd.Series:
    if "noisy" not in df:
        return pd.Series(False, index=df.index)
    return df["noisy"].map(lambda v: v is True or str(v).lower() == "true")


def _usable(df: pd.DataFrame) -> pd.DataFrame:
    """ok rows with a time; noisy ones left out unless too few clean ones remain (a run timed
    entirely on a busy machine is fitted as it is, and the report says so)."""
    ok = df[df["status"] == "ok"]
    ok = ok[np.isfinite(ok["t_median_s"].astype(float)) & (ok["t_median_s"] > 0)]
    noisy = _noisy(ok)
    return ok[~noisy] if len(ok) and (~noisy).mean() >= CLEAN_SHARE else ok


def fit_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows the fit uses: ok, at full depth (layer-extrapolated rows included), not marked
    noisy by the sweep's busy-machine check."""
    if "t_median_s" not in df or "status" not in df:  # every point failed: no timing columns at all
        return df.iloc[0:0]
    ok = _usable(df)
    return ok[ok["layers_run"] == ok["layers_full"]].reset_index(drop=True)


def sliced_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Measured rows at fewer layers than the model has (a layer-sliced sweep), for the
    "train on fewer layers, predict full depth" split."""
    ok = _usable(df)
    extrapolated = ok["extrapolated"].fillna(False).astype(bool) if "extrapolated" in ok else False
    return ok[(ok["layers_run"] < ok["layers_full"]) & ~extrapolated].reset_index(drop=True)


def noise_note(df: pd.DataFrame) -> dict:
    ok = df[df["status"] == "ok"]
    n, noisy = len(ok), int(_noisy(ok).sum())
    left_out = bool(noisy and n and 1 - noisy / n >= CLEAN_SHARE)
    return dict(noisy_points=noisy, of_points=n, left_out=left_out,
                meaning="points the sweep marked as timed on a busy machine (roofline.measure.noise); "
                        + ("left out of the fit" if left_out or not noisy else
                           f"KEPT in the fit: fewer than {CLEAN_SHARE:.0%} of the points are clean"))


def _layer_terms(g: pd.DataFrame) -> dict:
    if "per_layer_s" in g and g["per_layer_s"].notna().any():
        return dict(per_layer_ms_median=float(g["per_layer_s"].median() * 1e3),
                    fixed_ms_median=float(g["fixed_s"].median() * 1e3), source="sliced runs (T = a + layers*b)")
    return dict(source="n/a: one layer depth measured (no sliced runs)")


ROOF_SLACK = 1.15  # a fitted rate may reach 1.15x its ceiling (a ceiling's own error, a cache-resident share)


def fit_roofs(dtype: str, ceilings: dict | None, device_name: str, working_set: float | None = None) -> Roofs:
    """The bounds of a group's fitted rates: the run's measured ceilings (ceilings.json), else the
    datasheet row of its device (quality.ceilings_for); none where neither is known. No memory bound
    when every pass's bytes (`working_set`, B) fit in the last-level cache: the ceiling is DRAM's."""
    sheet = detect(device_name)
    sheet = None if sheet is None or sheet.measured_only else sheet
    bw, bw_src, f, f_src = quality.ceilings_for(dtype, ceilings, sheet)
    summary = (ceilings or {}).get("summary") or {}
    cache = summary.get("llc_bytes") or summary.get("cache_bytes") or (sheet.cache_bytes() if sheet else None)
    if bw and working_set and cache and working_set < cache:
        bw = None
    return Roofs(bw_Bps=bw * 1e9 if bw else None, flops=f * 1e12 if f else None,
                 bw_source=f"{bw_src} of {bw:.4g} GB/s" if bw else "", flops_source=f"{f_src} of {f:.4g} TFLOP/s"
                 if f else "", slack=ROOF_SLACK)


def fit_group(g: pd.DataFrame, settings: FitSettings, ceilings: dict | None,
              sliced: pd.DataFrame | None = None) -> tuple[dict, pd.DataFrame]:
    key = {k: (str(g[k].iloc[0]) if k in g else "?") for k in GROUP_KEYS}
    roofs = fit_roofs(key["dtype"], ceilings, key["device_name"], float(_col(g, "bytes_total").max()) or None)
    checks: list[dict] = []
    coefs, knee = fit_coefs(g, roofs=roofs, checks=checks)
    t = terms(g, coefs, knee)
    rg = regime(t)
    real = ~g["extrapolated"].fillna(False).astype(bool) if "extrapolated" in g else np.ones(len(g), bool)
    errors, band = _error_tables(g, t.sum(axis=1), rg, settings, ceilings, key["dtype"],
                                 sliced if sliced is not None and real.all() else None, roofs)
    domain = {a: [int(g[a].min()), int(g[a].max())] for a in ("q", "B", "L")}
    ran = sorted(set(g["moe_impl"].dropna().astype(str))) if "moe_impl" in g else []
    group = dict(key=key, moe_impl=ran[0] if len(ran) == 1 else None, n_points=len(g), kv_tied_to_weights=not weights_vary(g), coefs=[float(c) for c in coefs],
                 coef_units=COEF_UNITS, knee_tokens=float(knee), params=physical(coefs, knee), band=band,
                 domain=domain, layer_terms=_layer_terms(g), errors=errors, term_checks=checks,
                 bounds=dict(BW_max_GBps=roofs.bw_Bps and roofs.slack * roofs.bw_Bps / 1e9, BW_source=roofs.bw_source,
                             F_max_TFLOPs=roofs.flops and roofs.slack * roofs.flops / 1e12,
                             F_source=roofs.flops_source, slack=roofs.slack))
    points = g.assign(t_pred_s=t.sum(axis=1), regime=rg)
    trusted = ~_noisy(points)
    group["table"] = measured_table(points, trusted)
    group["table_left_out_noisy"] = int((~trusted).sum())
    return group, points


def _json_file(path: Path, field: str):
    """A JSON file of a run folder, or None when absent; unreadable: bad input naming the field and the file."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{field}={str(path.parent)!r}: {path.name} is not readable JSON ({e})") from None


def _load(run_dir: Path, what: str) -> pd.DataFrame:
    if not (run_dir / "points.csv").exists() and not (run_dir / "points.jsonl").exists():
        raise ConfigError(f"{what}={str(run_dir)!r}: not a run folder (no points.csv or points.jsonl)")
    return load_run(run_dir)


def fit_run(run_dir, settings: FitSettings = FitSettings(), sliced_dir=None) -> tuple[dict, pd.DataFrame]:
    """Fit every group of a run folder; returns (fit document, per-point predictions).
    `sliced_dir`: a layer-sliced run of the same model and grid, whose measured shallow rows
    train the "fewer layers -> full depth" split (rows at fewer layers in run_dir count too)."""
    run_dir = Path(run_dir)
    raw = _load(run_dir, "results_dir")
    if sliced_dir:  # only its measured shallow rows: its layer-extrapolated full-depth rows are predictions
        raw = pd.concat([raw, sliced_rows(_load(Path(sliced_dir), "sliced_dir"))], ignore_index=True)
    df = fit_rows(raw)
    if df.empty:
        raise ConfigError(f"results_dir={str(run_dir)!r}: no ok full-depth rows to fit")
    shallow = sliced_rows(raw)
    excluded = {**noise_note(raw), **quality.untimed_note(raw)}
    run = _json_file(run_dir / "run.json", "results_dir") or {}
    ceilings = _json_file(run_dir / "ceilings.json", "results_dir")
    if "device_name" not in df:
        df["device_name"] = "unknown"
    comm_fit, comm_note = _collective_fit(df, run_dir, settings)
    if comm_fit:
        df["comm_s"] = comm_seconds(df, comm_fit)
    groups, frames = [], []
    keys = [k for k in GROUP_KEYS if k in df]
    for name, g in df.groupby(keys, sort=True):
        sl = shallow
        for k, v in zip(keys, name):
            sl = sl[sl[k].astype(str) == str(v)] if k in sl else sl.iloc[:0]
        grp, pts = fit_group(g.reset_index(drop=True), settings, ceilings, sl.reset_index(drop=True))
        sheet = detect(grp["key"]["device_name"])
        grp["problems"] = quality.fit_problems(grp, ceilings, None if sheet is None or sheet.measured_only else sheet)
        if "converged" in g and (~g["converged"].astype(bool)).any():
            grp["problems"].append(f"{int((~g['converged'].astype(bool)).sum())} of {len(g)} points did not "
                                   "converge (median CI above the target)")
        groups.append(grp)
        frames.append(pts)
    if not any(quality.usable(g) for g in groups):
        raise ConfigError(f"results_dir={str(run_dir)!r}: too few points to fit: "
                          + "; ".join(f"{'/'.join(g['key'][k] for k in ('model', 'dtype', 'mode', 'kind'))} has "
                                      f"{g['n_points']}" for g in groups) + f" (at least {quality.MIN_POINTS} needed)")
    fit = dict(schema=FIT_SCHEMA, form=FORM, settings=asdict(settings),
               provenance=dict(run_folder=run_dir.name, fingerprint=run.get("fingerprint"),
                               device_name=str(df["device_name"].iloc[0]), git_commit=provenance.git_commit(),
                               run_git_commit=str(df["git_commit"].iloc[0]) if "git_commit" in df else None,
                               time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
               model_spec=(run.get("spec") or {}).get("model"), groups=groups, collectives_fit=comm_fit,
               comm=comm_note, excluded=excluded)
    return fit, pd.concat(frames, ignore_index=True)


def _collective_fit(df: pd.DataFrame, run_dir: Path, settings: FitSettings) -> tuple[dict | None, str]:
    """The collective fit that prices T_comm: settings.collectives, else run_dir/collectives.json."""
    from roofline.parallel.collectives import load
    path = Path(settings.collectives) if settings.collectives else run_dir / "collectives.json"
    if path.exists():
        return load(path)["fit"], f"T_comm from {path.name} (measured collectives)"
    if settings.collectives:
        raise ConfigError(f"collectives={settings.collectives!r}: no such file (python -m roofline.cli.collectives)")
    has = "collectives" in df and df["collectives"].fillna("").astype(str).str.len().gt(0).any()
    return None, ("n/a: rows have collectives but no collectives.json prices them (T_comm = 0)" if has
                  else "no collectives (one device)")


def comm_seconds(df: pd.DataFrame, comm_fit: dict) -> np.ndarray:
    """T_comm of each row: its `collectives` column priced by a collective fit."""
    from roofline.parallel.collectives import seconds
    from roofline.parallel.cost import parse_collectives
    col = df["collectives"] if "collectives" in df else pd.Series([""] * len(df))
    return np.array([seconds(parse_collectives(c if isinstance(c, str) else ""), comm_fit) for c in col])


def save_fit(fit: dict, path) -> Path:
    return files.write_json_atomic(path, fit, default=float)


def load_fit(path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"fit={str(path)!r}: no such file (run `python -m roofline.cli.fit results_dir=...`)")
    try:
        fit = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"fit={str(path)!r}: not a readable fit.json ({e})") from None
    from roofline.analysis.fitcheck import check_fit
    if isinstance(fit, dict) and fit.get("schema") != FIT_SCHEMA:
        raise ConfigError(f"fit={str(path)!r}: schema {fit.get('schema')!r}, expected {FIT_SCHEMA!r}")
    return check_fit(fit, f"fit={str(path)!r}")


# ---- predicting ---------------------------------------------------------------------------

def find_group(fit: dict, kind: str, dtype: str, mode: str | None = None, model: str | None = None) -> dict:
    """The group fitted for (kind, dtype[, mode][, model]); ConfigError listing what exists."""
    hits = [g for g in fit["groups"] if g["key"]["kind"] == kind and g["key"]["dtype"] == dtype
            and (mode is None or g["key"]["mode"] == mode) and (model is None or g["key"]["model"] == model)]
    if not hits:
        have = [tuple(g["key"][k] for k in ("model", "dtype", "mode", "kind")) for g in fit["groups"]]
        raise ConfigError(f"no fitted group for kind={kind!r} dtype={dtype!r} mode={mode!r} model={model!r}; "
                          f"the fit has (model, dtype, mode, kind) {have}")
    return hits[0]


def fitted_model(fit: dict) -> ModelConfig:
    if not fit.get("model_spec"):
        raise ConfigError("the fit has no model_spec (its run had no run.json when it was fitted): give the "
                          "fitted model as model=<preset>, or refit a run folder that has its run.json")
    return ModelConfig.from_dict(fit["model_spec"])


def cost_row(cfg: ModelConfig, kind: str, dtype: str, q: int, B: int, L: int, mode: str = "eager",
             moe_impl: str | None = None) -> dict:
    """Bytes and FLOPs of one step, from roofline.model.accounting (the one byte model): the MoE
    experts as the mode ran them (accounting.moe_impl_for_mode) unless moe_impl says otherwise."""
    moe_impl = moe_impl or moe_impl_for_mode(mode)
    fn = {"forward": forward_cost, "mtp": mtp_cost}.get(kind)
    if fn is None:
        raise ConfigError(f"kind={kind!r}: allowed ('forward', 'mtp')")
    return fn(cfg, dtype, B, q, L, moe_impl=moe_impl).as_row()


def step_model(fit: dict, kind: str, dtype: str, mode: str | None = None,
               cfg: ModelConfig | None = None) -> StepModel:
    """The group that predicts (kind, dtype, mode) for cfg, as a vectorised, memoised StepModel.

    source "fit": the fitted group of this very (model, kind); its measured table is used
    inside the measured range. "device-fit-transfer": a preset (or kind) that was not
    measured, predicted by applying the fitted device parameters of the forward group (t0, BW,
    F, knee) to that preset's accounting (the fit alone: the table holds other bytes).
    """
    measured = fitted_model(fit) if fit.get("model_spec") else None
    cfg = cfg or measured
    if cfg is None:
        raise ConfigError("no model to predict: the fit has no model_spec and no cfg was given")
    same = measured is not None and cfg == measured
    try:
        g = find_group(fit, kind, dtype, mode, cfg.name if same else None) if same else None
    except ConfigError:
        g = None
    source = "fit"
    if g is None:
        g, source = find_group(fit, "forward", dtype, mode), "device-fit-transfer"
    step_mode = mode or g["key"]["mode"]
    if cfg.is_moe and (g.get("moe_impl") or moe_impl_for_mode(step_mode)) == "dense":
        # the rows ran every expert (graph / compiled before the grouped path); a prediction prices
        # the touched experts an engine runs: the fitted device parameters applied to the touched
        # accounting. Rows of the grouped path (graph / compiled on Hopper) ran the touched experts.
        source = "device-fit-transfer"

    def rows(q, B, L) -> pd.DataFrame:
        return pd.DataFrame([cost_row(cfg, kind, dtype, int(a), int(b), int(c), step_mode, "touched")
                             for a, b, c in zip(q, B, L)])

    model = StepModel(g, rows, lambda r: terms(r, g["coefs"], g["knee_tokens"]), own=source == "fit", names=TERMS)
    model.fit_source = source
    return model


def predict_detail(fit: dict, kind: str, dtype: str, q: int, B: int, L: int, mode: str | None = None,
                   cfg: ModelConfig | None = None, model: StepModel | None = None) -> dict:
    """Seconds of one step with its terms, band and sources: `source` says which fit (see
    step_model), `step_source` whether the measured table ("table") or the fit ("fit") gave it."""
    model = model or step_model(fit, kind, dtype, mode, cfg)
    g = model.group
    r = model.predict(q, B, L).iloc[0]
    t = np.array([r[f"{n}_s"] for n in TERMS])
    seconds = float(r["seconds"])
    extrapolated = any(not lo <= v <= hi for v, (lo, hi) in zip((q, B, L), (g["domain"][a] for a in ("q", "B", "L")))) \
        or model.fit_source != "fit"
    p10 = seconds / g["band"]["p90"] if np.isfinite(g["band"]["p90"]) else np.nan
    p90 = seconds / g["band"]["p10"] if np.isfinite(g["band"]["p10"]) else np.nan
    widen = extrapolation_error_pct(g) if extrapolated else 0.0
    return dict(seconds=seconds, source=model.fit_source, step_source=str(r["source"]),
                regime=str(regime(t[None, :])[0]), p10_s=p10 / (1 + widen / 100), p90_s=p90 * (1 + widen / 100),
                band_widened_by_pct=widen, terms_s=dict(zip(TERMS, map(float, t))), extrapolated=extrapolated)


def extrapolation_error_pct(g: dict) -> float:
    """The group's measured error when it predicts outside what it was trained on: the largest
    median |error| of its extrapolation splits ('train q<=..., predict q>...', 'train B=..., predict
    B>...'); without such a split, the largest |error| of its K-fold held-out points. An extrapolated
    or transferred prediction's band is widened by it (the in-box band alone would claim the
    in-box accuracy)."""
    rows = [e for e in g.get("errors", []) if e.get("method") == "fit" and e.get("regime") == "all"]
    ext = [e["median_abs_pct"] for e in rows if str(e.get("split", "")).startswith("train ")]
    if ext:
        return float(max(ext))
    held = [e["max_abs_pct"] for e in rows if "held-out" in str(e.get("split", ""))]
    return float(max(held)) if held else float("nan")


def predict(fit: dict, kind: str, dtype: str, q: int, B: int, L: int, mode: str | None = None,
            cfg: ModelConfig | None = None) -> float:
    """Predicted median step time in seconds (see predict_detail)."""
    return predict_detail(fit, kind, dtype, q, B, L, mode, cfg)["seconds"]


# ---- tables of a fit ------------------------------------------------------------------------

def error_table(fit: dict) -> pd.DataFrame:
    rows = [dict(group=f"{g['key']['model']}/{g['key']['dtype']}/{g['key']['mode']}/{g['key']['kind']}", **e)
            for g in fit["groups"] for e in g["errors"]]
    return pd.DataFrame(rows, columns=["group", *ERROR_COLUMNS])


def params_table(fit: dict) -> pd.DataFrame:
    return pd.DataFrame([dict(group=f"{g['key']['model']}/{g['key']['dtype']}/{g['key']['mode']}/{g['key']['kind']}",
                              n=g["n_points"], **g["params"], band_p10=g["band"]["p10"], band_p90=g["band"]["p90"],
                              per_layer=g["layer_terms"].get("per_layer_ms_median", "n/a"))
                         for g in fit["groups"]])
