"""Published deployments (roofline/data/deployments.yaml) beside the what-if's predictions.

Nothing here is fitted to the anchors: each prediction is roofline.parallel.whatif from the
device's datasheet row, the kernel priors, the anchor's engine profile and its workload
(roofline.parallel.whatif.serve: a finite run as the benchmark ran it), as an interval; the
error is that of the typical value. Anchors are split by source into a calibration set (what
priors may be derived from) and a test set (what they must never be derived from); the summary
reports both apart, overall and per category.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from roofline.io.fields import ConfigError
from roofline.measure.devices import get_datasheet
from roofline.model.config import ModelConfig
from roofline.model.formats import precision
from roofline.model.presets import get_preset
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import SCENARIOS, Setting, SpecDecode, WhatIf, serve

ANCHORS_PATH = Path(__file__).resolve().parents[1] / "data" / "deployments.yaml"
METRICS = ("itl_ms", "tok_s_per_user", "output_tok_s", "output_tok_s_per_gpu", "ttft_ms", "e2e_latency_s",
           "spec_speedup")
CATEGORIES = ("batch", "quantized", "tp", "moe", "speculative")
REQUIRED = ("id", "source", "engine", "device", "model", "tp", "workload", "metric", "value")
HIGHER_IS_FASTER = ("tok_s_per_user", "output_tok_s", "output_tok_s_per_gpu", "spec_speedup")


def _need(a: dict, key: str, where: str):
    if key not in a or a[key] is None:
        raise ConfigError(f"{where}: missing key {key!r}")
    return a[key]


def load(path=ANCHORS_PATH) -> tuple[dict[str, ModelConfig], dict, list[dict]]:
    """(models, sources, anchors); a missing or bad key is a ConfigError naming the anchor and field."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"anchors={str(path)!r}: no such file")
    doc = yaml.safe_load(p.read_text()) or {}
    sources = doc.get("sources") or {}
    models = {}
    for name, m in (doc.get("models") or {}).items():
        models[name] = get_preset(_need(m, "preset", f"models.{name}")).scaled(**(m.get("overrides") or {}))
    anchors = _need(doc, "anchors", f"anchors file {p.name}")
    for i, a in enumerate(anchors):
        where = f"anchors[{i}]" + (f" ({a['id']})" if isinstance(a, dict) and "id" in a else "")
        for key in REQUIRED:
            _need(a, key, where)
        if a["metric"] not in METRICS:
            raise ConfigError(f"{where}: metric={a['metric']!r}: allowed {METRICS}")
        if a["source"] not in sources:
            raise ConfigError(f"{where}: source={a['source']!r}: not in sources {sorted(sources)}")
        try:
            served_precision(a, None)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        if a["model"] not in models:
            try:
                models[a["model"]] = get_preset(a["model"])
            except (ConfigError, KeyError, ValueError):
                raise ConfigError(f"{where}: model={a['model']!r}: not a preset nor in models:") from None
    return models, sources, anchors


def served_precision(a: dict, cfg: ModelConfig) -> str:
    """The precision label the deployment served: its dtype with its weights / kv formats
    (roofline.model.formats names; a float format equal in size to the dtype is the dtype itself)."""
    dtype = a.get("dtype") or "bfloat16"
    plain = lambda f: None if f in (None, "bf16", "fp16", "bfloat16", "float16") else f  # noqa: E731
    return precision(dtype, plain(a.get("weights")), plain(a.get("kv")), None,
                     cfg.native_weights if cfg is not None else "").label


def split_of(a: dict, sources: dict) -> str:
    return sources[a["source"]].get("split", "calibration")


