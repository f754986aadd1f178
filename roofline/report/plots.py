"""Pictures of a run folder: the roofline, step time vs tokens per pass, the bandwidth ceiling
vs working set, and the utilisation of both ceilings vs batch.

Each figure is built by a `build_*` function that returns matplotlib Figures (so tests can read
their texts and line data) and saved by the matching `plot_*` function as PNG and SVG. Every
figure carries a footer naming the device, dtype, timer mode, L2 setting and date, taken from
the rows' provenance, because a roofline picture without its device is not a measurement.

Ceilings come in two kinds, drawn side by side: MEASURED on the same device (ceilings.json,
solid) and the vendor's DATASHEET (dashed). The roofline prediction of a step,
`max(bytes_total / BW, flops / F_peak)`, uses the measured ceiling where there is one and the
datasheet otherwise. A figure whose data is absent is skipped (logged, no file written).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import ticker
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from roofline.analysis.roofs import predict_step_time, ridge_point, roofs_for
from roofline.measure.devices import Datasheet
from roofline.model.dtypes import datasheet_column
from roofline.report import figures, regime

log = logging.getLogger(__name__)

FORMATS = ("png", "svg")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">")
PREDICTION_LABEL = "roofline prediction"


class Skip(Exception):
    """A figure whose data is absent; the message says which data."""


# ---- shared helpers -------------------------------------------------------------------

def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if "status" in df.columns else df


def _values(df: pd.DataFrame, col: str) -> list[str]:
    if col not in df.columns:
        return []
    return [str(v) for v in pd.unique(df[col].dropna())]


def footer_text(df: pd.DataFrame, ceilings: dict | None = None, dtype: str | None = None) -> str:
    """Device, dtype, timer mode, L2 setting and date of the rows (or the ceilings' provenance)."""
    prov = (ceilings or {}).get("provenance") or {}
    device = ", ".join(_values(df, "device_name")) or prov.get("device_name") or "unknown device"
    dev = ", ".join(_values(df, "device")) or prov.get("device")
    dtypes = dtype or ", ".join(_values(df, "dtype")) or "?"
    modes = ", ".join(_values(df, "mode")) or prov.get("mode") or "?"
    l2 = ", ".join(_values(df, "t_l2")) or ", ".join(
        sorted({str(r.get("l2")) for r in (ceilings or {}).get("bandwidth") or []})) or "?"
    times = sorted(_values(df, "time_utc")) or ([prov["time_utc"]] if prov.get("time_utc") else [])
    days = sorted({t[:10] for t in times})
    date = (days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}") if days else "date unknown"
    threads = ", ".join(_values(df, "t_threads") or _values(df, "threads"))
    parts = [f"device: {device}" + (f" ({dev})" if dev else ""), f"dtype: {dtypes}",
             f"timer: {modes}, L2 {l2}"]
    if threads:
        parts.append(f"threads: {threads}")
    parts.append(f"{date} (UTC)")
    return "  |  ".join(parts)


def _finish(fig: Figure, footer: str, right: float = 1.0) -> Figure:
    fig.text(0.01, 0.008, footer, fontsize=7, color="0.3", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.035, right, 1))
    return fig


def _series(df: pd.DataFrame, always: list[str], maybe=("model", "kind", "mode", "t_l2", "layers_run")):
    """Group keys: `always` plus whichever of `maybe` vary in df, so labels stay short."""
    cols = [c for c in maybe if c in df.columns and df[c].nunique() > 1] + always
    return cols, list(df.groupby(cols, sort=True))


def _label(cols: list[str], key) -> str:
    key = key if isinstance(key, tuple) else (key,)
    names = {"t_l2": "l2", "layers_run": "layers"}
    return ", ".join(f"{names.get(c, c)}={v:g}" if isinstance(v, (int, float, np.number)) else f"{v}"
                     for c, v in zip(cols, key))


