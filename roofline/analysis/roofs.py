"""Roofline physics of a run: the ceilings that apply to one dtype and the step time they predict.

Ceilings come in two kinds, side by side: MEASURED on the same device (a ceilings.json of
roofline.measure.ceilings) and the vendor's DATASHEET (roofline.measure.devices). The ridge
I* = F / BW (FLOP per byte) splits memory-bound from compute-bound work; the roofline step
time is max(bytes_total / BW, flops / F) with the measured ceiling where there is one and the
datasheet's otherwise (docs/design.md §2). Figures, the report and the cost model's roofline
baseline all read their roofs here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from roofline.measure.devices import Datasheet
from roofline.model.dtypes import datasheet_column

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Roofs:
    """The ceilings for one dtype, in B/s and FLOP/s; None where unknown."""

    dtype: str
    bw_measured: float | None = None
    flops_measured: float | None = None
    bw_datasheet: float | None = None
    flops_datasheet: float | None = None
    cache_bytes: int | None = None
    bw_kernel: str | None = None

    @property
    def ridge_measured(self) -> float | None:
        return ridge_point(self.flops_measured, self.bw_measured)

    @property
    def ridge_datasheet(self) -> float | None:
        return ridge_point(self.flops_datasheet, self.bw_datasheet)

    def for_prediction(self) -> tuple[float | None, float | None, str]:
        """(BW, F, source): measured ceilings when present, else the datasheet's."""
        bw = self.bw_measured or self.bw_datasheet
        flops = self.flops_measured or self.flops_datasheet
        source = "measured" if self.bw_measured else "datasheet"
        if flops is not None and (self.flops_measured is None) != (self.bw_measured is None):
            source = "measured BW, datasheet F" if self.bw_measured else "datasheet BW, measured F"
        return bw, flops, source


def ridge_point(flops: float | None, bw: float | None) -> float | None:
    """I* = F / BW in FLOP/B; None when either ceiling is unknown."""
    return None if flops is None or bw is None or bw == 0 else flops / bw


def dtype_table(table: dict | None) -> dict[str, float]:
    """{dtype: value} with dtype keys in short form ("bfloat16" and "bf16" both become "bf16")."""
    out = {}
    for key, value in (table or {}).items():
        try:
            out[datasheet_column(key)] = value
        except ValueError:
            log.warning("ignoring unknown dtype %r in ceilings.json", key)
    return out


def roofs_for(dtype: str, ceilings: dict | None, datasheet: Datasheet | None) -> Roofs:
    """Measured ceilings from ceilings.json's summary, datasheet ceilings from `datasheet` (or the
    datasheet block ceilings.json recorded when no row is given)."""
    d = datasheet_column(dtype)
    summary = (ceilings or {}).get("summary") or {}
    sheet = (ceilings or {}).get("datasheet") or {}
    scale = lambda v, k: None if v is None else float(v) * k  # noqa: E731
    bw_m = scale(summary.get("mem_bw_GBps"), 1e9)
    f_m = scale(dtype_table(summary.get("peak_tflops")).get(d), 1e12)
    if datasheet is not None:
        bw_d, f_d, cache = datasheet.bandwidth_Bps(), datasheet.peak_flops(d), datasheet.cache_bytes()
    else:
        bw_d = scale(sheet.get("mem_bw_GBps"), 1e9)
        f_d = scale(dtype_table(sheet.get("peak_tflops")).get(d), 1e12)
        cache = sheet.get("cache_bytes")
    cache = summary.get("llc_bytes") or cache  # the queried cache, never the flush size
    return Roofs(d, bw_m, f_m, bw_d, f_d, None if cache is None else int(cache), summary.get("mem_bw_kernel"))


def predict_step_time(df: pd.DataFrame, roofs: Roofs) -> pd.Series:
    """Roofline step time in seconds: max(bytes_total / BW, flops / F); memory term alone
    when no compute ceiling is known; NaN when no bandwidth ceiling is known."""
    bw, flops, _ = roofs.for_prediction()
    if bw is None:
        return pd.Series(np.nan, index=df.index)
    t_mem = df["bytes_total"].astype(float) / bw
    if flops is None:
        return t_mem
    return np.maximum(t_mem, df["flops"].astype(float) / flops)
