"""Calibrate the what-if model to a few points measured on the user's own deployment.

`calibrate=<file>` is either a YAML or JSON file of points,

    points:
      - {B: 1, L: 1024, tok_s_per_user: 41.0}     # decode tokens/s of one sequence at batch B, context L
      - {B: 32, L: 2048, itl_ms: 38.5}            # or the inter-token latency (ms)

or, for a benchmark run as `vllm bench serve` reports it, a finite run,

      - {concurrency: 64, input_len: 1024, output_len: 1024, tpot_ms: 21.3}   # or itl_ms (median), e2e_latency_s
                                                                                # (mean) or output_tok_s
        # optional: num_prompts, range_ratio (--random-range-ratio), client (server | offline)
      - {request_rate: 4, input_len: 1024, output_len: 256, tpot_ms: 9.1}    # a run at --request-rate 4: its
        # concurrency (--max-concurrency) optional, num_prompts 1000 unless given; a time, not output_tok_s
        # (below saturation the arrivals set the tokens/s, not the engine)

priced by `whatif.serve` (`whatif.serve_at_rate` at a rate; its measured / predicted time, the reciprocal for
output_tok_s) and placed at the sequences it keeps running (at a rate: those in flight) and their mean context
(input + output/2): a run's times are its steps' (decode
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
import math
import statistics
from dataclasses import replace
from pathlib import Path

import yaml

from roofline.io.fields import ConfigError, check_int, check_number
from roofline.io.yamltext import load_yaml
from roofline.parallel.engines import check_client, run_scheduling
from roofline.parallel.whatif import Calibration, Pass, random_dataset_lengths, serve, serve_at_rate

# what a `calibrate=` key takes, in the help of every command that has one (card, capacity, predict)
POINTS_FILE = ("your deployment's measured points (YAML/JSON {points: [{B, L, itl_ms | tok_s_per_user}, or a benchmark "
               "run {concurrency, input_len, output_len, tpot_ms | itl_ms | e2e_latency_s | output_tok_s}, or one at a "
               "rate {request_rate, input_len, output_len, tpot_ms | itl_ms | e2e_latency_s}]}) or a GPU sweep's "
               "fit.json")

# a finite run's metric: serve's key, and its unit in seconds for a time (the ratio measured / predicted), None for a
# rate (the inverse ratio)
RUN_METRICS = {"itl_ms": ("itl_s", 1e-3), "tpot_ms": ("itl_mean_s", 1e-3), "e2e_latency_s": ("e2e_s", 1.0),
               "output_tok_s": ("output_tok_s", None)}

MIN_HALF_WIDTH = 0.05
REACH_DECADES = 1.0


def _doc(path):
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"calibrate={str(path)!r}: no such file")
    try:
        return json.loads(p.read_text()) if p.suffix == ".json" else load_yaml(p.read_text())
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
                              f"or a run {{concurrency, input_len, output_len, {' | '.join(RUN_METRICS)}}}")
        rate = "request_rate" in pt
        run = "concurrency" in pt or rate
        if rate:
            check_number(f"calibrate: points[{i}].request_rate", pt["request_rate"], 0.0, lo_open=True)
            if pt.get("concurrency") is not None:
                check_int(f"calibrate: points[{i}].concurrency", pt["concurrency"], 1)
            if "output_tok_s" in pt:
                raise ConfigError(f"calibrate: points[{i}]: output_tok_s of a run at a rate says how fast the requests "
                                  "arrived, not how fast the engine ran them: give tpot_ms, itl_ms or e2e_latency_s")
        lengths = (("input_len", 1), ("output_len", 1))
        for key, least in (lengths if rate else (("concurrency", 1),) + lengths) if run else (("B", 1), ("L", 0)):
            check_int(f"calibrate: points[{i}].{key}", pt.get(key), least)
        metrics = tuple(RUN_METRICS) if run else ("tok_s_per_user", "itl_ms")
        have = [k for k in metrics if k in pt]
        if len(have) != 1:
            raise ConfigError(f"calibrate: points[{i}]: give exactly one of {', '.join(metrics)} (a number > 0)")
        check_number(f"calibrate: points[{i}].{have[0]}", pt[have[0]], 0.0, lo_open=True)
        if run:
            if pt.get("num_prompts") is not None:
                check_int(f"calibrate: points[{i}].num_prompts", pt["num_prompts"], 1)
            random_dataset_lengths(1, 1, pt.get("range_ratio", 1.0), f"calibrate: points[{i}].range_ratio")
            check_client(pt.get("client", "server"))
            run_scheduling(pt, f"calibrate: points[{i}].")
    return pts


def run_point(w, pt: dict) -> dict:
    """A finite-run point priced by `whatif.serve` on the uncalibrated what-if `w`, as the step point it stands for:
    {B: the sequences the run keeps running, L: their mean context, ratio: measured / predicted time}."""
    I, O, staggered = random_dataset_lengths(pt["input_len"], pt["output_len"], pt.get("range_ratio", 1.0))
    if "request_rate" in pt:
        s = serve_at_rate(w, I, O, pt["request_rate"], pt.get("num_prompts"),
                          pt.get("concurrency"), client=pt.get("client", "server"),
                          **run_scheduling(pt, "calibrate: point."))
    else:
        s = serve(w, I, O, pt["concurrency"], pt.get("num_prompts"), staggered=staggered,
                  client=pt.get("client", "server"), **run_scheduling(pt, "calibrate: point."))
    (metric,) = [k for k in RUN_METRICS if k in pt]
    key, unit_s = RUN_METRICS[metric]
    predicted = s[key]["typical"]
    ratio = pt[metric] * unit_s / predicted if unit_s else predicted / pt[metric]
    return dict(B=max(1, round(s["running"]["typical"])), L=I + O // 2, ratio=ratio)


def predicted_s(w, B: int, L: int, kernels_only: bool = False) -> float:
    """The uncalibrated what-if's typical decode step (s); kernels_only: without the engine's per-step host time."""
    if not kernels_only:
        return w.itl(B, L)["typical"]
    per = []
    for e in w.setting.engine_names():
        d = w.pass_detail(Pass(B, 1, L), 1, e)
        per.append(w.layout.pp * (d["seconds"] - d["terms"]["step_overhead"]))
    return statistics.median(per)


def step_ratio(w, pt: dict) -> float:
    """measured / predicted step time of a decode-step point (the what-if `w` uncalibrated)."""
    measured = pt["itl_ms"] / 1e3 if "itl_ms" in pt else 1.0 / pt["tok_s_per_user"]
    return measured / predicted_s(w, pt["B"], pt["L"], bool(pt.get("kernels_only")))


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


def priced_points(w, points: list[dict]) -> list[dict]:
    """Every point (a decode step, a finite run, a fit's row) as {B, L, ratio}: measured / predicted time on the
    what-if `w` uncalibrated."""
    base = replace(w, scale=1.0, calibration=None)
    return [run_point(base, p) if "concurrency" in p or "request_rate" in p
            else dict(B=p["B"], L=p["L"], ratio=step_ratio(base, p))
            for p in points]


def rescaled(w, priced: list[dict]):
    """The what-if `w` rescaled to priced points (`priced_points`)."""
    m, cal = calibration_of(priced, [p["ratio"] for p in priced])
    return replace(w, scale=w.scale * m, calibration=cal)


def calibrated(w, path):
    """The what-if `w` rescaled to the points of `path` (a points file or a fit.json of the same model)."""
    return rescaled(w, priced_points(w, load_points(path, w.cfg.name, w.dtype)))


def priced_deployments(path=None, engine_known: bool = True) -> dict:
    """The anchors of a file by deployment (one source, model, device, layout, engine, precision, client), each
    deployment's what-if and its anchors that are calibration points (`anchors.calibration_point`) priced once
    (`priced_points`), for `leave_one_out`; engine_known=False: as a user who names no engine (the span of the
    profiles, anchors.table's)."""
    from roofline.parallel import anchors as A
    from roofline.parallel.whatif import Setting

    models, sources, rows = A.load(path or A.ANCHORS_PATH)
    setting = None if engine_known else Setting(engine=None)  # None: each anchor's own engine
    groups: dict[tuple, list] = {}
    for a in rows:
        a = A.with_source_defaults(a, sources)
        key = (a["source"], a["model"], a["device"], a["tp"], a.get("ep", 1), bool(a.get("dp_attention")),
               a["engine"], A.served_precision(a, models[a["model"]]), a["client"],
               str(a["workload"].get("graph_batch_sizes")))
        groups.setdefault(key, []).append(a)
    out = []
    for group in groups.values():
        w = A.deployment(group[0], models[group[0]["model"]], setting)
        points = {a["id"]: A.calibration_point(a) for a in group}
        out.append(dict(w=w, anchors=group, before={},  # each anchor's uncalibrated prediction, once, when asked
                        priced={i: priced_points(w, [p])[0] for i, p in points.items() if p is not None}))
    return dict(models=models, sources=sources, setting=setting, deployments=out)


def leave_one_out(priced: dict, nearest: bool = False):
    """What calibrating on a deployment's own measurements buys, on published ones: every priced anchor of a
    deployment of `priced_deployments` with other anchors that are calibration points is priced again calibrated to
    those others (leave-one-out: never to itself), as a user who measured the rest would price it; nearest=True: to
    the one other point nearest in log batch + log context (a user who measured one point), for the anchors that are
    points themselves. A table of id, split, source, points (how many), error_pct before and after (predicted /
    published - 1), the calibrated interval; deployments of one point are left out."""
    import pandas as pd
    from roofline.parallel import anchors as A

    models, sources, setting = priced["models"], priced["sources"], priced["setting"]
    out = []
    for dep in priced["deployments"]:
        w, points = dep["w"], dep["priced"]
        for a in dep["anchors"]:
            others = [p for i, p in points.items() if i != a["id"]]
            if nearest and others and a["id"] in points:
                me = points[a["id"]]
                far = lambda p: abs(math.log(p["B"] / me["B"])) + abs(math.log((p["L"] + 1) / (me["L"] + 1)))  # noqa: E731
                others = [min(others, key=far)]
            elif nearest:
                continue
            if not others:
                continue
            try:
                if a["id"] not in dep["before"]:
                    dep["before"][a["id"]] = A.what_if(a, models[a["model"]], setting, models)["typical"]
                before = dep["before"][a["id"]]
                after = A.what_if(a, models[a["model"]], models=models, w=rescaled(w, others))
            except NotImplementedError:  # not priced (a speedup without k, a dataset of varying lengths)
                continue
            v, lo, hi = float(a["value"]), min(after.values()), max(after.values())
            out.append(dict(id=a["id"], split=A.split_of(a, sources), source=a["source"], metric=a["metric"],
                            points=len(others), published=v, predicted=before, calibrated=after["typical"],
                            calibrated_low=lo, calibrated_high=hi, error_pct=100.0 * (before / v - 1.0),
                            calibrated_error_pct=100.0 * (after["typical"] / v - 1.0),
                            calibrated_inside=bool(lo <= v <= hi),
                            calibrated_half_width_pct=100.0 * (hi - lo) / 2 / after["typical"]))
    return pd.DataFrame(out)


def anchors_leave_one_out(path=None, nearest: bool = False, engine_known: bool = True):
    """`leave_one_out` of an anchors file's deployments (`priced_deployments`)."""
    return leave_one_out(priced_deployments(path, engine_known), nearest)


def summary(w) -> dict | None:
    """What the calibration of `w` determined, for a command's JSON summary."""
    c = w.calibration
    if c is None:
        return None
    return dict(scale=w.scale, ratio_by_batch={int(b): w.scale * x for b, x in zip(c.batches, c.ratios)},
                interval_at_points=[c.low, c.high], B_range=list(c.B_range), L_range=list(c.L_range),
                reach_decades=c.reach_decades)


def leave_one_out_summary(t) -> dict:
    """Per split of an `anchors_leave_one_out` table: rows, sources, median |error| before and after, the signed
    median after (too fast > 0, as anchors.summary signs it) and the share of rows whose error shrank."""
    import numpy as np
    from roofline.parallel.anchors import speed_error
    out = {}
    for split in ("calibration", "test"):
        x = t[t["split"] == split] if len(t) else t
        if not len(x):
            out[split] = dict(n=0)
            continue
        after = speed_error(x.assign(error_pct=x["calibrated_error_pct"]))
        out[split] = dict(n=int(len(x)), sources=int(x["source"].nunique()),
                          median_abs_error_pct=float(x["error_pct"].abs().median()),
                          calibrated_median_abs_error_pct=float(x["calibrated_error_pct"].abs().median()),
                          calibrated_signed_median_fast_pct=float(np.median(after)),
                          improved=float((x["calibrated_error_pct"].abs() < x["error_pct"].abs()).mean()),
                          calibrated_inside=float(x["calibrated_inside"].mean()),
                          calibrated_median_half_width_pct=float(x["calibrated_half_width_pct"].median()))
    return out


def leave_one_out_markdown(summaries: dict) -> str:
    """The summaries of `anchors_leave_one_out` ({'all other points': ..., 'the nearest point': ...}) as a table."""
    lines = ["| calibrated to | split | n | sources | median abs error before | after | signed median after "
             "(fast > 0) | rows improved | inside the calibrated interval | its median half-width |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for mode, summary in summaries.items():
        for split, x in summary.items():
            if not x["n"]:
                continue
            lines.append(f"| {mode} | {split} | {x['n']} | {x['sources']} | {x['median_abs_error_pct']:.1f}% | "
                         f"{x['calibrated_median_abs_error_pct']:.1f}% | {x['calibrated_signed_median_fast_pct']:+.1f}% | "
                         f"{100 * x['improved']:.0f}% | {100 * x['calibrated_inside']:.0f}% | "
                         f"{x['calibrated_median_half_width_pct']:.1f}% |")
    return "\n".join(lines) + "\n"
