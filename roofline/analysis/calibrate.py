"""Calibrate the what-if model to a few points measured on the user's own deployment.

`calibrate=<file>`: a YAML or JSON file of points,

    points:
      - {B: 1, L: 1024, tok_s_per_user: 41.0}     # decode tokens/s of one sequence at batch B, context L
      - {B: 32, L: 2048, itl_ms: 38.5}            # or the inter-token latency (ms)

Each point gives the ratio measured / predicted step time (typical priors, the engine named or
the median of the profiles). The prediction is rescaled by the median ratio and its interval
replaced by the range of the ratios around it, which is what the points determine; the interval
is never narrower than the points' spread, and with fewer than three points never narrower than
±MIN_HALF_WIDTH (an assumption: one or two points cannot show how the error varies with B and L).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import yaml

from roofline.io.fields import ConfigError

MIN_HALF_WIDTH = 0.05


def load_points(path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"calibrate={str(path)!r}: no such file")
    doc = json.loads(p.read_text()) if p.suffix == ".json" else yaml.safe_load(p.read_text())
    if isinstance(doc, dict) and doc.get("schema", "").startswith("roofline.fit"):
        raise ConfigError(f"calibrate={str(path)!r}: a fit.json is not read by calibrate yet; pass it as fit= "
                          "(experiments.capacity / predict), or give measured points")
    pts = (doc or {}).get("points") if isinstance(doc, dict) else None
    if not pts:
        raise ConfigError(f"calibrate={str(path)!r}: missing key 'points' (a list of {{B, L, tok_s_per_user | itl_ms}})")
    for i, pt in enumerate(pts):
        for key in ("B", "L"):
            if not isinstance(pt.get(key), int) or isinstance(pt.get(key), bool) or pt[key] < (1 if key == "B" else 0):
                raise ConfigError(f"calibrate: points[{i}].{key}={pt.get(key)!r}: allowed an integer "
                                  f">= {1 if key == 'B' else 0}")
        have = [k for k in ("tok_s_per_user", "itl_ms") if k in pt]
        if len(have) != 1 or not isinstance(pt[have[0]], (int, float)) or pt[have[0]] <= 0:
            raise ConfigError(f"calibrate: points[{i}]: give exactly one of tok_s_per_user, itl_ms (a number > 0)")
    return pts


def ratios(w, points: list[dict]) -> list[float]:
    """measured / predicted ITL of each point (the what-if `w` uncalibrated)."""
    out = []
    for pt in points:
        measured = pt["itl_ms"] / 1e3 if "itl_ms" in pt else 1.0 / pt["tok_s_per_user"]
        out.append(measured / w.itl(pt["B"], pt["L"])["typical"])
    return out


def calibrated(w, path):
    """The what-if `w` rescaled to the points of `path`, its interval their spread."""
    r = ratios(replace(w, scale=1.0, band=None), load_points(path))
    m = statistics.median(r)
    half = MIN_HALF_WIDTH if len(r) < 3 else 0.0
    lo, hi = min(min(r) / m, 1 - half), max(max(r) / m, 1 + half)
    return replace(w, scale=w.scale * m, band=(lo, hi))