def save(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    return figures.save(fig, out_dir, stem, FORMATS, dpi=130)


def _by_dtype(df: pd.DataFrame):
    for dtype, rows in df.groupby("dtype", sort=True):
        yield str(dtype), datasheet_column(str(dtype)), rows


# ---- the roofline ---------------------------------------------------------------------

def _draw_roof(ax, x: np.ndarray, bw: float | None, flops: float | None, style: str, color: str, what: str):
    if bw is None and flops is None:
        return
    y = np.full_like(x, np.inf) if bw is None else bw * x
    if flops is not None:
        y = np.minimum(y, flops)
    ax.plot(x, y / 1e12, style, color=color, lw=1.8,
            label=f"{what} roof: " + ", ".join(
                ([f"{bw / 1e9:.3g} GB/s"] if bw else []) + ([f"{flops / 1e12:.3g} TFLOP/s"] if flops else [])))
    ridge = ridge_point(flops, bw)
    if ridge is not None:
        ax.axvline(ridge, color=color, ls=":", lw=1)
        ax.annotate(f"ridge {ridge:.3g} FLOP/B\n({what})", (ridge, 0.03 if what == "measured" else 0.12),
                    xycoords=("data", "axes fraction"), xytext=(4, 0), textcoords="offset points",
                    fontsize=7, color=color)


def build_roofline(df: pd.DataFrame, ceilings: dict | None, datasheet: Datasheet | None) -> dict[str, Figure]:
    ok = ok_rows(df)
    ok = ok[np.isfinite(ok["intensity"].astype(float)) & (ok["achieved_TFLOPs"].astype(float) > 0)] \
        if not ok.empty else ok
    if ok.empty:
        raise Skip("no ok points with intensity and achieved FLOP/s")
    built = {}
    for dtype, short, rows in _by_dtype(ok):
        roofs = roofs_for(dtype, ceilings, datasheet)
        ridges = [r for r in (roofs.ridge_measured, roofs.ridge_datasheet) if r]
        i = rows["intensity"].astype(float)
        x = np.logspace(np.log10(min([i.min(), *ridges]) / 3), np.log10(max([i.max(), *ridges]) * 3), 200)
        fig, ax = figures.subplots(figsize=(8.5, 5.8))
        _draw_roof(ax, x, roofs.bw_measured, roofs.flops_measured, "-", "C0", "measured")
        _draw_roof(ax, x, roofs.bw_datasheet, roofs.flops_datasheet, "--", "C3", "datasheet")
        norm = LogNorm(vmin=max(rows["q"].min(), 1), vmax=max(rows["q"].max(), 2))
        batches = sorted(rows["B"].unique())
        for n, b in enumerate(batches):
            pts = rows[rows["B"] == b]
            sc = ax.scatter(pts["intensity"], pts["achieved_TFLOPs"], c=pts["q"], cmap="viridis", norm=norm,
                            marker=MARKERS[n % len(MARKERS)], s=36, edgecolors="k", linewidths=0.4, zorder=3)
        fig.colorbar(sc, ax=ax, label="q (tokens per sequence per forward)")
        handles, _ = ax.get_legend_handles_labels()
        handles += [Line2D([], [], ls="", marker=MARKERS[n % len(MARKERS)], color="0.5", mec="k", mew=0.4,
                           label=f"B={b}") for n, b in enumerate(batches)]
        ax.legend(handles=handles, fontsize=7, loc="upper left")
        ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte moved)",
               ylabel="achieved TFLOP/s (1e12 FLOP/s)",
               title=f"Roofline, {short}: ok points by intensity (colour = q, marker = B)")
        ax.yaxis.set_major_formatter(_PLAIN)
        if not (roofs.bw_measured or roofs.bw_datasheet):
            ax.set_title(ax.get_title() + "\n(no ceilings: neither ceilings.json nor a datasheet row)", fontsize=9)
        built[f"roofline_{short}"] = _finish(fig, footer_text(rows, ceilings, dtype))
    return built


# ---- step time vs q: is guessing free here? -------------------------------------------------

def _ok_forward(df: pd.DataFrame) -> pd.DataFrame:
    ok = ok_rows(df)
    ok = ok[ok["kind"] == "forward"] if "kind" in ok.columns else ok
    if ok.empty:
        raise Skip("no ok forward points")
    return ok


