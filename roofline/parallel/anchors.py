"""Published deployments (roofline/data/deployments.yaml) beside the what-if's predictions.

Nothing here is fitted to the anchors: each prediction is roofline.parallel.whatif from the
device's datasheet row, the kernel priors, the anchor's engine profile and its workload
(roofline.parallel.whatif.serve: a finite run as the benchmark ran it), as an interval; the
error is that of the typical value. Anchors are split by source into a calibration set (what
priors may be derived from) and a test set (what they must never be derived from); the summary
reports both apart, overall and per category.

The what-if's interval is its priors' interval widened by its own measured error, a split-conformal
band per category (`conformal_bands`): from the CALIBRATION anchors only, and of those only the ones
whose source no prior cites (a prior derived from an anchor prices it in-sample), each one's log distance
outside its priors' interval, their weighted split-conformal quantile with each source weighing one
(never below 0) per category with at least `min_sources` calibration sources, overall for the rest. The table computes the
bands from its own file's calibration anchors; roofline/data/bands.yaml holds those of
deployments.yaml, which every other what-if prediction reads (`write_bands` regenerates it).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from roofline.io.fields import ConfigError, check_int, check_number
from roofline.io.yamltext import load_yaml
from roofline.measure.devices import get_datasheet
from roofline.model.config import ModelConfig
from roofline.model.formats import precision
from roofline.model.presets import get_preset
from roofline.parallel.engines import check_client, graph_sizes, run_scheduling
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import (BAND_CATEGORIES, BANDS_PATH, BENCH_SERVE_NUM_PROMPTS, EAGLE3_DRAFT_VOCAB,
                                      HEAD_DRAFTERS, SCENARIOS, Pass, Setting, SpecDecode, WhatIf, band_categories,
                                      band_for, check_draft_vocab, check_tree, load_bands, load_priors, pass_seconds,
                                      random_dataset_lengths, serve, serve_at_rate, widen)

ANCHORS_PATH = Path(__file__).resolve().parents[1] / "data" / "deployments.yaml"
PRIOR_PATHS = tuple(ANCHORS_PATH.parent / n for n in ("priors.yaml", "kernels.yaml", "engines.yaml"))
METRICS = ("itl_ms", "tpot_ms", "tok_s_per_user", "output_tok_s", "output_tok_s_per_gpu", "ttft_ms", "e2e_latency_s",
           "spec_speedup")
STEP_METRICS = ("itl_ms", "tpot_ms", "tok_s_per_user", "spec_speedup")  # what one decode step {B, L} gives
CATEGORIES = ("batch", "quantized", "tp", "moe", "speculative")
REQUIRED = ("id", "source", "engine", "device", "model", "tp", "workload", "metric", "value")
VARIABLE_LENGTH_DATASETS = ("sharegpt",)  # a run over a dataset's own lengths: not priced from their means
HIGHER_IS_FASTER = ("tok_s_per_user", "output_tok_s", "output_tok_s_per_gpu", "spec_speedup")


def _need(a: dict, key: str, where: str):
    if key not in a or a[key] is None:
        raise ConfigError(f"{where}: missing key {key!r}")
    return a[key]


def check_workload(wl, metric: str, where: str) -> None:
    """A workload is one decode step {B, L} (B sequences at L cached tokens: itl_ms, tpot_ms, tok_s_per_user,
    spec_speedup) or a finite run {concurrency, input_len, output_len[, num_prompts, range_ratio]} (with
    `request_rate`, requests a second as bench serve's --request-rate sends them: `concurrency` is then the client's
    --max-concurrency and may be left out, `num_prompts` 1000 unless given; whatif.serve_at_rate); either may name
    the run's CUDA-graph batch sizes (graph_batch_sizes: the engine's option, which replaces its default) and its
    scheduler settings (prefill_chunk_tokens, step_batching, max_running_seqs: engines.run_scheduling)."""
    if not isinstance(wl, dict):
        raise ConfigError(f"{where}: workload={wl!r}: expected a mapping, {{B, L}} or "
                          f"{{concurrency, input_len, output_len}}")
    if "graph_batch_sizes" in wl:
        graph_sizes(wl["graph_batch_sizes"], f"{where}: workload.graph_batch_sizes")
    run_scheduling(wl, f"{where}: workload.")
    if "B" in wl or "L" in wl:
        for key, least in (("B", 1), ("L", 0)):
            check_int(f"{where}: workload.{key}", _need(wl, key, f"{where}: workload"), least)
        if metric not in STEP_METRICS:
            raise ConfigError(f"{where}: metric={metric!r} needs a workload {{concurrency, input_len, output_len}} "
                              f"(a decode step {{B, L}} gives {', '.join(STEP_METRICS)})")
        return
    if metric == "spec_speedup":
        raise ConfigError(f"{where}: metric='spec_speedup' needs a workload {{B, L}} (one verification step)")
    rate = "request_rate" in wl
    if rate:
        check_number(f"{where}: workload.request_rate", wl["request_rate"], 0.0, lo_open=True)
    for key in ("input_len", "output_len") if rate else ("concurrency", "input_len", "output_len"):
        v = _need(wl, key, f"{where}: workload (a decode step {{B, L}} or a finite run)")
        check_int(f"{where}: workload.{key}", v, 1)
    for key in ("num_prompts", "concurrency") if rate else ("num_prompts",):
        if wl.get(key) is not None:
            check_int(f"{where}: workload.{key}", wl[key], 1)


def check_anchor(a, where: str, sources: dict, seen: set) -> None:
    """Every field the what-if reads, as a one-line ConfigError naming the anchor and the field."""
    if not isinstance(a, dict):
        raise ConfigError(f"{where}={a!r}: expected a mapping with {', '.join(REQUIRED)}")
    for key in REQUIRED:
        _need(a, key, where)
    if a["id"] in seen:
        raise ConfigError(f"{where}: id={a['id']!r}: given twice (ids name one anchor each)")
    seen.add(a["id"])
    if a["metric"] not in METRICS:
        raise ConfigError(f"{where}: metric={a['metric']!r}: allowed {METRICS}")
    if a["source"] not in sources:
        raise ConfigError(f"{where}: source={a['source']!r}: not in sources {sorted(sources)}")
    check_number(f"{where}: value", a["value"], 0.0, lo_open=True)
    for key in ("tp", "ep", "n_devices"):
        if a.get(key) is not None:
            check_int(f"{where}: {key}", a[key], 1)
    if not isinstance(a.get("dp_attention", False), bool):
        raise ConfigError(f"{where}: dp_attention={a['dp_attention']!r}: allowed true or false")
    if a.get("batching") not in (None, "static", "continuous"):
        raise ConfigError(f"{where}: batching={a['batching']!r}: allowed static or continuous")
    cat = a.get("category")
    if cat is not None and not (isinstance(cat, list) and all(isinstance(c, str) for c in cat)):
        raise ConfigError(f"{where}: category={cat!r}: allowed a list of names")
    if a.get("spec") is not None and not isinstance(a["spec"], dict):
        raise ConfigError(f"{where}: spec={a['spec']!r}: expected a mapping {{drafter, k, acceptance}}")
    spec = a.get("spec") or {}
    if isinstance(spec.get("k"), int) and (spec.get("topk") is not None or spec.get("num_draft_tokens") is not None):
        try:
            check_tree(spec["k"], spec.get("topk", 1), spec.get("num_draft_tokens"), spec.get("drafter", "mtp"))
        except ConfigError as e:
            raise ConfigError(f"{where}: spec.{e}") from None
    if spec.get("accepted_length") is not None:
        check_number(f"{where}: spec.accepted_length", spec["accepted_length"], 1.0)
    if spec.get("draft_vocab") is not None:
        try:
            check_draft_vocab(spec["draft_vocab"])
        except ConfigError as e:
            raise ConfigError(f"{where}: spec.{e}") from None
    check_workload(a["workload"], a["metric"], where)


def load(path=ANCHORS_PATH) -> tuple[dict[str, ModelConfig], dict, list[dict]]:
    """(models, sources, anchors); a missing or bad key is a ConfigError naming the anchor and field."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"anchors={str(path)!r}: no such file")
    try:
        doc = load_yaml(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"anchors={str(path)!r}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"anchors={str(path)!r}: expected a mapping with sources: and anchors:")
    sources = doc.get("sources") or {}
    if not isinstance(sources, dict):
        raise ConfigError(f"anchors file {p.name}: sources: expected a mapping of source id to {{title, url, split}}")
    models = {}
    for name, m in _mapping(doc.get("models") or {}, f"anchors file {p.name}: models").items():
        where = f"models.{name}"
        overrides = _mapping((_mapping(m, where).get("overrides") or {}), f"{where}.overrides")
        try:
            models[name] = get_preset(_need(m, "preset", where)).scaled(**overrides)
        except TypeError as e:
            raise ConfigError(f"{where}.overrides: {e}") from None
    anchors = _need(doc, "anchors", f"anchors file {p.name}")
    if not isinstance(anchors, list) or not anchors:
        raise ConfigError(f"anchors file {p.name}: anchors: expected a non-empty list")
    for sid, src in sources.items():
        src = _mapping(src, f"sources.{sid}")
        if src.get("split", "calibration") not in ("calibration", "test"):
            raise ConfigError(f"sources.{sid}: split={src['split']!r}: allowed calibration or test")
        try:
            check_client(src.get("client", "server"))
        except ConfigError as e:
            raise ConfigError(f"sources.{sid}: {e}") from None
    seen: set = set()
    for i, a in enumerate(anchors):
        where = f"anchors[{i}]" + (f" ({a['id']})" if isinstance(a, dict) and "id" in a else "")
        check_anchor(a, where, sources, seen)
        try:
            check_client(a.get("client", "server"))
            served_precision(a, None)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        if a["model"] not in models:
            try:
                models[a["model"]] = get_preset(a["model"])
            except (ConfigError, KeyError, ValueError):
                raise ConfigError(f"{where}: model={a['model']!r}: not a preset nor in models:") from None
    return models, sources, anchors


def _mapping(x, where: str) -> dict:
    if not isinstance(x, dict):
        raise ConfigError(f"{where}={x!r}: expected a mapping")
    return x


def served_precision(a: dict, cfg: ModelConfig) -> str:
    """The precision label the deployment served: its dtype with its weights / kv / lm_head formats
    (roofline.model.formats names; a float format equal in size to the dtype is the dtype itself)."""
    dtype = a.get("dtype") or "bfloat16"
    plain = lambda f: None if f in (None, "bf16", "fp16", "bfloat16", "float16") else f  # noqa: E731
    return precision(dtype, plain(a.get("weights")), plain(a.get("kv")), plain(a.get("lm_head")),
                     cfg.native_weights if cfg is not None else "", plain(a.get("experts")),
                     cfg.native_experts if cfg is not None else "", cfg).label


def split_of(a: dict, sources: dict) -> str:
    return sources[a["source"]].get("split", "calibration")


def layout_of(a: dict) -> Layout:
    """The anchor's layout: tp, ep, attention data parallelism."""
    return Layout(tp=a["tp"], ep=a.get("ep", 1), dp_attention=bool(a.get("dp_attention", False)))


def deployment(a: dict, cfg: ModelConfig, setting: Setting | None = None) -> WhatIf:
    """The anchor's deployment as the what-if prices it: model, device, precision, layout, engine (and its CUDA-graph
    batch sizes where the run states them), uncalibrated."""
    lay = layout_of(a)
    setting = setting or Setting(engine=a["engine"])
    wl = a["workload"]
    if "graph_batch_sizes" in wl:  # the run's own CUDA-graph batch sizes (its engine options, as its source prints)
        setting = dataclasses.replace(setting, graph_batch_sizes=graph_sizes(
            wl["graph_batch_sizes"], f"anchor {a['id']}: workload.graph_batch_sizes"))
    return WhatIf(cfg, get_datasheet(a["device"]), served_precision(a, cfg), lay, setting)


def what_if(a: dict, cfg: ModelConfig, setting: Setting | None = None, models: dict | None = None,
            w: WhatIf | None = None) -> dict:
    """{optimistic, typical, pessimistic} of the anchor's metric, in its unit (models: the anchors
    file's own models, where a draft model may be named; w: its deployment's what-if, calibrated, in place of
    `deployment`'s)."""
    w = w if w is not None else deployment(a, cfg, setting)
    lay, wl = w.layout, a["workload"]
    m = a["metric"]
    if a.get("dataset") in VARIABLE_LENGTH_DATASETS:
        raise NotImplementedError(f"dataset={a['dataset']!r}: lengths vary request by request and only their means are "
                                  "known; the fixed-length what-if prices the mean request, not the run (its tail of long "
                                  "outputs and the prefill burst of requests sent at once)")
    if m == "spec_speedup":
        spec = a.get("spec") or {}
        k = spec.get("k")
        alpha = spec_alphas(spec)
        if not isinstance(k, int) or alpha is None:
            raise NotImplementedError(f"k={k!r}, acceptance={spec.get('acceptance')!r}: a speedup needs both stated")
        if spec.get("drafter") not in SPEEDUP_DRAFTERS:
            raise NotImplementedError(f"drafter={spec.get('drafter')!r}: priced per rank: {list(SPEEDUP_DRAFTERS)}")
        return w.spec_speedup(alpha, k, wl["B"], wl["L"], spec["drafter"],
                              draft_vocab=spec.get("draft_vocab", EAGLE3_DRAFT_VOCAB), width=spec.get("topk", 1),
                              verify_tokens=spec.get("num_draft_tokens"))
    if "B" in wl:  # one decode step of B sequences at L cached tokens
        itl = w.itl(wl["B"], wl["L"])
        r = dict(itl_s=itl, tok_s_per_user={k: 1 / v for k, v in itl.items()})
        if m in ("itl_ms", "tpot_ms"):  # one decode step: its time is both
            return {k: v * 1e3 for k, v in itl.items()}
        if m == "tok_s_per_user":
            return r["tok_s_per_user"]
        raise ConfigError(f"anchor {a['id']}: metric={m!r} needs a workload {{concurrency, input_len, output_len}}")
    I, O, staggered = random_lengths(wl)
    spec = finite_spec(a, w, models or {}) if a.get("spec") else None
    if "request_rate" in wl:  # requests arriving at a rate (bench serve --request-rate): staggered by nature
        if a.get("batching") == "static":
            raise ConfigError(f"anchor {a['id']}: workload.request_rate with batching: static: a static batch runs "
                              "its requests at once")
        s = serve_at_rate(w, I, O, wl["request_rate"], wl.get("num_prompts"),
                          wl.get("concurrency"), spec=spec, client=a.get("client", "server"),
                          **run_scheduling(wl, f"anchor {a['id']}: workload."))
    else:
        s = serve(w, I, O, wl["concurrency"], wl.get("num_prompts"), spec=spec,
                  static_batch=a.get("batching") == "static", staggered=staggered, client=a.get("client", "server"),
                  **run_scheduling(wl, f"anchor {a['id']}: workload."))
    conv = {"itl_ms": lambda d: {k: v * 1e3 for k, v in d["itl_s"].items()},
            "tpot_ms": lambda d: {k: v * 1e3 for k, v in d["itl_mean_s"].items()},
            "ttft_ms": lambda d: {k: v * 1e3 for k, v in d["ttft_s"].items()},
            "e2e_latency_s": lambda d: d["e2e_s"],
            "tok_s_per_user": lambda d: {k: O / v for k, v in d["e2e_s"].items()},
            "output_tok_s": lambda d: d["output_tok_s"],
            "output_tok_s_per_gpu": lambda d: {k: v / a.get("n_devices", lay.devices)
                                               for k, v in d["output_tok_s"].items()}}
    return conv[m](s)


SPEEDUP_DRAFTERS = HEAD_DRAFTERS  # a speedup anchor's drafters: heads priced on the target's own ranks


def spec_alphas(spec: dict) -> tuple[float, float, float] | None:
    """(optimistic, typical, pessimistic) i.i.d. acceptance of a speculative anchor: from its per-position `acceptance`
    (their max, mean, min), or from the `accepted_length` its source states (mean tokens a round emits, the bonus token
    included, as vLLM and SGLang report it), the one alpha whose tau_iid(alpha, k) is that length: the speedup depends
    on the acceptance only through tau. None where neither is stated."""
    acc, k, al = spec.get("acceptance"), spec.get("k"), spec.get("accepted_length")
    if isinstance(acc, list) and acc:
        return max(acc), float(np.mean(acc)), min(acc)
    if al is None or not isinstance(k, int):
        return None
    a = alpha_for_tau(float(al), k)
    return a, a, a


def alpha_for_tau(tau: float, k: int) -> float:
    """The i.i.d. acceptance alpha with tau_iid(alpha, k) = tau (bisection; tau in [1, k + 1])."""
    from roofline.model.speculation import tau_iid
    if not 1.0 <= tau <= k + 1:
        raise ConfigError(f"accepted_length={tau!r}: allowed 1 to k + 1 = {k + 1} tokens a round")
    if tau in (1.0, k + 1.0):  # nothing accepted, or everything
        return 0.0 if tau == 1.0 else 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tau_iid(mid, k) < tau else (lo, mid)
    return (lo + hi) / 2


def source_deployments(source: str, engine: str, path=ANCHORS_PATH):
    """Each anchor of `source` with its deployment as the what-if prices it under `engine`, uncalibrated and without
    bands (deployment): what the fits of an engine's measured times (spec_round_fit, allreduce_fit, eager_host_fit)
    walk."""
    models, _, anchors = load(path)
    for a in anchors:
        if a["source"] == source:
            yield a, deployment(a, models.get(a["model"]) or get_preset(a["model"]), Setting(engine=engine, bands=()))


def spec_round_fit(source: str, engine: str = "vllm", path=ANCHORS_PATH) -> dict[str, tuple[float, float]]:
    """{drafter: (round us, us per draft pass)}: a source's measured speculative rounds at batch 1 less the rounds as
    priced without `engine`'s own round and draft-pass times (engines.yaml spec_round_us / spec_draft_pass_us, which
    this derives), fitted as a line in k per drafter. A round's measured time is the plain step's (the source's tpot_ms
    anchor at the same B and L) over the speedup, times the accepted length: TPOT x accepted length."""
    rows = list(source_deployments(source, engine, path))
    plain = {(a["workload"]["B"], a["workload"]["L"]): a["value"] for a, _ in rows if a["metric"] == "tpot_ms"}
    fits: dict[str, tuple[list, list]] = {}
    for a, w in rows:
        if a["metric"] != "spec_speedup":
            continue
        spec, wl = a["spec"], a["workload"]
        k, t1 = spec["k"], plain[(wl["B"], wl["L"])] * 1e-3
        prof = w._eng(engine, 1)
        priced = w.round_seconds(k, wl["B"], wl["L"], 1, engine, spec["drafter"],
                                 draft_vocab=spec.get("draft_vocab", EAGLE3_DRAFT_VOCAB))
        priced -= (prof.spec_round_s or 0.0) + k * prof.spec_draft_pass_s
        measured = t1 / a["value"] * spec["accepted_length"]
        ks, res = fits.setdefault(spec["drafter"], ([], []))
        ks.append(k)
        res.append((measured - priced) * 1e6)
    return {d: tuple(reversed([float(c) for c in np.polyfit(ks, res, 1)])) for d, (ks, res) in fits.items()}


def allreduce_fit(source: str, engine: str, link: str, path=ANCHORS_PATH) -> tuple[float, float]:
    """(latency us, bus GB/s) of `engine`'s all-reduce on `link` from a source's decode-step anchors across devices
    (itl_ms at B, L, tp > 1): each step's measured time less the step as priced without its all-reduces (its other
    collectives priced), over its all-reduce calls, is one call's time, lat + bus bytes / busbw; a least-squares
    line in the bus bytes of one call (whatif.pass_seconds' `collectives`). What engines.yaml
    <engine>.allreduce.<link> is derived by."""
    xs, ys = [], []
    for a, w in source_deployments(source, engine, path):
        wl = a["workload"]
        if a["metric"] != "itl_ms" or layout_of(a).tp < 2:
            continue
        d = w.pass_detail(Pass(wl["B"], 1, wl["L"]), 1, engine)
        calls = [c for c in d["collectives"] if c[0] == "all_reduce" and c[1] == link]
        if not calls:
            continue
        n = sum(c[2] for c in calls)
        priced = sum(c[2] * c[4] for c in calls)  # the all-reduces as priced now (the other collectives stay)
        xs.append(calls[0][3])
        ys.append((a["value"] * 1e-3 - (d["seconds"] - priced)) / n)
    slope, lat = np.polyfit(xs, ys, 1)
    return float(lat * 1e6), float(1 / slope / 1e9)


def eager_host_fit(source: str, engine: str = "hf-eager-qwen1", path=ANCHORS_PATH) -> tuple[float, float]:
    """(host us per decoder layer, serial host us per step) of an eager engine (`host_issue`) from a source's batch-1
    runs of models of different depths (tok_s_per_user of a finite run): a host-bound eager step takes the host's issue
    of its layers, then the LM head issued last, then its own host time (whatif.host_issue_seconds), so each run's
    measured time per token less its priced LM head is n_layers x (host per layer) + (step host time). A least-squares
    line in the layer count over the runs the host bounds (its issue longer than the GPU's priced work of the layers);
    a negative intercept is taken as 0 and the slope refitted through the origin. What engines.yaml <engine>'s
    host_issue.us_per_launch (per layer / launches_per_layer) and step_overhead_us are derived by."""
    rows = []
    for a, w in source_deployments(source, engine, path):
        wl = a["workload"]
        if a["metric"] != "tok_s_per_user" or "concurrency" not in wl:
            continue
        eng = dataclasses.replace(w._eng(engine, 1), host_s_per_launch=0.0, step_overhead_s=0.0)
        L = wl["input_len"] + wl["output_len"] // 2  # the run's mean context
        d = pass_seconds(w.cfg, w.layout, w.dtype, Pass(1, 1, L), w.device, eng, 1, w._kern(), load_priors())
        gpu = d["seconds"] - d["terms"]["lm_head"]  # the layers' GPU work (no host time: it is zeroed)
        rows.append((w.cfg.layers, 1.0 / float(a["value"]) - d["terms"]["lm_head"], gpu))
    n, t, gpu = (np.array(x, dtype=float) for x in zip(*rows))
    slope, icpt = np.polyfit(n, t, 1)
    bound = n * slope > gpu
    slope, icpt = np.polyfit(n[bound], t[bound], 1) if bound.sum() >= 2 else (slope, icpt)
    if icpt < 0:
        slope, icpt = float(np.sum(n[bound] * t[bound]) / np.sum(n[bound] ** 2)), 0.0
    return float(slope * 1e6), float(icpt * 1e6)


def calibration_point(a: dict) -> dict | None:
    """The anchor's measurement as a point of a `calibrate=` file (roofline.analysis.calibrate): a decode step {B, L,
    itl_ms | tok_s_per_user} or a finite run {concurrency, input_len, output_len, itl_ms | tpot_ms | e2e_latency_s |
    output_tok_s, ...}; None where it says nothing of the steps' time as such a point does (a TTFT, a speculative
    speedup or run, a static batch, a dataset of varying lengths)."""
    wl, m, v = a["workload"], a["metric"], float(a["value"])
    if (a.get("spec") or m in ("ttft_ms", "spec_speedup") or a.get("batching") == "static" or a.get("dataset")
            or "request_rate" in wl):
        return None
    if "B" in wl:
        return dict(B=wl["B"], L=wl["L"], **({"tok_s_per_user": v} if m == "tok_s_per_user" else {"itl_ms": v}))
    run = {k: wl[k] for k in ("concurrency", "input_len", "output_len", "num_prompts", "range_ratio") if k in wl}
    run["client"] = a.get("client", "server")
    if m == "tok_s_per_user":  # output / e2e of the run's mean request
        return dict(run, e2e_latency_s=random_lengths(wl)[1] / v)
    if m == "output_tok_s_per_gpu":
        return dict(run, output_tok_s=v * a.get("n_devices", layout_of(a).devices))
    return dict(run, **{m: v})


def random_lengths(wl: dict) -> tuple[int, int, bool]:
    """(input, output, staggered) of a finite run's workload (its `range_ratio`: whatif.random_dataset_lengths)."""
    return random_dataset_lengths(wl["input_len"], wl["output_len"], wl.get("range_ratio", 1.0), "workload.range_ratio")


def finite_spec(a: dict, w: WhatIf, models: dict) -> SpecDecode:
    """The speculative decoding of a finite-run anchor: k, the acceptance (one rate, or one per
    position), the drafter (a draft model: a preset, in `draft_weights` or the target's format);
    NotImplementedError where the source does not state k or the acceptance."""
    spec = a["spec"]
    k, acc = spec.get("k"), spec.get("acceptance")
    if isinstance(acc, (int, float)) and not isinstance(acc, bool):
        acc = [acc]
    if acc is None and spec.get("accepted_length") is not None and isinstance(k, int):
        acc = [alpha_for_tau(float(spec["accepted_length"]), k)]  # the stated mean length: its i.i.d. alpha
    if not isinstance(k, int) or not isinstance(acc, list):
        raise NotImplementedError(f"k={k!r}, acceptance={spec.get('acceptance')!r}: a finite speculative run needs both")
    draft = None
    if spec.get("drafter") == "draft_model":
        try:
            dcfg = models.get(spec.get("draft_model")) or get_preset(spec.get("draft_model"))
        except (ConfigError, KeyError, ValueError):
            raise NotImplementedError(f"draft_model={spec.get('draft_model')!r}: not a preset nor in models:") from None
        d = dict(a, weights=spec.get("draft_weights", a.get("weights")))
        draft = WhatIf(dcfg, w.device, served_precision(d, dcfg), Layout(), w.setting)
    return SpecDecode(k, tuple(float(x) for x in acc), spec.get("drafter", "mtp"), draft,
                      spec.get("draft_vocab", EAGLE3_DRAFT_VOCAB), spec.get("topk", 1), spec.get("num_draft_tokens"))


def band_categories_of(a: dict, cfg: ModelConfig) -> tuple[str, ...]:
    """The what-if's band categories of an anchor (whatif.band_categories: from its model, precision,
    layout, sequences at a time and speculation, not from its hand-written `category` labels)."""
    wl = a["workload"]
    at_rate = (wl.get("num_prompts") or BENCH_SERVE_NUM_PROMPTS) if "request_rate" in wl else 1  # more than one
    return band_categories(cfg, served_precision(a, cfg), layout_of(a), wl.get("B", wl.get("concurrency") or at_rate),
                           bool(a.get("spec")))


def band_settings(path=BANDS_PATH) -> tuple[float, int]:
    """(coverage, min_sources) of the conformal bands, as bands.yaml states them."""
    doc = load_yaml(Path(path).read_text())
    return float(doc["coverage"]), int(doc["min_sources"])


def weighted_quantile(scores: np.ndarray, sources: np.ndarray, coverage: float) -> float:
    """The split-conformal quantile with a SOURCE as the unit of exchangeability: each row weighs 1 / (its
    source's rows), so each of the S sources weighs 1, and a new source (the deployment predicted) one
    more at +infinity; the smallest score whose cumulative weight reaches coverage · (S + 1), floored at 0.
    With one row per source it is the ceil((S + 1) · coverage)-th smallest score. Infinite when S is too
    small for that level (S < 4 at 80%)."""
    S = len(set(sources))
    if S == 0 or coverage * (S + 1) > S + 1e-12:
        return math.inf
    counts = pd.Series(sources).value_counts()
    w = np.array([1.0 / counts[s] for s in sources])
    order = np.argsort(scores, kind="stable")
    cum = np.cumsum(w[order])
    i = int(np.searchsorted(cum, coverage * (S + 1) - 1e-9))
    return float(max(0.0, scores[order][i])) if i < len(scores) else math.inf


def conformal_bands(raw: pd.DataFrame, coverage: float | None = None, min_sources: int | None = None) -> dict:
    """Split-conformal error bands (log half-widths) from the CALIBRATION rows of a table priced with
    the priors' interval only (table(bands=())): each row's score is log(low / published) or
    log(published / high), whichever is larger (negative inside); a category's band is the weighted
    quantile of its rows' scores with each source weighing one (`weighted_quantile`: the rows of one source
    share a setup and their errors move together, so a source with 48 rows counts as one deployment, not
    48), for every category with at least min_sources sources; 'all' over every calibration row kept.
    Test rows are dropped before anything is computed, and so are the calibration rows of a source a
    prior cites (`prior_cited`): a prior derived from them prices them in-sample, and their residuals
    would understate the error of a deployment no prior has seen."""
    c0, m0 = band_settings()
    coverage, min_sources = coverage if coverage is not None else c0, min_sources if min_sources is not None else m0
    priced = raw[(raw["split"] == "calibration") & raw["predicted"].notna()]
    in_sample = priced["prior_cited"].astype(bool) if "prior_cited" in priced else pd.Series(False, priced.index)
    cal = priced[~in_sample]
    y = cal["published"].to_numpy(float)
    score = np.maximum(np.log(cal["prior_low"].to_numpy(float) / y), np.log(y / cal["prior_high"].to_numpy(float)))
    src = cal["source"].to_numpy(str)
    cats = cal["band_categories"].str.split(",")
    out = dict(all=weighted_quantile(score, src, coverage))
    n_src = dict(all=len(set(src)))
    for c in BAND_CATEGORIES:
        m = cats.apply(lambda cs, c=c: c in cs).to_numpy(bool)
        n_src[c] = len(set(src[m]))
        if n_src[c] >= min_sources:
            out[c] = weighted_quantile(score[m], src[m], coverage)
    counts = {c: int(cats.apply(lambda cs, c=c: c in cs).sum()) for c in BAND_CATEGORIES}
    return dict(bands_log=out, n=dict(all=int(len(score)), **counts), n_sources=n_src,
                n_in_sample=int(in_sample.sum()))


def write_bands(path=ANCHORS_PATH, out=BANDS_PATH) -> dict:
    """Recompute the bands from `path`'s calibration anchors and write them into bands.yaml (its
    coverage, min_sources and comments kept)."""
    b = conformal_bands(table(path, bands=()))
    text = Path(out).read_text()
    head = text.split("bands_log:")[0]
    body = "bands_log:\n" + "".join(f"  {k}: {round(v, 4)}\n" for k, v in b["bands_log"].items())
    body += "n_calibration:\n" + "".join(f"  {k}: {v}\n" for k, v in b["n"].items())
    body += "n_calibration_sources:\n" + "".join(f"  {k}: {v}\n" for k, v in b["n_sources"].items())
    body += f"n_calibration_left_out_in_sample: {b['n_in_sample']}\n"
    Path(out).write_text(head + body)
    from roofline.parallel import whatif
    whatif.load_bands.cache_clear()
    return b


def with_source_defaults(a: dict, sources: dict) -> dict:
    """The anchor with its source's method (batching, dataset, client) where it does not state its own."""
    src = sources[a["source"]]
    return dict(a, batching=a.get("batching", src.get("batching")), dataset=a.get("dataset", src.get("dataset")),
                client=a.get("client", src.get("client", "server")))


def _row(a: dict, models: dict, sources: dict, text: str, engine_known: bool) -> dict:
    """One anchor's row of `table`, before its band: the priors' interval (prior_low, prior_high) or a note
    saying why it is not priced."""
    cfg = models[a["model"]]
    base = dict(id=a["id"], split=split_of(a, sources), source=a["source"], engine=a["engine"],
                prior_cited=cited_by(a["source"], sources[a["source"]], text),
                device=a["device"], model=a["model"], tp=a["tp"], metric=a["metric"],
                category=",".join(a.get("category") or []), published=float(a["value"]),
                predicted_dtype=served_precision(a, cfg), band_categories=",".join(band_categories_of(a, cfg)))
    a = with_source_defaults(a, sources)
    try:
        p = what_if(a, cfg, Setting(engine=a["engine"] if engine_known else None, bands=()), models)
    except NotImplementedError as e:
        return dict(base, predicted=np.nan, low=np.nan, high=np.nan, error_pct=np.nan, inside=False,
                    note=f"not priced: {e}")
    return dict(base, predicted=p["typical"], prior_low=min(p.values()), prior_high=max(p.values()),
                error_pct=100.0 * (p["typical"] / float(a["value"]) - 1.0), note="")


def table(path=ANCHORS_PATH, engine_known: bool = True, bands: tuple | None = None) -> pd.DataFrame:
    """One row per anchor: published, predicted (typical), interval, error, split, categories.
    engine_known=False predicts as a user who does not say which engine runs (span of profiles).
    The interval (low, high) is the priors' (prior_low, prior_high) widened by the band of the row's
    band categories (band_pct: e^band − 1): bands None computes them from this file's calibration
    rows (conformal_bands; the shipped bands.yaml where it has too few, attrs["bands_from"] says which),
    () widens nothing, else (category, log half-width) pairs."""
    models, sources, anchors = load(path)
    text = prior_sources(PRIOR_PATHS)
    rows = []
    for i, a in enumerate(anchors):
        try:
            rows.append(_row(a, models, sources, text, engine_known))
        except ConfigError as e:  # the device, layout, engine or spec of this anchor
            raise ConfigError(f"anchors[{i}] ({a['id']}): {e}") from None
    t = pd.DataFrame(rows)
    for c in ("prior_low", "prior_high"):  # also when no anchor was priced (each row then has its note alone)
        if c not in t:
            t[c] = np.nan
    bands_from = "given" if bands is not None else "this file's calibration anchors"
    table_bands = conformal_bands(t)["bands_log"] if bands is None else dict(bands)
    if not math.isfinite(table_bands.get("all", 0.0)):  # too few kept calibration sources for an 80% quantile
        table_bands = dict(load_bands())
        bands_from = (f"{BANDS_PATH.name} (this file has too few calibration sources that no prior cites "
                      f"for its own: an 80% split-conformal band needs at least 4)")
    for i, r in t.iterrows():
        if pd.isna(r["predicted"]):
            continue
        q = band_for([c for c in r["band_categories"].split(",") if c], table_bands)
        w = widen(dict(optimistic=r["prior_low"], typical=r["predicted"], pessimistic=r["prior_high"]), q)
        lo, hi = min(w.values()), max(w.values())
        t.loc[i, ["low", "high", "band_pct"]] = lo, hi, 100.0 * (math.exp(q) - 1.0)
        t.loc[i, "inside"] = bool(lo <= r["published"] <= hi)
        t.loc[i, "half_width_pct"] = 100.0 * (hi - lo) / 2 / r["predicted"]
    t["inside"] = t["inside"].astype(bool)
    t.attrs["bands_log"], t.attrs["bands_from"] = table_bands, bands_from
    return t


def speed_error(t: pd.DataFrame) -> pd.Series:
    """Signed error as 'too fast' > 0 whatever the metric's direction (tokens/s high = fast; ms high = slow)."""
    sign = np.where(t["metric"].isin(HIGHER_IS_FASTER), 1.0, -1.0)
    return t["error_pct"] * sign


def summary(t: pd.DataFrame) -> dict:
    """Median |error|, signed median (too fast > 0), share inside the interval and median interval
    half-width, per split, overall and per category."""
    out = {}
    t = t[t["predicted"].notna()].assign(fast_pct=lambda d: speed_error(d))
    for split, g in t.groupby("split"):
        cats = {"all": g}
        cats.update({c: g[g["category"].str.split(",").apply(lambda cs: c in cs)] for c in CATEGORIES})
        out[split] = {c: dict(n=int(len(s)), median_abs_error_pct=float(s["error_pct"].abs().median()),
                              signed_median_fast_pct=float(s["fast_pct"].median()),
                              inside_interval=float(s["inside"].mean()),
                              median_half_width_pct=float(s["half_width_pct"].median()))
                      if len(s) else dict(n=0) for c, s in cats.items()}
    return out


def _pct(x: float, signed: bool = False) -> str:
    return f"{x:+.1f}%" if signed else f"{x:.1f}%"


def _num(x: float) -> str:
    return f"{x:.4g}"


def markdown(t: pd.DataFrame) -> str:
    """The table as the docs show it: per split the summary overall and per category, then every test
    anchor (published, predicted, interval, error). Rendered from `table`'s columns only, so the
    committed anchors.csv renders the committed anchors.md (a test holds the two and the code together)."""
    s = summary(t)
    out = ["| split | category | n | median abs error | signed median (fast > 0) | inside interval | "
           "median half-width |", "|---|---|---|---|---|---|---|"]
    for split in ("test", "calibration"):
        for cat in ("all",) + CATEGORIES:
            r = s.get(split, {}).get(cat, dict(n=0))
            if not r["n"]:
                out.append(f"| {split} | {cat} | 0 | | | | |")
                continue
            out.append(f"| {split} | {cat} | {r['n']} | {_pct(r['median_abs_error_pct'])} | "
                       f"{_pct(r['signed_median_fast_pct'], True)} | {100 * r['inside_interval']:.0f}% | "
                       f"{_pct(r['median_half_width_pct'])} |")
    out += ["", "Test anchors (error = predicted / published - 1; for a latency, negative is too fast):", "",
            "| id | engine | category | metric | published | predicted | interval | error | inside |",
            "|---|---|---|---|---|---|---|---|---|"]
    for _, r in t[t["split"] == "test"].iterrows():
        head = f"| {r['id']} | {r['engine']} | {r['category']} | {r['metric']} | {_num(r['published'])} |"
        if pd.isna(r["predicted"]):
            out.append(f"{head} {r['note']} | | | |")
            continue
        out.append(f"{head} {_num(r['predicted'])} | {_num(r['low'])}-{_num(r['high'])} | "
                   f"{_pct(r['error_pct'], True)} | {'yes' if r['inside'] else 'no'} |")
    return "\n".join(out) + "\n"


def prior_sources(paths) -> str:
    """All text of the priors' source fields (priors.yaml, kernels.yaml, engines.yaml) as one string."""
    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k in ("source", "sources", "url"):
                    yield str(v)
                yield from walk(v)
        elif isinstance(x, list):
            for v in x:
                yield from walk(v)
    return "\n".join(s for p in paths if Path(p).exists() for s in walk(load_yaml(Path(p).read_text())))


def cited_by(sid: str, source: dict, text: str) -> bool:
    """Whether the priors' source text cites this deployment source, by its url or its id."""
    url = str(source.get("url", "")).split("#")[0].rstrip("/")  # the page itself (one repository holds many pages)
    return bool(url and url in text) or sid in text


def test_sources_cited_by_priors(path=ANCHORS_PATH, prior_paths=PRIOR_PATHS) -> list[str]:
    """Test-split sources whose url (or id) a prior's source cites: must be empty."""
    _, sources, _ = load(path)
    text = prior_sources(prior_paths)
    return [sid for sid, s in sources.items() if s.get("split") == "test" and cited_by(sid, s, text)]


def trend(anchor_id: str, Bs=(1, 2, 4, 8, 16, 32, 64), path=ANCHORS_PATH) -> pd.DataFrame:
    """The anchor's metric predicted over batch sizes (decode-step anchors: workload {B, L})."""
    models, _, anchors = load(path)
    hits = [a for a in anchors if a["id"] == anchor_id]
    if not hits:
        raise ConfigError(f"trend={anchor_id!r}: allowed {[a['id'] for a in anchors]}")
    a = hits[0]
    if "B" not in a["workload"]:
        raise ConfigError(f"trend={anchor_id!r}: a decode-step anchor (workload {{B, L}}) is needed")
    rows = []
    for B in Bs:
        b = dict(a, workload=dict(a["workload"], B=B))
        rows.append(dict(B=B, **{s: what_if(b, models[a["model"]], None, models)[s] for s in SCENARIOS}))
    return pd.DataFrame(rows)
