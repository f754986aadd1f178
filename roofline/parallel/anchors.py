"""Published multi-GPU measurements (roofline/data/anchors.yaml) beside our what-if predictions.

Nothing here is fitted to the anchors: each prediction is roofline.parallel.whatif from the
device's datasheet row and the sourced priors, as an interval (every prior optimistic, typical,
pessimistic; the interval is the smallest and largest of the three), the error that of the
typical value.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from roofline.measure.devices import get_spec
from roofline.io.fields import ConfigError
from roofline.model.config import ModelConfig
from roofline.model.formats import precision
from roofline.model.presets import get_preset
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import SCENARIOS, Setting, WhatIf

ANCHORS_PATH = Path(__file__).resolve().parents[1] / "data" / "anchors.yaml"
METRICS = ("tok_s_per_user", "spec_speedup")


def load(path=ANCHORS_PATH) -> tuple[dict[str, ModelConfig], list[dict]]:
    doc = yaml.safe_load(Path(path).read_text())
    models = {name: get_preset(m["preset"]).scaled(**(m.get("overrides") or {})) for name, m in doc["models"].items()}
    for a in doc["anchors"]:
        if a["metric"] not in METRICS:
            raise ConfigError(f"anchor {a['id']}: metric={a['metric']!r}: allowed {METRICS}")
        if a["model"] not in models:
            raise ConfigError(f"anchor {a['id']}: model={a['model']!r}: allowed {sorted(models)}")
    return models, doc["anchors"]


def served_precision(a: dict, cfg: ModelConfig) -> str:
    """The precision label the anchor's deployment served: its dtype under its weights / kv
    overrides (weights: native = the preset's released format)."""
    return precision(a["dtype"], a.get("weights"), a.get("kv"), a.get("lm_head"), cfg.native_weights).label


def what_if(a: dict, cfg: ModelConfig, B: int | None = None) -> dict:
    """{optimistic, typical, pessimistic} of the anchor's metric (B overrides the anchor's batch)."""
    lay = Layout(tp=a["tp"], ep=a.get("ep", 1), dp_attention=a.get("dp_attention", False))
    w = WhatIf(cfg, get_spec(a["device"]), served_precision(a, cfg), lay, Setting(graphs=a.get("graphs", True)))
    B = B or a["B"]
    if a["metric"] == "tok_s_per_user":
        return {k: 1.0 / v for k, v in w.itl(B, a["L"]).items()}
    alphas = a["spec"]["alpha"]
    alpha = (alphas[0], float(np.mean(alphas)), alphas[-1])
    return w.mtp_speedup(alpha, a["spec"]["k"], B, a["L"])


def table(path=ANCHORS_PATH) -> pd.DataFrame:
    models, anchors = load(path)
    rows = []
    for a in anchors:
        p = what_if(a, models[a["model"]])
        lo, hi = min(p.values()), max(p.values())
        rows.append(dict(id=a["id"], model=a["model"], device=a["device"], tp=a["tp"], B=a["B"], metric=a["metric"],
                         published=a["value"], predicted=p["typical"], low=lo, high=hi,
                         error_pct=100.0 * (p["typical"] / a["value"] - 1.0), inside=lo <= a["value"] <= hi,
                         published_dtype=a["published_dtype"],
                         predicted_dtype=served_precision(a, models[a["model"]]), source=a["source"]))
    return pd.DataFrame(rows)


def trend(anchor_id: str, Bs=(1, 2, 4, 8, 16, 32, 64), path=ANCHORS_PATH) -> pd.DataFrame:
    """The anchor's metric predicted over batch sizes (e.g. the MTP speedup vs batch)."""
    models, anchors = load(path)
    hits = [a for a in anchors if a["id"] == anchor_id]
    if not hits:
        raise ConfigError(f"anchor={anchor_id!r}: allowed {[a['id'] for a in anchors]}")
    a = hits[0]
    return pd.DataFrame([dict(B=B, **{s: what_if(a, models[a["model"]], B)[s] for s in SCENARIOS}) for B in Bs])
