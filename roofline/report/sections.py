"""Report sections written beside a run's results, picked up by roofline.report.document:
report_costmodel.md (the cost-model fit: parameters, held-out errors against the baselines,
predicted vs measured) and report_specdec.md (speculative decoding measured vs predicted).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from roofline.analysis import costmodel
from roofline.report import figures
from roofline.report.document import md_table


# ---- cost model ------------------------------------------------------------------------------

def plot_costmodel_pred_vs_meas(points: pd.DataFrame, path) -> Path:
    """Predicted vs measured step time, log-log, y = x line, colour = regime."""
    fig, ax = figures.subplots(figsize=(5.5, 5))
    for rg, g in points.groupby("regime"):
        ax.scatter(g["t_median_s"] * 1e3, g["t_pred_s"] * 1e3, s=14, label=rg, alpha=0.8)
    lo = 0.8 * min(points["t_median_s"].min(), points["t_pred_s"].min()) * 1e3
    hi = 1.25 * max(points["t_median_s"].max(), points["t_pred_s"].max()) * 1e3
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="y = x")
    ax.set(xscale="log", yscale="log", xlabel="measured median step time (ms)",
           ylabel="fitted model (ms, in-sample)", title="Cost model: predicted vs measured")
    ax.legend(title="regime", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    return figures.save(fig, path.parent, path.stem, dpi=120)[0]


def _beats(main: pd.DataFrame) -> list[str]:
    """One sentence per group and split: the fit's MAPE against each baseline's."""
    out = []
    for (group, split), g in main.groupby(["group", "split"], sort=False):
        fit_row = g[g["method"] == "fit"]
        if fit_row.empty:
            continue
        f = float(fit_row["MAPE_pct"].iloc[0])
        others = [f"{r.method.split(' [')[0].split(' (')[0]}: {r.MAPE_pct:.1f}% ({r.MAPE_pct / f:.1f}x the fit's)"
                  for r in g[g["method"] != "fit"].itertuples() if np.isfinite(r.MAPE_pct) and f > 0]
        if others:
            out.append(f"- {group}, {split}: fit MAPE {f:.1f}%; " + "; ".join(others))
    return ["How much the fit beats the baselines (MAPE):\n\n" + "\n".join(out)] if out else []


def write_costmodel_section(fit: dict, points: pd.DataFrame, run_dir) -> Path:
    """run_dir/report_costmodel.md (picked up by roofline.report.document) and its figure."""
    run_dir = Path(run_dir)
    png = plot_costmodel_pred_vs_meas(points, run_dir / "figures" / "costmodel_pred_vs_meas.png")
    errs = costmodel.error_table(fit)
    main = errs[errs["regime"] == "all"]
    text = "\n\n".join([
        "## Cost model: fitted step time",
        fit["form"].replace("\n", " "),
        "Parameters (t0 in ms, bandwidths in GB/s with 1 GB = 1e9 B, FLOP rates in TFLOP/s, knee in tokens "
        "B*q per pass; inf = term fitted as free; band: held-out pred/meas quantiles p10/p90).",
        md_table(costmodel.params_table(fit)),
        "Errors, all points of each split (signed error = pred/meas - 1, in %). Baselines on the same points.",
        md_table(main),
        *_beats(main),
        "Errors by regime (the regime is the dominant term of the fitted prediction).",
        md_table(errs[errs["regime"] != "all"]),
        f"![costmodel_pred_vs_meas]({png.relative_to(run_dir).as_posix()})",
        f"Provenance: run fingerprint {fit['provenance']['fingerprint']}, device {fit['provenance']['device_name']}, "
        f"fitted at {fit['provenance']['time_utc']} with git {fit['provenance']['git_commit']}.",
    ]) + "\n"
    out = run_dir / "report_costmodel.md"
    out.write_text(text)
    return out


# ---- speculative decoding ------------------------------------------------------------------

def write_specdec_section(table: pd.DataFrame, run_dir: Path) -> Path:
    """Table + predicted-vs-measured picture, as report_specdec.md in the run folder."""
    fig, ax = figures.subplots(figsize=(5.5, 5))
    for (label, B), g in table.groupby([table["drafter"].str.split().str[0], "B"]):
        ax.scatter(g["S_meas"], g["S_pred"], label=f"{label}, B={B}", s=22)
    lo, hi = min(table["S_meas"].min(), table["S_pred"].min()) * 0.9, max(table["S_meas"].max(), table["S_pred"].max()) * 1.1
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="y = x")
    ax.set_xlabel("measured speedup (tokens/s spec / plain)")
    ax.set_ylabel("predicted speedup (cost model, measured τ)")
    ax.set_title("Speculative decoding: predicted vs measured")
    ax.legend(fontsize=7)
    fig.tight_layout()
    figures.save(fig, run_dir / "figures", "specdec_pred_vs_meas", dpi=110)
    e = table["err"].abs()
    cols = ["drafter", "k", "B", "tau_meas", "S_meas", "S_pred", "err", "S_pred_alpha", "err_alpha"]
    md = ["## Speculative decoding: measured vs predicted", "",
          f"{len(table)} points; |error| of S_pred (measured τ): median {100 * e.median():.1f}%, "
          f"max {100 * e.max():.1f}%; with τ(α, k) instead: median "
          f"{100 * table['err_alpha'].abs().median():.1f}% (oracle rows).", "",
          "![predicted vs measured](figures/specdec_pred_vs_meas.png)", "",
          md_table(table[cols].round(3))]
    path = run_dir / "report_specdec.md"
    path.write_text("\n".join(md) + "\n")
    return path
