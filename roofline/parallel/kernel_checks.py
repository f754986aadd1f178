"""Held-out kernel benchmarks (roofline/data/kernel_checks.yaml) beside the what-if's kernel prices.

The deployments' test split checks the whole what-if; these check its kernel curves alone, on published
kernel times that no prior of kernels.yaml was derived from (`cited_by_priors` is empty). Each check is
priced by the what-if's own path, at M tokens (optimistic, typical and pessimistic priors); nothing is fitted
to them. Two kinds:

- `moe`: a one-layer model of the benchmark's shape (its hidden width K, the shard's intermediate width N, the
  experts and top-k), the rank's share of the experts under expert parallelism (its expected share, as a
  one-rank benchmark runs it), the routed experts' term of `WhatIf.pass_detail` for the engine whose MoE kernel
  the benchmark ran;
- `gemm`: one GEMM of M rows by an [N, K] weight matrix in the check's weight format (`whatif.one_gemm_seconds`,
  the pricing of each GEMM of a pass), a published TFLOP/s read as time by 2 M N K.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from roofline.io.fields import ConfigError
from roofline.io.yamltext import load_yaml
from roofline.measure.devices import get_datasheet
from roofline.model.config import ModelConfig
from roofline.model.formats import precision
from roofline.model.presets import get_preset
from roofline.parallel.anchors import PRIOR_PATHS, cited_by, prior_sources
from roofline.parallel.kernels import load_kernels
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import SCENARIOS, Pass, Setting, WhatIf, one_gemm_seconds

CHECKS_PATH = Path(__file__).resolve().parents[1] / "data" / "kernel_checks.yaml"
REQUIRED = ("id", "source", "kind", "device", "shape", "config", "timed", "rows", "quote")
KINDS = {"moe": (("engine", "experts"), ("experts", "local_experts", "N", "K", "top_k")),  # its own keys, its shape
         "gemm": (("weights",), ("N", "K"))}
UNITS = ("us", "TFLOP/s")


def load(path=CHECKS_PATH) -> tuple[dict, list[dict]]:
    """(sources, checks) of a kernel-checks file; a missing or malformed field is one ConfigError naming it."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"kernel_checks={str(path)!r}: no such file")
    doc = load_yaml(p.read_text()) or {}
    sources, checks = doc.get("sources") or {}, doc.get("checks") or []
    if not isinstance(sources, dict) or not isinstance(checks, list) or not checks:
        raise ConfigError(f"kernel_checks={str(path)!r}: needs a mapping `sources` and a non-empty list `checks`")
    for i, c in enumerate(checks):
        where = f"kernel_checks {c.get('id', i) if isinstance(c, dict) else i}"
        if not isinstance(c, dict):
            raise ConfigError(f"{where}: a check is a mapping")
        for k in REQUIRED:
            if k not in c:
                raise ConfigError(f"{where}: missing {k!r}")
        if c["source"] not in sources:
            raise ConfigError(f"{where}: source={c['source']!r} is not in `sources`")
        if c["kind"] not in KINDS:
            raise ConfigError(f"{where}: kind={c['kind']!r}: allowed {sorted(KINDS)}")
        own, shape_keys = KINDS[c["kind"]]
        for k in own:
            if k not in c:
                raise ConfigError(f"{where}: missing {k!r} (a {c['kind']} check)")
        if c.get("unit", "us") not in UNITS or (c["kind"] == "moe" and c.get("unit", "us") != "us"):
            raise ConfigError(f"{where}: unit={c.get('unit')!r}: allowed {UNITS} (a moe check: us)")
        s = c["shape"]
        for k in shape_keys:
            v = s.get(k) if isinstance(s, dict) else None
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{where}: shape.{k}={v!r}: allowed an integer >= 1")
        if c["kind"] == "moe" and (s["experts"] % s["local_experts"] or (s["top_k"] * s["local_experts"]) % s["experts"]):
            raise ConfigError(f"{where}: shape: local_experts must divide experts, and top_k x local_experts / "
                              "experts (the picks a token makes among the local experts, on average) be an integer")
        for r in c["rows"]:
            if (not isinstance(r, list) or len(r) != 2 or isinstance(r[0], bool) or not isinstance(r[0], int)
                    or r[0] < 1 or not isinstance(r[1], (int, float)) or r[1] <= 0):
                raise ConfigError(f"{where}: rows entry {r!r}: allowed [tokens >= 1, a time or rate > 0]")
    return sources, checks


