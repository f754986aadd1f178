"""What a run's step times say: where verification stops being free, predicted and measured.

Predicted knee. A forward of q tokens per sequence does q times the matmul FLOPs of a decode
step over (almost) the same bytes, so its intensity is about q·I(1). The roofline puts the
knee where that reaches the ridge of the measured ceilings: q* = ridge / I(1), with
ridge = measured compute roof / measured memory roof (FLOP/B, the rows' `ridge_measured`) and
I(1) the intensity of the q=1 row of the same (dtype, mode, B, L) (FLOP per byte moved).
Below q*, T(q) ≈ T(1) (memory-bound: extra tokens are free); above it T grows like q.

Regime at the probe q (PROBE_Q): "memory-bound (flat)" where T(q)/T(1) <= FLAT; above it
"compute-bound" where the probe q has reached the predicted knee (q >= q*: the FLOP roof binds),
else "overhead-bound (below the ridge)": the pass costs more with q although its intensity is
below the ridge, so what grows is not the FLOP roof but the pass's own kernels (attention under a
mask, per-token element-wise work, dispatch), which the roofline does not price.

Measured knee. The hinge T(q)/T(1) = max(1, q/k) fitted to the measured ratios in log space
(least squares over a fine grid of k): k is the token count where the measured curve bends.
A curve that never leaves 1 within the grid has its knee beyond the largest q ("> q_max").
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

FLAT = 1.3  # T(q)/T(1) at or below this: "nearly free" (the target at q=8)
PROBE_Q = 8  # the q the headline quotes (or the largest measured below it)
GROUP = ["dtype", "mode", "B", "L"]


def _ok_forward(df: pd.DataFrame) -> pd.DataFrame:
    if df is None or df.empty or "status" not in df:
        return pd.DataFrame()
    ok = df[(df["status"] == "ok")]
    if "kind" in ok:
        ok = ok[ok["kind"] == "forward"]
    if {"layers_run", "layers_full"} <= set(ok.columns):
        ok = ok[ok["layers_run"] == ok["layers_full"]]
    if "noisy" in ok:
        clean = ok[~ok["noisy"].astype(str).str.lower().isin(["true", "1", "1.0"])]
        ok = clean if len(clean) else ok
    return ok


def measured_knee(q: np.ndarray, ratio: np.ndarray) -> float:
    """k of the hinge max(1, q/k) that best fits ratio(q) in log space; inf if the curve is flat
    over the whole grid (the fit's k is then at the top of its search range)."""
    q, r = np.asarray(q, float), np.asarray(ratio, float)
    keep = (q > 0) & (r > 0) & np.isfinite(r)
    q, r = q[keep], r[keep]
    if len(q) < 2:
        return math.nan
    grid = np.geomspace(0.25, 4 * q.max(), 400)
    err = [np.sum((np.log(r) - np.log(np.maximum(1.0, q / k))) ** 2) for k in grid]
    k = float(grid[int(np.argmin(err))])
    return math.inf if k >= q.max() else k


def knee_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (dtype, mode, B, L): ridge, I(1), the predicted and measured knee (tokens per
    sequence), T(q)/T(1) at PROBE_Q (or the largest q below it) and the regime the data show."""
    ok = _ok_forward(df)
    if ok.empty or "q" not in ok:
        return pd.DataFrame()
    out = []
    for key, g in ok.groupby([c for c in GROUP if c in ok.columns]):
        g = g.sort_values("q")
        one = g[g["q"] == 1]
        if one.empty or len(g) < 2:
            continue
        t1 = float(one["t_median_s"].iloc[0])
        ratio = g["t_median_s"].to_numpy(float) / t1
        qs = g["q"].to_numpy(float)
        ridge = float(one["ridge_measured"].iloc[0]) if "ridge_measured" in one and pd.notna(
            one["ridge_measured"].iloc[0]) else math.nan
        i1 = float(one["intensity"].iloc[0]) if "intensity" in one else math.nan
        pred = ridge / i1 if ridge > 0 and i1 > 0 else math.nan
        meas = measured_knee(qs, ratio)
        probe = qs[qs <= PROBE_Q].max()
        at = float(ratio[qs == probe][0])
        out.append(dict(zip(GROUP, key), ridge_FLOP_per_B=ridge, I1_FLOP_per_B=i1, knee_predicted=pred,
                        knee_measured=meas, q_max=int(qs.max()), probe_q=int(probe), ratio_at_probe=at,
                        regime=_regime(at, probe, pred)))
    return pd.DataFrame(out)


FLAT_REGIME, COMPUTE_REGIME, OVERHEAD_REGIME = "memory-bound (flat)", "compute-bound", "overhead-bound (below the ridge)"


def _regime(ratio: float, probe_q: float, knee_predicted: float) -> str:
    """The regime T(probe_q)/T(1) shows (module docstring): flat, compute-bound where the probe
    reached the predicted knee (or none is known), else overhead-bound below the ridge."""
    if ratio <= FLAT:
        return FLAT_REGIME
    return OVERHEAD_REGIME if knee_predicted == knee_predicted and probe_q < knee_predicted else COMPUTE_REGIME


def _knee(v: float, q_max: int) -> str:
    if v != v:
        return "?"
    return f"> {q_max}" if math.isinf(v) else f"{v:.3g}"


def sentence(row) -> str:
    """One line that says what one (dtype, mode, B, L) group's curve shows."""
    r = row if isinstance(row, dict) else row._asdict()
    name = f"{r['dtype']} {r['mode']}, B={r['B']}, L={r['L']}"
    pred = _knee(r["knee_predicted"], r["q_max"])
    meas = _knee(r["knee_measured"], r["q_max"])
    knees = f"knee measured {meas} tokens, predicted {pred} (ridge {r['ridge_FLOP_per_B']:.3g} FLOP/B / " \
            f"I(1) {r['I1_FLOP_per_B']:.3g} FLOP/B)"
    at = f"{name}: T({r['probe_q']})/T(1) = {r['ratio_at_probe']:.2f}"
    what = r["regime"]
    if what == FLAT_REGIME:
        return (f"{at}: verifying {r['probe_q']} tokens costs about one decode step (memory-bound: extra tokens are "
                f"nearly free); {knees}")
    if what == OVERHEAD_REGIME:
        return (f"{at}: extra tokens cost time although {r['probe_q']} tokens are below the ridge (overhead-bound, "
                "not the FLOP roof: the pass's own kernels, attention, element-wise work and dispatch, grow with q, "
                f"and the roofline does not price them); {knees}")
    return (f"{at}: compute-bound, every extra token costs time (guessing is not free here); {knees}")


def headline(df: pd.DataFrame) -> list[str]:
    """One sentence per (dtype, mode) at its smallest B and L: the regime the data show."""
    t = knee_table(df)
    if t.empty:
        return []
    first = t.sort_values(["B", "L"]).groupby(["dtype", "mode"], sort=False).head(1)
    return [sentence(r) for r in first.to_dict("records")]


def short_title(rows: pd.DataFrame, label: str) -> str:
    """A figure title for one dtype's rows: the regime at the smallest B and L, per mode."""
    t = knee_table(rows)
    if t.empty:
        return f"{label} forward step time vs tokens per pass"
    parts = []
    for r in t.sort_values(["B", "L"]).groupby("mode", sort=False).head(1).to_dict("records"):
        what = {FLAT_REGIME: "flat: extra tokens nearly free", COMPUTE_REGIME: "compute-bound: extra tokens cost time",
                OVERHEAD_REGIME: "overhead-bound below the ridge: extra tokens cost time"}[r["regime"]]
        parts.append(f"{r['mode']} {what} (T({r['probe_q']})/T(1) = {r['ratio_at_probe']:.2f} at B={r['B']}, "
                     f"knee {_knee(r['knee_measured'], r['q_max'])} measured / {_knee(r['knee_predicted'], r['q_max'])} "
                     "predicted)")
    return f"{label}: " + "; ".join(parts)


def roof_violations(df: pd.DataFrame, slack: float = 1.05) -> list[str]:
    """A point above a measured roof (more than `slack` of it) means the roof was not this device's
    best (a slow kernel, a busy machine while the ceilings ran): name the roof and the worst point."""
    if df is None or df.empty or "status" not in df:
        return []
    ok = df[df["status"] == "ok"]
    out = []
    for pct, what, roof_col, unit in (("pct_measured_bw", "memory", "ceiling_bw_GBps", "GB/s"),
                                      ("pct_measured_flops", "compute", "ceiling_TFLOPs", "TFLOP/s")):
        if pct not in ok or not ok[pct].notna().any():
            continue
        over = ok[ok[pct].astype(float) > 100 * slack]
        if over.empty:
            continue
        worst = over.sort_values(pct, ascending=False).iloc[0]
        roof = worst.get(roof_col)
        out.append(f"{len(over)} point(s) above the measured {what} roof ({roof:.4g} {unit} for {worst['dtype']}): "
                   f"worst {worst['point_id']} at {float(worst[pct]):.0f}% of it; the ceilings run did not find this "
                   "device's best (re-measure the ceilings on a quiet machine)")
    return out


def ceilings_warnings(ceilings: dict | None) -> list[str]:
    """What the ceilings run itself flagged: groups measured on a busy machine, a run cut short."""
    s = (ceilings or {}).get("summary") or {}
    out = [f"ceilings: {b['group']} was measured on a busy machine ({b['why']}) and again after it; the roof it "
           "gives may be low: re-measure the ceilings on a quiet machine" for b in s.get("busy_machine") or []]
    if s.get("complete") is False:
        out.append("ceilings.json is from a ceilings run cut short: only the groups it finished are in its roofs")
    return out


DECODE_TARGET = 0.80  # of the measured read bandwidth


def decode_notes(df: pd.DataFrame, ceilings: dict | None) -> list[str]:
    """Per (dtype, mode): decode (q=1) GB/s as a share of the measured read bandwidth, and, below
    DECODE_TARGET, what the ceilings measured for that dtype's bare M=1 GEMMs (torch's eager
    F.linear at the model's shapes): the kernel's own rate, i.e. what holds decode back; and the
    decode attention path the rows ran (decode_attention: timed at build on the CPU)."""
    ok = _ok_forward(df)
    s = (ceilings or {}).get("summary") or {}
    read = (s.get("mem_bw_by_kernel") or {}).get("torch_read") or s.get("mem_bw_GBps")
    if ok.empty or not read or "achieved_GBps" not in ok:
        return []
    out = []
    for (dtype, mode), g in ok[ok["q"] == 1].groupby(["dtype", "mode"]):
        gb = float(g["achieved_GBps"].median())
        line = (f"{dtype} {mode} decode (q=1) streams {gb:.3g} GB/s = {100 * gb / read:.3g}% of the measured read "
                f"bandwidth ({read:.3g} GB/s, torch_read), median of {len(g)} points")
        if gb < DECODE_TARGET * read:
            m1 = (s.get("decode_m1_GBps") or {}).get(dtype)
            line += (f"; below {100 * DECODE_TARGET:.0f}%: the bare M=1 {dtype} GEMMs of the ceilings run (the fastest "
                     f"kernel it timed, eager) reach {m1:.3g} GB/s ({100 * m1 / read:.0f}%)" if m1 else
                     f"; below {100 * DECODE_TARGET:.0f}% (no M=1 GEMM of {dtype} in the ceilings to compare)")
            if m1 and m1 < DECODE_TARGET * read and gb <= m1:
                line += ": the M=1 GEMM kernel itself is below the target and holds decode back"
            if m1 and gb < DECODE_TARGET * m1:
                line += (f"; the pass reaches {100 * gb / m1:.0f}% of those GEMMs' rate: the rest of the pass "
                         "(attention, norms, dispatch) costs the remainder")
            if m1 and gb > m1:
                line += "; the pass beats torch's eager M=1 GEMMs (its own GEMMs are faster: compiled, prepacked)"
            faster = faster_than_decode(ok[(ok["dtype"] == dtype) & (ok["mode"] == mode)])
            if faster:
                line += (f"; a q={faster['q']} pass (B={faster['B']}, L={faster['L']}) takes only "
                         f"{faster['ratio']:.2f}x the q=1 step while reading the same weights, streaming "
                         f"{faster['GBps']:.3g} GB/s ({100 * faster['GBps'] / read:.0f}%): the q=1 step's own kernels, "
                         "not the memory, hold decode back")
        line += gemm_split(g, read)
        paths = sorted(set(g["decode_attention"].dropna().astype(str))) if "decode_attention" in g else []
        if paths:
            line += f"; its attention: {' / '.join(paths)}"
        out.append(line)
    return out


def gemm_split(g: pd.DataFrame, read: float) -> str:
    """The measured split of the q=1 step (rows with t_gemm_s: the CPU's skinny GEMMs timed inside
    the pass, roofline.measure.cpu_gemm.kernel_seconds): the GEMMs' time and the rate at which they
    stream the step's weights, and the rest of the eager pass; medians over the points. '' without."""
    if "t_gemm_s" not in g or "weight_bytes" not in g:
        return ""
    g = g[(g["t_gemm_s"] > 0) & g["t_median_s"].notna()]
    if g.empty:
        return ""
    gemm = float(g["t_gemm_s"].median())
    share = float((g["t_gemm_s"] / g["t_median_s"]).median())
    rate = float((g["weight_bytes"] / g["t_gemm_s"]).median()) / 1e9
    rest = float((g["t_median_s"] - g["t_gemm_s"]).median())
    return (f"; measured inside the pass: its GEMMs take {1e3 * gemm:.3g} ms ({100 * share:.0f}% of the step), "
            f"streaming the weights at {rate:.3g} GB/s ({100 * rate / read:.0f}% of the read bandwidth), and the rest "
            f"of the eager pass (attention, norms, RoPE, residuals, dispatch) {1e3 * rest:.3g} ms")


FASTER_MARGIN = 0.9  # T(q)/T(1) below this: the q-token pass is faster than decode beyond noise


def faster_than_decode(ok: pd.DataFrame) -> dict | None:
    """The (B, L, q > 1) point whose step is the most below its q=1 step (T(q)/T(1) <
    FASTER_MARGIN), with its ratio and GB/s; None when no q > 1 pass beats decode. A pass of q
    tokens reads the same weights as decode and does more work, so a faster one shows that the
    decode (M = B tokens) kernels run below what the M = B·q ones reach."""
    best = None
    for (B, L), g in ok.groupby(["B", "L"]):
        one = g[g["q"] == 1]
        if one.empty or "achieved_GBps" not in g:
            continue
        t1 = float(one["t_median_s"].median())
        for _, r in g[g["q"] > 1].iterrows():
            ratio = float(r["t_median_s"]) / t1
            if ratio < FASTER_MARGIN and (best is None or ratio < best["ratio"]):
                best = dict(B=int(B), L=int(L), q=int(r["q"]), ratio=ratio, GBps=float(r["achieved_GBps"]))
    return best


def _truthy(s: pd.Series) -> pd.Series:
    return s.astype(str).str.lower().isin(["true", "1", "1.0"])


def compile_notes(df: pd.DataFrame) -> list[str]:
    """Per (dtype, mode) of the CPU's compiled rows: the graphs compiled, their compile time
    (each row's compile_s where it compiled a new graph; measured outside the timed region), the
    rows they served, the GEMM backends, and any recompile-limit fallback to eager."""
    if df is None or df.empty or "compile_s" not in df or "compile_new_graph" not in df:
        return []
    rows = df[df["compile_s"].notna()]
    if "status" in rows:
        rows = rows[rows["status"] == "ok"]
    out = []
    for (dtype, mode), g in rows.groupby(["dtype", "mode"]):
        new = g[_truthy(g["compile_new_graph"])]
        secs = new["compile_s"].astype(float)
        line = (f"{dtype} {mode}: {len(new)} graph(s) compiled in {secs.sum():.0f} s"
                + (f" ({secs.min():.0f}-{secs.max():.0f} s each)" if len(new) > 1 else "")
                + f", outside the timed region, serving {len(g)} rows (compile_s per row)")
        if "compile_gemm_backends" in g:
            line += f"; GEMM backends {', '.join(sorted(set(g['compile_gemm_backends'].dropna().astype(str))))}"
        if "compile_fallback" in g:
            fell = g["compile_fallback"].dropna().astype(str)
            fell = fell[fell.str.len() > 0]
            if len(fell):
                line += f"; {len(fell)} row(s) ran eagerly after the recompile limit: {fell.iloc[0]}"
        out.append(line)
    return out