def build_step_time_vs_q(df: pd.DataFrame, ceilings: dict | None, datasheet: Datasheet | None) -> dict[str, Figure]:
    ok = _ok_forward(df)
    built = {}
    for dtype, short, rows in _by_dtype(ok):
        roofs = roofs_for(dtype, ceilings, datasheet)
        bw, flops, source = roofs.for_prediction()
        rows = rows.assign(t_pred_s=predict_step_time(rows, roofs))
        fig, (ax_t, ax_r) = figures.subplots(1, 2, figsize=(11, 5.2))
        cols, groups = _series(rows, ["B", "L"])
        for n, (key, g) in enumerate(groups):
            g = g.sort_values("q")
            color = f"C{n % 10}"
            ms = 1e3
            ax_t.plot(g["q"], g["t_median_s"] * ms, "o-", color=color, ms=3.5, label=_label(cols, key))
            if {"t_p10_s", "t_p90_s"} <= set(g.columns):
                ax_t.fill_between(g["q"], g["t_p10_s"] * ms, g["t_p90_s"] * ms, color=color, alpha=0.2, lw=0)
            t1 = g.loc[g["q"] == 1]
            if g["t_pred_s"].notna().any():
                ax_t.plot(g["q"], g["t_pred_s"] * ms, "--", color=color, lw=1, label=f"{PREDICTION_LABEL}: {_label(cols, key)}")
            if not t1.empty:
                ax_r.plot(g["q"], g["t_median_s"] / t1["t_median_s"].iloc[0], "o-", color=color, ms=3.5,
                          label=_label(cols, key))
                if t1["t_pred_s"].notna().all():
                    ax_r.plot(g["q"], g["t_pred_s"] / t1["t_pred_s"].iloc[0], "--", color=color, lw=1)
        qs = sorted(rows["q"].unique())
        for ax in (ax_t, ax_r):
            ax.set_xscale("log", base=2)
            ax.set_xticks(qs, [f"{q:g}" for q in qs])
            ax.set_yscale("log")
            ax.set_xlabel("q (tokens per sequence per forward)")
            ax.yaxis.set_major_formatter(_PLAIN)
            ax.yaxis.set_minor_formatter(_PLAIN)
            ax.tick_params(axis="y", which="minor", labelsize=7)
        ax_r.axhline(1, color="0.4", lw=0.8)
        lo, hi = ax_r.get_ylim()  # a 1% wobble must not look like a cliff
        ax_r.set_ylim(min(lo, 0.8), max(hi, 1.25))
        ax_t.set(ylabel="step time (ms); band p10-p90",
                 title="Step time vs q (solid: measured median)")
        ax_r.set(ylabel="T(q) / T(1)", title="Cost of extra tokens per pass, relative to decode")
        pred_note = (f"dashed: {PREDICTION_LABEL} max(bytes/BW, FLOPs/F), {source} ceilings"
                     + (f" (BW {bw / 1e9:.3g} GB/s" + (f", F {flops / 1e12:.3g} TFLOP/s)" if flops else ", no F)")
                        if bw else "")) if bw else "no ceilings known: no roofline prediction"
        ax_r.text(0.02, 0.97, pred_note.replace(", measured", ",\nmeasured").replace(", datasheet", ",\ndatasheet"),
                  transform=ax_r.transAxes, fontsize=7, va="top", ha="left",
                  bbox=dict(facecolor="white", edgecolor="0.8", alpha=0.9))
        handles = [h for h, lab in zip(*ax_t.get_legend_handles_labels()) if not lab.startswith(PREDICTION_LABEL)]
        if bw:
            handles.append(Line2D([], [], ls="--", color="0.4", lw=1, label=PREDICTION_LABEL))
        ax_t.legend(handles=handles, fontsize=7, loc="upper left", title=", ".join(cols), title_fontsize=7)
        fig.suptitle(regime.short_title(rows, short), fontsize=9)  # what the data say, not a fixed claim
        built[f"step_time_vs_q_{short}"] = _finish(fig, footer_text(rows, ceilings, dtype))
    return built


# ---- bandwidth vs working set (ceilings.json) ------------------------------------------