def what_if(a: dict, cfg: ModelConfig, setting: Setting | None = None, models: dict | None = None) -> dict:
    """{optimistic, typical, pessimistic} of the anchor's metric, in its unit (models: the anchors
    file's own models, where a draft model may be named)."""
    lay = Layout(tp=a["tp"], ep=a.get("ep", 1), dp_attention=bool(a.get("dp_attention", False)))
    setting = setting or Setting(engine=a["engine"])
    w = WhatIf(cfg, get_datasheet(a["device"]), served_precision(a, cfg), lay, setting)
    wl, m = a["workload"], a["metric"]
    if m == "spec_speedup":
        spec = a.get("spec") or {}
        acc, k = spec.get("acceptance"), spec.get("k")
        if not isinstance(k, int) or not isinstance(acc, list):
            raise NotImplementedError(f"k={k!r}, acceptance={acc!r}: a speedup needs both stated")
        if spec.get("drafter") != "mtp":
            raise NotImplementedError(f"drafter={spec.get('drafter')!r}: only MTP drafts are priced per rank")
        alpha = (max(acc), float(np.mean(acc)), min(acc))
        return w.mtp_speedup(alpha, spec["k"], wl["B"], wl["L"])
    if "B" in wl:  # one decode step of B sequences at L cached tokens
        itl = w.itl(wl["B"], wl["L"])
        r = dict(itl_s=itl, tok_s_per_user={k: 1 / v for k, v in itl.items()})
        if m == "itl_ms":
            return {k: v * 1e3 for k, v in itl.items()}
        if m == "tok_s_per_user":
            return r["tok_s_per_user"]
        raise ConfigError(f"anchor {a['id']}: metric={m!r} needs a workload {{concurrency, input_len, output_len}}")
    s = serve(w, wl["input_len"], wl["output_len"], wl["concurrency"], wl.get("num_prompts"),
              spec=finite_spec(a, w, models or {}) if a.get("spec") else None)
    O = wl["output_len"]
    conv = {"itl_ms": lambda d: {k: v * 1e3 for k, v in d["itl_s"].items()},
            "ttft_ms": lambda d: {k: v * 1e3 for k, v in d["ttft_s"].items()},
            "e2e_latency_s": lambda d: d["e2e_s"],
            "tok_s_per_user": lambda d: {k: O / v for k, v in d["e2e_s"].items()},
            "output_tok_s": lambda d: d["output_tok_s"],
            "output_tok_s_per_gpu": lambda d: {k: v / a.get("n_devices", lay.devices)
                                               for k, v in d["output_tok_s"].items()}}
    return conv[m](s)


def finite_spec(a: dict, w: WhatIf, models: dict) -> SpecDecode:
    """The speculative decoding of a finite-run anchor: k, the acceptance (one rate, or one per
    position), the drafter (a draft model: a preset, in `draft_weights` or the target's format);
    NotImplementedError where the source does not state k or the acceptance."""
    spec = a["spec"]
    k, acc = spec.get("k"), spec.get("acceptance")
    if isinstance(acc, (int, float)) and not isinstance(acc, bool):
        acc = [acc]
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
    return SpecDecode(k, tuple(float(x) for x in acc), spec.get("drafter", "mtp"), draft)


def table(path=ANCHORS_PATH, engine_known: bool = True) -> pd.DataFrame:
    """One row per anchor: published, predicted (typical), interval, error, split, categories.
    engine_known=False predicts as a user who does not say which engine runs (span of profiles)."""
    models, sources, anchors = load(path)
    rows = []
    for a in anchors:
        cfg = models[a["model"]]
        base = dict(id=a["id"], split=split_of(a, sources), source=a["source"], engine=a["engine"],
                    device=a["device"], model=a["model"], tp=a["tp"], metric=a["metric"],
                    category=",".join(a.get("category") or []), published=float(a["value"]),
                    predicted_dtype=served_precision(a, cfg))
        try:
            p = what_if(a, cfg, None if engine_known else Setting(), models)
        except NotImplementedError as e:
            rows.append(dict(base, predicted=np.nan, low=np.nan, high=np.nan, error_pct=np.nan, inside=False,
                             note=f"not priced: {e}"))
            continue
        lo, hi = min(p.values()), max(p.values())
        rows.append(dict(base, predicted=p["typical"], low=lo, high=hi,
                         error_pct=100.0 * (p["typical"] / float(a["value"]) - 1.0),
                         inside=bool(lo <= float(a["value"]) <= hi),
                         half_width_pct=100.0 * (hi - lo) / 2 / p["typical"], note=""))
    return pd.DataFrame(rows)


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
    return "\n".join(s for p in paths if Path(p).exists() for s in walk(yaml.safe_load(Path(p).read_text())))


def test_sources_cited_by_priors(path=ANCHORS_PATH, prior_paths=()) -> list[str]:
    """Test-split sources whose url (or id) a prior's source cites: must be empty."""
    _, sources, _ = load(path)
    text = prior_sources(prior_paths)
    bad = []
    for sid, s in sources.items():
        if s.get("split") != "test":
            continue
        url = str(s.get("url", "")).split("#")[0].rstrip("/")  # the page itself (one repository holds many pages)
        if (url and url in text) or sid in text:
            bad.append(sid)
    return bad


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
