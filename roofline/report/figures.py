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


def save(fig: Figure, out_dir: str | Path, stem: str, formats: tuple[str, ...] = ("png",), dpi: int = 110) -> list[Path]:
    """out_dir/stem.<ext> for each format; the folder is created. Returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with style():
        for ext in formats:
            path = out_dir / f"{stem}.{ext}"
            fig.savefig(path, dpi=dpi)
            paths.append(path)
    return paths