def layer_model(c: dict) -> ModelConfig:
    """One MoE layer of the rank's experts (the rest of a small preset: no dense layers, no shared expert). A
    benchmark that simulates one rank of E / local_experts gives it a uniform share of the routing: its local
    experts, each token picking top_k x local / E of them, the same expected pairs and touched experts as the
    whole layer's E and top_k (1 - (1 - top_k / E)^M of each); the what-if's busiest rank of a deployment
    (`experts_touched_busiest_rank`) is not what such a benchmark times."""
    s = c["shape"]
    local, k = s["local_experts"], s["top_k"] * s["local_experts"] // s["experts"]
    return dataclasses.replace(get_preset("qwen3-30b-a3b"), name=f"kernel-check:{c['id']}", d=s["K"], moe_ffn=s["N"],
                               experts=local, experts_per_token=k, layers=1, shared_experts=0,
                               first_dense_layers=0, moe_every=1, mtp_layers=0)


def pricer(c: dict):
    """The check's kernel as the what-if prices it, set up once for its rows: M tokens -> {scenario: us}, a moe
    layer's routed experts or one GEMM."""
    dev = get_datasheet(c["device"])
    if c["kind"] == "gemm":
        label, kern = precision("bfloat16", weights=c["weights"]).label, load_kernels()
        return lambda M: {name: 1e6 * one_gemm_seconds(dev, label, M, c["shape"]["N"], c["shape"]["K"], i, kern)
                          for i, name in enumerate(SCENARIOS)}
    w = WhatIf(layer_model(c), dev, precision("bfloat16", experts=c["experts"]).label, Layout(),
               Setting(engine=c["engine"]))
    return lambda M: {name: 1e6 * w.pass_detail(Pass(M, 1, 1), i, c["engine"])["terms"]["experts"]
                      for i, name in enumerate(SCENARIOS)}


def price(c: dict, M: int) -> dict:
    """The check's kernel at M tokens (us), per scenario (`pricer`)."""
    return pricer(c)(M)


def published_us(c: dict, M: int, value: float) -> float:
    """A row's published value as microseconds (a GEMM's TFLOP/s as 2 M N K over it)."""
    if c.get("unit", "us") == "us":
        return float(value)
    return 2.0 * M * c["shape"]["N"] * c["shape"]["K"] / (value * 1e12) * 1e6


def table(path=CHECKS_PATH) -> pd.DataFrame:
    """Every row of every check: published and predicted microseconds, the interval, the error of the typical
    (predicted / published - 1: negative is too fast) and whether the published time is inside."""
    _, checks = load(path)
    out = []
    for c in checks:
        at = pricer(c)
        for M, value in c["rows"]:
            us, p = published_us(c, M, value), at(M)
            lo, hi = sorted((p["optimistic"], p["pessimistic"]))
            out.append(dict(id=c["id"], source=c["source"], kind=c["kind"], engine=c.get("engine", ""),
                            device=c["device"], format=c.get("experts") or c.get("weights"), config=c["config"], M=M,
                            published_us=us, predicted_us=p["typical"], low_us=lo, high_us=hi,
                            error_pct=100.0 * (p["typical"] / us - 1.0), inside=bool(lo <= us <= hi)))
    return pd.DataFrame(out)


def summary(t: pd.DataFrame) -> dict:
    """Median |error|, signed median (negative: too fast) and share inside, over all rows and per check."""
    def one(x):
        return dict(n=int(len(x)), median_abs_error_pct=float(np.median(np.abs(x["error_pct"]))),
                    signed_median_pct=float(np.median(x["error_pct"])), inside=float(x["inside"].mean()))
    return dict(all=one(t), **{cid: one(g) for cid, g in t.groupby("id", sort=False)})


def markdown(t: pd.DataFrame) -> str:
    """The summary and the rows, as the docs quote them."""
    s = summary(t)
    lines = ["| check | n | median abs error | signed median (negative: too fast) | inside interval |",
             "|---|---|---|---|---|"]
    for k, v in s.items():
        lines.append(f"| {k} | {v['n']} | {v['median_abs_error_pct']:.1f}% | {v['signed_median_pct']:+.1f}% | "
                     f"{100 * v['inside']:.0f}% |")
    lines += ["", "| check | M | published us | predicted us | interval us | error | inside |",
              "|---|---|---|---|---|---|---|"]
    for r in t.itertuples():
        lines.append(f"| {r.id} | {r.M} | {r.published_us:.1f} | {r.predicted_us:.1f} | {r.low_us:.1f}-{r.high_us:.1f} | "
                     f"{r.error_pct:+.1f}% | {'yes' if r.inside else 'no'} |")
    return "\n".join(lines) + "\n"


def cited_by_priors(path=CHECKS_PATH, prior_paths=PRIOR_PATHS) -> list[str]:
    """Check sources whose url (or id) a prior's source cites: must be empty (a held-out check)."""
    sources, _ = load(path)
    text = prior_sources(prior_paths)
    return [sid for sid, s in sources.items() if cited_by(sid, s, text)]
