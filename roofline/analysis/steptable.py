"""Step time of one fitted group: the measured table inside the measured range, the physical
fit outside it, vectorised over (q, B, L) and memoised.

Why a table: a device's step time is not one smooth curve in tokens where its kernels switch
(float32 on a CPU: q=1 runs a GEMV, q>=2 a small GEMM that is slower per byte, so T(2) ≈ 2·T(1)
and T(4) < T(3); bf16 GEMV at M=1 is slower than M=2). Serving engines schedule with profiled
step times for the same reason. Inside the measured box (q, B and L each between the
smallest and largest measured value) the prediction is the fit multiplied by the measured /
fitted ratio, interpolated multilinearly between the measured grid points: exactly the
measured median at a measured point, the fit's physics between points.

Beyond the measured contexts (q and B inside the box, L outside it) the kernel factor of the
nearest measured context is kept and the fit carries the step to the new L
(`source` "table(q,B)+fit(L)"): which GEMM kernel runs depends on the token count M = q·B,
not on the cache length, while the KV and attention terms that grow with L are physics the
fit extrapolates. The same holds for a hole inside the box (a point that failed, or that the
sweep's busy-machine check marked noisy): its (q, B) kernel factor is interpolated along L from
that (q, B)'s measured contexts, and the source says "table(q,B)+fit(L)". Outside the (q, B)
box, or where a (q, B) has no measured context at all, it is the fit alone (`"fit"`).
Every prediction says which (`source`: "table", "table(q,B)+fit(L)" or "fit").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

AXES = ("q", "B", "L")
TABLE_QB_FIT_L = "table(q,B)+fit(L)"


def kernel_factor(train: pd.DataFrame, pred_train, test: pd.DataFrame, pred_test) -> np.ndarray:
    """Held-out use of the table: `pred_test` (a fit's prediction for rows it did not see)
    times the measured/fitted ratio of the training rows at the same (q, B) and the nearest
    trained L, interpolated as StepModel does; NaN where the (q, B) were not trained."""
    grid = RatioGrid(measured_table(train.assign(t_pred_s=np.asarray(pred_train, float)))).filled_along_L()
    q, B, L = (test[a].to_numpy(dtype=float) for a in AXES)
    return np.asarray(pred_test, float) * np.exp(grid(q, B, grid.clamped_L(L)))


def measured_table(points: pd.DataFrame, trusted=None) -> dict:
    """The group's measured medians and in-sample fit per (q, B, L), for fit.json.
    `points` carries t_median_s and t_pred_s (costmodel.fit_group). `trusted`: a boolean mask
    of the points the table may hold; a point the sweep marked as timed on a busy machine is
    not a profile of the device, so it leaves a hole there and the prediction falls back to
    the fit (even when a run with too few clean points had to be fitted with them)."""
    if trusted is not None:
        points = points[np.asarray(trusted, dtype=bool)]
    g = points.groupby(list(AXES), sort=True)[["t_median_s", "t_pred_s"]].median().reset_index()
    return dict(q=g["q"].astype(int).tolist(), B=g["B"].astype(int).tolist(), L=g["L"].astype(int).tolist(),
                t_s=g["t_median_s"].astype(float).tolist(), t_fit_s=g["t_pred_s"].astype(float).tolist())


class RatioGrid:
    """log(measured / fitted) on the measured (q, B, L) grid, NaN where a point is missing."""

    def __init__(self, table: dict):
        self.axes = [np.array(sorted(set(table[a])), dtype=float) for a in AXES]
        self.values = np.full([len(a) for a in self.axes], np.nan)
        idx = [np.searchsorted(ax, np.asarray(table[a], dtype=float)) for ax, a in zip(self.axes, AXES)]
        with np.errstate(divide="ignore", invalid="ignore"):
            self.values[tuple(idx)] = np.log(np.asarray(table["t_s"], float) / np.asarray(table["t_fit_s"], float))

    def filled_along_L(self) -> "RatioGrid":
        """A copy whose holes take the log ratio interpolated along L (nearest measured context
        beyond the ends) from the same (q, B): the kernel factor is a property of the token count,
        not of the cache length. A (q, B) with no measured context stays a hole."""
        out = object.__new__(RatioGrid)
        out.axes, out.values = self.axes, self.values.copy()
        Ls = self.axes[2]
        for i, j in np.ndindex(*self.values.shape[:2]):
            row = out.values[i, j]
            ok = np.isfinite(row)
            if ok.any() and not ok.all():
                row[~ok] = np.interp(Ls[~ok], Ls[ok], row[ok])
        return out

    def inside(self, q, B, L) -> np.ndarray:
        return np.all([(x >= ax[0]) & (x <= ax[-1]) for x, ax in zip((q, B, L), self.axes)], axis=0)

    def clamped_L(self, L) -> np.ndarray:
        """L moved to the nearest measured context (the kernel factor's context, see above)."""
        return np.clip(np.asarray(L, dtype=float), self.axes[2][0], self.axes[2][-1])

    def __call__(self, q, B, L) -> np.ndarray:
        """Multilinear interpolation of the log ratio; NaN outside the box or next to a hole."""
        pts = [np.asarray(x, dtype=float) for x in (q, B, L)]
        lo, w = [], []
        for x, ax in zip(pts, self.axes):
            if len(ax) == 1:
                lo.append(np.zeros(x.shape, int))
                w.append(np.where(x == ax[0], 0.0, np.nan))
                continue
            i = np.clip(np.searchsorted(ax, x, side="right") - 1, 0, len(ax) - 2)
            lo.append(i)
            w.append(np.where((x >= ax[0]) & (x <= ax[-1]), (x - ax[i]) / (ax[i + 1] - ax[i]), np.nan))
        out = np.zeros(pts[0].shape)
        for corner in np.ndindex(2, 2, 2):
            weight = np.ones(pts[0].shape)
            index = []
            for d, c in enumerate(corner):
                size = len(self.axes[d])
                weight = weight * (w[d] if c else 1.0 - w[d])
                index.append(np.minimum(lo[d] + c, size - 1))
            v = self.values[tuple(index)]
            out = out + np.where(weight == 0, 0.0, weight * v)  # a hole with zero weight does not matter
        return out


class StepModel:
    """T(q, B, L) of one fitted group for one model configuration.

    `cost_rows(q, B, L) -> DataFrame` gives the accounting columns of those steps (bytes and
    FLOPs, roofline.model.accounting); `terms(rows) -> [n, 5]` the fitted terms in seconds.
    The table is used only for the group's own model (`own=True`): a transferred preset has
    other bytes, so its prediction is the fit's.
    """

    def __init__(self, group: dict, cost_rows, terms, own: bool = True,
                 names: tuple[str, ...] = ("t0", "weights", "kv", "matmul", "attention")):
        self.group, self._rows, self._terms, self.names = group, cost_rows, terms, names
        table = group.get("table") if own else None
        self.grid = RatioGrid(table) if table and table.get("q") else None
        self.grid_L = self.grid.filled_along_L() if self.grid is not None else None
        self._memo: dict[tuple[int, int, int], tuple[float, str]] = {}

    def predict(self, q, B, L) -> pd.DataFrame:
        """Columns seconds, fit_s, source ("table" | "table(q,B)+fit(L)" | "fit") and the fit's
        terms, one row per step."""
        q, B, L = (np.atleast_1d(np.asarray(x, dtype=int)) for x in np.broadcast_arrays(q, B, L))
        t = self._terms(self._rows(q, B, L))
        fit_s = t.sum(axis=1)
        source = np.full(len(q), "fit", dtype=object)
        ratio = np.full(len(q), np.nan)
        if self.grid is not None:
            ratio = self.grid(q, B, L)
            source[np.isfinite(ratio)] = "table"
            beyond = ~np.isfinite(ratio)
            if beyond.any():
                ratio[beyond] = self.grid_L(q[beyond], B[beyond], self.grid.clamped_L(L[beyond]))
                source[beyond & np.isfinite(ratio)] = TABLE_QB_FIT_L
        use = np.isfinite(ratio)
        out = pd.DataFrame(dict(q=q, B=B, L=L, seconds=np.where(use, fit_s * np.exp(np.where(use, ratio, 0.0)), fit_s),
                                fit_s=fit_s, source=source.astype(str)))
        for name, col in zip(self.names, t.T):
            out[f"{name}_s"] = col
        return out

    def seconds(self, q: int, B: int, L: int) -> float:
        """One step, memoised (the speculative formulas ask for the same steps many times)."""
        key = (int(q), int(B), int(L))
        if key not in self._memo:
            r = self.predict(*key).iloc[0]
            self._memo[key] = (float(r["seconds"]), str(r["source"]))
        return self._memo[key][0]

    def source(self, q: int, B: int, L: int) -> str:
        self.seconds(q, B, L)
        return self._memo[(int(q), int(B), int(L))][1]


def kernel_effects(points: pd.DataFrame, margin: float = 0.02) -> pd.DataFrame:
    """Measured steps over q > 1 tokens that ran faster than the 1-token step at the same
    (kind, dtype, mode, B, L), by more than `margin`: T(q) < T(1) is a kernel switch, since
    the q-token pass reads at least the same bytes."""
    keys = [k for k in ("model", "kind", "dtype", "mode", "B", "L") if k in points]
    out = []
    for key, g in points.groupby(keys):
        one = g.loc[g["q"] == 1, "t_median_s"]
        if one.empty:
            continue
        t1 = float(one.median())
        for r in g[(g["q"] > 1) & (g["t_median_s"] < (1 - margin) * t1)].itertuples():
            out.append({**dict(zip(keys, key)), "q": int(r.q), "T1_ms": 1e3 * t1, "Tq_ms": 1e3 * r.t_median_s,
                        "Tq_over_T1": r.t_median_s / t1})
    return pd.DataFrame(out)
