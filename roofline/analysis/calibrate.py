"""Calibrate the what-if model to a few points measured on the user's own deployment.

`calibrate=<file>` is either a YAML or JSON file of points,

    points:
      - {B: 1, L: 1024, tok_s_per_user: 41.0}     # decode tokens/s of one sequence at batch B, context L
      - {B: 32, L: 2048, itl_ms: 38.5}            # or the inter-token latency (ms)

or, for a benchmark run as `vllm bench serve` reports it, a finite run,

      - {concurrency: 64, input_len: 1024, output_len: 1024, tpot_ms: 21.3}   # or itl_ms (median) or output_tok_s
        # optional: num_prompts, range_ratio (--random-range-ratio), client (server | offline)

priced by `whatif.serve` (its measured / predicted time, the reciprocal for output_tok_s) and placed at the
sequences it keeps running and their mean context (input + output/2): a run's times are its steps' (decode
rounds and prompt chunks alike), so their ratio is the steps' (an assumption where the run's prompts are priced
further off than its decodes);

or a GPU sweep's fit.json (`roofline.fit/*`) of the same model: its measured decode rows (q = 1) of the
forward group in the what-if's precision are the points. A sweep times the model's forward as a CUDA
graph with no serving engine around it, so its points are compared with the what-if's kernels and
launch floors without the engine's per-step host time (the engine's own term is kept in predictions).

Each point gives the ratio measured / predicted step time (typical priors; the engine named, or the
median of the profiles). What the points determine:

- the scale: the median ratio overall (`WhatIf.scale`), and by batch the median of each batch's points,
  interpolated in log B between the batches measured and held beyond them (`whatif.Calibration`);
- the interval at the points: the leave-one-out residuals (each point predicted from the others), so
  it is never narrower than what the points disagree on; with fewer than three points, also never
  narrower than ±MIN_HALF_WIDTH (an assumption: one or two points cannot show how the error varies);
- away from the points the interval widens back to the priors' own, in full one decade (x10 in B or L)
  outside the points' range (REACH_DECADES, an assumption).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import yaml

from roofline.io.fields import ConfigError, check_int, check_number
from roofline.parallel.engines import check_client
from roofline.parallel.whatif import Calibration, Pass, random_dataset_lengths, serve

MIN_HALF_WIDTH = 0.05
REACH_DECADES = 1.0


def _doc(path):
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"calibrate={str(path)!r}: no such file")
    try:
        return json.loads(p.read_text()) if p.suffix == ".json" else yaml.safe_load(p.read_text())
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"calibrate={str(path)!r}: not YAML/JSON ({str(e).splitlines()[0]})") from None


def fit_points(fit: dict, model: str, dtype: str, path="") -> list[dict]:
    """The measured decode rows (q = 1) of a fit.json's forward group for `model` in `dtype`, as points."""
    fitted = fit.get("model_spec") or {}
    if fitted.get("name") != model:
        raise ConfigError(f"calibrate={str(path)!r}: the fit measured model {fitted.get('name')!r}, the what-if prices "
                          f"{model!r} (calibrate with a sweep of the same model)")
    groups = [g for g in fit.get("groups", []) if g["key"]["kind"] == "forward" and g["key"]["dtype"] == dtype]
    if not groups:
        have = sorted({g["key"]["dtype"] for g in fit.get("groups", []) if g["key"]["kind"] == "forward"})
        raise ConfigError(f"calibrate={str(path)!r}: no forward group in dtype {dtype!r}; the fit has {have}")
    g = sorted(groups, key=lambda g: g["key"]["mode"] != "graph")[0]  # a CUDA-graph sweep first: what engines run
    tab = g.get("table") or {}
    pts = [dict(B=int(B), L=int(L), itl_ms=1e3 * float(t), kernels_only=True)
           for q, B, L, t in zip(tab.get("q", []), tab.get("B", []), tab.get("L", []), tab.get("t_s", []))
           if int(q) == 1 and t and float(t) > 0]
    if not pts:
        raise ConfigError(f"calibrate={str(path)!r}: the fit's forward group has no measured q = 1 rows")
    return pts


def load_points(path, model: str | None = None, dtype: str | None = None) -> list[dict]:
    doc = _doc(path)
    if isinstance(doc, dict) and str(doc.get("schema", "")).startswith("roofline.fit"):
        if model is None:
            raise ConfigError(f"calibrate={str(path)!r}: a fit.json needs the what-if's model to pick its group")
        return fit_points(doc, model, dtype, path)
    pts = (doc or {}).get("points") if isinstance(doc, dict) else None
    if isinstance(pts, list) and not pts:
        raise ConfigError(f"calibrate={str(path)!r}: 'points' is an empty list (give at least one {{B, L, "
                          f"tok_s_per_user | itl_ms}})")
    if not pts or not isinstance(pts, list):
        raise ConfigError(f"calibrate={str(path)!r}: missing key 'points' (a list of {{B, L, tok_s_per_user | itl_ms}})")
    for i, pt in enumerate(pts):
        if not isinstance(pt, dict):
            raise ConfigError(f"calibrate: points[{i}]={pt!r}: expected a mapping {{B, L, tok_s_per_user | itl_ms}} "
                              "or a run {concurrency, input_len, output_len, itl_ms | tpot_ms | output_tok_s}")
        run = "concurrency" in pt
        for key, least in ((("concurrency", 1), ("input_len", 1), ("output_len", 1)) if run else (("B", 1), ("L", 0))):
            check_int(f"calibrate: points[{i}].{key}", pt.get(key), least)
        metrics = tuple(RUN_METRICS) if run else ("tok_s_per_user", "itl_ms")
        have = [k for k in metrics if k in pt]
        if len(have) != 1:
            raise ConfigError(f"calibrate: points[{i}]: give exactly one of {', '.join(metrics)} (a number > 0)")
        check_number(f"calibrate: points[{i}].{have[0]}", pt[have[0]], 0.0, lo_open=True)
        if run and pt.get("num_prompts") is not None:
            check_int(f"calibrate: points[{i}].num_prompts", pt["num_prompts"], 1)
        if run:
            random_dataset_lengths(1, 1, pt.get("range_ratio", 1.0), f"calibrate: points[{i}].range_ratio")
            check_client(pt.get("client", "server"))
    return pts