def build_bandwidth_vs_working_set(df: pd.DataFrame, ceilings: dict | None,
                                   datasheet: Datasheet | None) -> dict[str, Figure]:
    bw_rows = pd.DataFrame((ceilings or {}).get("bandwidth") or [])
    if bw_rows.empty or not {"working_set_bytes", "GBps"} <= set(bw_rows.columns):
        raise Skip("no bandwidth rows (ceilings.json absent or without 'bandwidth')")
    bw_rows = bw_rows.rename(columns={"l2": "t_l2"})
    fig, ax = figures.subplots(figsize=(8.5, 5.5))
    cols, groups = _series(bw_rows, ["kernel", "t_l2"], maybe=("variant", "dtype"))
    for n, (key, g) in enumerate(groups):
        g = g.sort_values("working_set_bytes")
        ax.plot(g["working_set_bytes"], g["GBps"], "o-", ms=3.5, color=f"C{n % 10}", label=_label(cols, key))
    dtypes = sorted({str(d) for d in bw_rows.get("dtype", pd.Series(["bf16"])).dropna()}) or ["bf16"]
    roofs = roofs_for(dtypes[0], ceilings, datasheet)
    if roofs.bw_datasheet:
        ax.axhline(roofs.bw_datasheet / 1e9, color="C3", ls="--", label=f"datasheet {roofs.bw_datasheet / 1e9:.4g} GB/s")
    if roofs.bw_measured:
        ax.axhline(roofs.bw_measured / 1e9, color="0.3", ls="-", lw=0.8,
                   label=f"measured ceiling {roofs.bw_measured / 1e9:.4g} GB/s ({roofs.bw_kernel or '?'})")
    if roofs.cache_bytes:
        ax.axvline(roofs.cache_bytes, color="0.4", ls=":")
        ax.annotate(f"last-level cache\n{roofs.cache_bytes / 2**20:.4g} MiB", (roofs.cache_bytes, 0.02),
                    xycoords=("data", "axes fraction"), xytext=(4, 0), textcoords="offset points", fontsize=7)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(_bytes_label))
    ax.set(xlabel="working set (bytes, binary units)", ylabel="achieved GB/s (1e9 B/s, bytes as each kernel counts them)",
           title="Memory bandwidth vs working set (ceilings.json)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, title=", ".join(c.removeprefix("t_") for c in cols), title_fontsize=7)
    return {"bandwidth_vs_working_set": _finish(fig, footer_text(df, ceilings, ", ".join(dtypes)))}


_PLAIN = ticker.FuncFormatter(lambda v, _pos=None: f"{v:g}")


def _bytes_label(v: float, _pos=None) -> str:
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= k:
            return f"{v / k:g} {unit}"
    return f"{v:g} B"


# ---- utilisation vs batch --------------------------------------------------------------

def pick_q(qs, n: int = 4) -> list:
    """q=1 (when measured) and up to n-1 more, spread evenly on the log axis."""
    qs = sorted(set(qs))
    picked = {qs[int(round(i))] for i in np.linspace(0, len(qs) - 1, min(n, len(qs)))}
    return sorted(picked)


def build_utilisation_vs_batch(df: pd.DataFrame, ceilings: dict | None,
                               datasheet: Datasheet | None) -> dict[str, Figure]:
    ok = _ok_forward(df)
    built = {}
    for dtype, short, rows in _by_dtype(ok):
        roofs = roofs_for(dtype, ceilings, datasheet)
        if not (roofs.bw_measured or roofs.bw_datasheet or roofs.flops_measured or roofs.flops_datasheet):
            log.info("utilisation_vs_batch_%s skipped: no measured or datasheet ceiling for %s", short, short)
            continue
        L0 = rows["L"].min()
        rows = rows[rows["L"] == L0]
        fig, (ax_m, ax_c) = figures.subplots(1, 2, figsize=(11, 5.0), sharex=True)
        cols, _ = _series(rows, ["q"])
        for n, q in enumerate(pick_q(rows["q"].unique())):
            color = f"C{n % 10}"
            for key, g in rows[rows["q"] == q].groupby(cols[:-1] or ["q"], sort=True):
                g = g.sort_values("B")
                tag = f"q={q:g}" + (f", {_label(cols[:-1], key)}" if cols[:-1] else "")
                gbps, tflops = g["achieved_GBps"] * 1e9, g["achieved_TFLOPs"] * 1e12
                for ax, val, ceil_m, ceil_d in ((ax_m, gbps, roofs.bw_measured, roofs.bw_datasheet),
                                                (ax_c, tflops, roofs.flops_measured, roofs.flops_datasheet)):
                    if ceil_m:
                        ax.plot(g["B"], 100 * val / ceil_m, "o-", color=color, ms=3.5, label=tag)
                    if ceil_d:
                        ax.plot(g["B"], 100 * val / ceil_d, "s--", color=color, ms=3, lw=1,
                                label=tag if not ceil_m else "_" + tag)
        bs = sorted(rows["B"].unique())
        for ax, what in ((ax_m, "memory bandwidth"), (ax_c, "compute")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(bs, [f"{b:g}" for b in bs])
            ax.set_xlabel("B (sequences per batch)")
            ax.axhline(100, color="0.4", lw=0.8)
            ax.set_ylim(bottom=0)
            if not ax.lines[:-1]:
                ax.text(0.5, 0.5, f"no {what} ceiling for {short}", transform=ax.transAxes, ha="center")
        source = ax_m if len(ax_m.lines) >= len(ax_c.lines) else ax_c
        handles, _ = source.get_legend_handles_labels()
        if roofs.bw_measured or roofs.flops_measured:
            handles.append(Line2D([], [], ls="-", marker="o", ms=3.5, color="0.4", label="% of measured"))
        if roofs.bw_datasheet or roofs.flops_datasheet:  # no "% of datasheet" where there is no datasheet
            handles.append(Line2D([], [], ls="--", marker="s", ms=3, color="0.4", lw=1, label="% of datasheet"))
        fig.legend(handles=handles, fontsize=7, loc="center right")
        ax_m.set(ylabel="achieved GB/s as % of the memory ceiling",
                 title=_ceiling_title("Bandwidth", roofs.bw_measured, roofs.bw_datasheet, 1e9, "GB/s"))
        ax_c.set(ylabel="achieved FLOP/s as % of the compute ceiling",
                 title=_ceiling_title("Compute", roofs.flops_measured, roofs.flops_datasheet, 1e12, "TFLOP/s"))
        styles = [s for s, have in (("solid: % of measured", roofs.bw_measured or roofs.flops_measured),
                                    ("dashed: % of datasheet", roofs.bw_datasheet or roofs.flops_datasheet)) if have]
        fig.suptitle(f"Utilisation vs batch, {short} forward, L={L0:g} ({', '.join(styles)})")
        built[f"utilisation_vs_batch_{short}"] = _finish(fig, footer_text(rows, ceilings, dtype), right=0.86)
    if not built:
        raise Skip("no measured or datasheet ceiling for any dtype")
    return built


def _ceiling_title(what: str, measured, datasheet, k: float, unit: str) -> str:
    parts = ([f"measured {measured / k:.3g}"] if measured else []) + ([f"datasheet {datasheet / k:.3g}"] if datasheet else [])
    return f"{what} ceiling: " + (", ".join(parts) + f" {unit}" if parts else "none")


# ---- public: build + save --------------------------------------------------------------

BUILDERS = {
    "roofline": build_roofline,
    "step_time_vs_q": build_step_time_vs_q,
    "bandwidth_vs_working_set": build_bandwidth_vs_working_set,
    "utilisation_vs_batch": build_utilisation_vs_batch,
}


@dataclass
class FigureSet:
    paths: dict[str, list[Path]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def _save_all(name: str, df, ceilings, datasheet, out_dir, skipped: dict | None = None) -> list[Path]:
    try:
        with figures.style():
            built = BUILDERS[name](df, ceilings, datasheet)
    except Skip as why:
        log.warning("figure %s skipped: %s", name, why)
        if skipped is not None:
            skipped[name] = str(why)
        return []
    return [p for stem, fig in built.items() for p in save(fig, out_dir, stem)]


def plot_roofline(df, ceilings, datasheet, out_dir) -> list[Path]:
    return _save_all("roofline", df, ceilings, datasheet, out_dir)


def plot_step_time_vs_q(df, ceilings, datasheet, out_dir) -> list[Path]:
    return _save_all("step_time_vs_q", df, ceilings, datasheet, out_dir)


def plot_bandwidth_vs_working_set(df, ceilings, datasheet, out_dir) -> list[Path]:
    return _save_all("bandwidth_vs_working_set", df, ceilings, datasheet, out_dir)


def plot_utilisation_vs_batch(df, ceilings, datasheet, out_dir) -> list[Path]:
    return _save_all("utilisation_vs_batch", df, ceilings, datasheet, out_dir)


def plot_all(df: pd.DataFrame, ceilings: dict | None, datasheet: Datasheet | None, out_dir: Path) -> FigureSet:
    out = FigureSet()
    for name in BUILDERS:
        paths = _save_all(name, df, ceilings, datasheet, out_dir, out.skipped)
        if paths:
            out.paths[name] = paths
    return out
