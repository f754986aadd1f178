"""Making and saving figures, one way for the whole library.

Figures are built with matplotlib's object API (`matplotlib.figure.Figure`), never pyplot:
no global backend to switch (importing this module selects nothing), no figure registry to
leak, and saving renders through the Agg canvas on any machine, display or not.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure

RC = {"svg.fonttype": "none", "font.size": 9, "axes.grid": True, "grid.alpha": 0.3}


def style() -> AbstractContextManager:
    """The report style (build and save figures inside it)."""
    return matplotlib.rc_context(RC)


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], **kw: Any) -> tuple[Figure, Any]:
    """A new Figure and its axes (as pyplot.subplots, without pyplot)."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


def label_log_axes(fig: Figure) -> None:
    """A log axis whose view holds fewer than two labelled major ticks gets minor ticks at 2x and
    5x each power (matplotlib's LogLocator) labelled as plain numbers (`{:g}`), so
    that every log axis can be read and no two labels overlap (a label at each of the eight
    minor ticks of a decade did)."""
    from matplotlib import ticker
    for ax in fig.axes:
        for axis, scale, lim in ((ax.xaxis, ax.get_xscale(), ax.get_xlim()), (ax.yaxis, ax.get_yscale(), ax.get_ylim())):
            if scale != "log":
                continue
            lo, hi = sorted(lim)
            majors = [t for t in axis.get_majorticklocs() if lo <= t <= hi]
            base = getattr(axis.get_transform(), "base", 10.0)
            if len(majors) < 2 and base == 10.0:
                axis.set_minor_locator(ticker.LogLocator(base=10.0, subs=(2.0, 5.0)))
                # plain numbers to their own precision: where the view holds a single 2x / 5x tick,
                # matplotlib's LogLocator falls back to linear ticks (0.012, 0.014, ...), which
                # LogFormatter's one significant digit printed as the same "1e-02"
                axis.set_minor_formatter(ticker.FuncFormatter(lambda v, _pos=None: f"{v:g}"))
                axis.set_tick_params(which="minor", labelsize=7)


def save(fig: Figure, out_dir: str | Path, stem: str, formats: tuple[str, ...] = ("png",), dpi: int = 110) -> list[Path]:
    """out_dir/stem.<ext> for each format; the folder is created. Returns the paths written."""
    label_log_axes(fig)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with style():
        for ext in formats:
            path = out_dir / f"{stem}.{ext}"
            fig.savefig(path, dpi=dpi)
            paths.append(path)
    return paths