# a finite run's metric: serve's key, and whether it is a time (the ratio measured / predicted) or a rate (inverse)
RUN_METRICS = {"itl_ms": ("itl_s", True), "tpot_ms": ("itl_mean_s", True), "output_tok_s": ("output_tok_s", False)}


def as_steps(w, points: list[dict]) -> list[dict]:
    """Each finite-run point priced by `whatif.serve` on the uncalibrated what-if `w`: the step point it stands for,
    {B: the sequences the run keeps running, L: their mean context, ratio: measured / predicted time}; decode-step
    points as they are."""
    out = []
    for pt in points:
        if "concurrency" not in pt:
            out.append(pt)
            continue
        I, O, staggered = random_dataset_lengths(pt["input_len"], pt["output_len"], pt.get("range_ratio", 1.0))
        s = serve(w, I, O, pt["concurrency"], pt.get("num_prompts"), staggered=staggered,
                  client=pt.get("client", "server"))
        (metric,) = [k for k in RUN_METRICS if k in pt]
        key, is_time = RUN_METRICS[metric]
        predicted = s[key]["typical"]
        ratio = pt[metric] * 1e-3 / predicted if is_time else predicted / pt[metric]
        out.append(dict(B=max(1, round(s["running"]["typical"])), L=I + O // 2, ratio=ratio))
    return out


def predicted_s(w, B: int, L: int, kernels_only: bool = False) -> float:
    """The uncalibrated what-if's typical decode step (s); kernels_only: without the engine's per-step host time."""
    if not kernels_only:
        return w.itl(B, L)["typical"]
    per = []
    for e in w.setting.engine_names():
        d = w.pass_detail(Pass(B, 1, L), 1, e)
        per.append(w.layout.pp * (d["seconds"] - d["terms"]["step_overhead"]))
    return statistics.median(per)


def ratios(w, points: list[dict]) -> list[float]:
    """measured / predicted step time of each point (the what-if `w` uncalibrated)."""
    out = []
    for pt in points:
        if "ratio" in pt:  # a finite run, priced already (as_steps)
            out.append(pt["ratio"])
            continue
        measured = pt["itl_ms"] / 1e3 if "itl_ms" in pt else 1.0 / pt["tok_s_per_user"]
        out.append(measured / predicted_s(w, pt["B"], pt["L"], bool(pt.get("kernels_only"))))
    return out


def by_batch(points: list[dict], r: list[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    Bs = sorted({pt["B"] for pt in points})
    return tuple(map(float, Bs)), tuple(statistics.median(x for pt, x in zip(points, r) if pt["B"] == B) for B in Bs)


def calibration_of(points: list[dict], r: list[float], reach_decades: float = REACH_DECADES) -> tuple[float, Calibration]:
    """(overall factor, Calibration) from the points and their ratios."""
    m = statistics.median(r)
    Bs, rs = by_batch(points, r)
    if len(points) >= 3:  # leave-one-out: each point predicted from the others
        resid = []
        for i, (pt, x) in enumerate(zip(points, r)):
            rest = [p for j, p in enumerate(points) if j != i]
            b, q = by_batch(rest, [y for j, y in enumerate(r) if j != i])
            resid.append(x / Calibration(b, q, 1.0, 1.0, (1, 1), (1, 1)).factor(pt["B"]))
        lo, hi = min(min(resid), 1.0), max(max(resid), 1.0)
    else:
        lo, hi = min(min(r) / max(r), 1 - MIN_HALF_WIDTH), max(max(r) / min(r), 1 + MIN_HALF_WIDTH)
    cal = Calibration(Bs, tuple(x / m for x in rs), lo, hi, (min(Bs), max(Bs)),
                      (float(min(pt["L"] for pt in points)), float(max(pt["L"] for pt in points))), reach_decades)
    return m, cal


def calibrated(w, path):
    """The what-if `w` rescaled to the points of `path` (a points file or a fit.json of the same model)."""
    base = replace(w, scale=1.0, calibration=None)
    pts = as_steps(base, load_points(path, w.cfg.name, w.dtype))
    m, cal = calibration_of(pts, ratios(base, pts))
    return replace(w, scale=w.scale * m, calibration=cal)


def summary(w) -> dict | None:
    """What the calibration of `w` determined, for a command's JSON summary."""
    c = w.calibration
    if c is None:
        return None
    return dict(scale=w.scale, ratio_by_batch={int(b): w.scale * x for b, x in zip(c.batches, c.ratios)},
                interval_at_points=[c.low, c.high], B_range=list(c.B_range), L_range=list(c.L_range),
                reach_decades=c.reach_decades)
