"""speculative-decoding speedups from a fit, or from a datasheet what-if without one

`python -m roofline.cli.predict fit=<run>/fit.json model=deepseek-v3`: predict.csv and the figures
(S vs alpha, the k* map, the break-even batch) beside the fit, the k* rows on the console. Without
a fit but with a device (`model=deepseek-v3 device=h200_sxm tp=8`): the what-if from the datasheet
row and roofline/data/priors.yaml, each number an interval. The step costs and the table are
roofline.analysis.predict's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from roofline.analysis import costmodel, fitcheck, quality
from roofline.analysis.calibrate import POINTS_FILE
from roofline.analysis.capacity import whatif_of
from roofline.analysis.predict import Costs, DraftCost, breakeven_batch, step_costs, table
from roofline.io import files
from roofline.commands import (CheckpointKeys, FormatKeys, GraphKeys, LayoutKeys, priced_weights, served_label,
                               target_model)
from roofline.io.fields import ConfigError, from_dict, option
from roofline.model.config import ModelConfig
from roofline.model.presets import get_preset
from roofline.parallel import whatif
from roofline.report import figures
from roofline.model import speculation
from roofline.spec.vllm_metrics import parse_spec_decode


# what the `device` entry (roofline/conf/device/) means to this command: the datasheet row priced
DEVICE_AS = "datasheet"


@dataclass(frozen=True)
class WhatIfKeys:
    """Without a fit: the device, engine and calibration of the what-if (roofline.parallel.whatif)."""

    device: str | None = option(None, "without fit: a datasheet row (roofline/conf/device/) -> the what-if model")
    engine: str | None = option(None, "what-if: an engine profile (roofline/conf/engine/); null: the interval "
                                      "spans them")
    calibrate: str | None = option(None, f"what-if: {POINTS_FILE} of this model "
                                         "(roofline.analysis.calibrate)")


@dataclass(frozen=True)
class PredictRequest:
    """One prediction run: a fit, a target, a drafter and the grid."""

    fit: str = option(help="path to a fit.json (python -m roofline.cli.fit results_dir=...)")
    model: ModelConfig | None = option(None, "target preset (roofline/conf/model/); null: the fitted one. "
                                             "Another = device-fit transfer")
    dtype: str = option("bfloat16", "float32 | bfloat16 | float16: activations (and every class not overridden)")
    mode: str | None = option(None, "eager | graph | compiled; null: the fitted mode")
    drafter: str = option("mtp", "mtp | draft_model | ngram; the what-if (device= without fit=) also eagle | eagle3 "
                                 "(an EAGLE-1/2 or EAGLE-3 head; EAGLE-3's draft vocabulary 32000)")
    draft_model: ModelConfig | None = option(None, "preset name of the draft model (drafter=draft_model)")
    draft_fit: str | None = option(None, "its own fit.json (default: the target's device fit, transferred)")
    alphas: tuple[float, ...] = option((0.6, 0.7, 0.8, 0.9), "i.i.d. acceptance rates")
    vllm_metrics: str | None = option(None, "a vLLM /metrics dump: adds its per-position acceptance profile")
    k: tuple[int, ...] = option(tuple(range(9)), "draft lengths")
    B: tuple[int, ...] = option((1, 2, 4, 8, 16, 32, 64), "batch sizes")
    L: tuple[int, ...] = option((128, 1024, 3072), "contexts (L + k + 1 must fit the model's max_context)")
    plot_B: int = option(1, "batch of the S-vs-alpha picture")
    plot_L: int = option(1024, "context of the S-vs-alpha picture")
    overhead_share: float = option(1.0, "O(k, B) = share x fitted t0, unless `overhead` is given")
    overhead: str | None = option(None, "overhead.json of a specdec run (python -m roofline.cli.specdec): "
                                        "measured O(k, B)")
    out_dir: str | None = option(None, "default: <fit's folder>/predict-<model>-<drafter>")
    allow_other_model: bool = option(False, "true: apply a fit of one model to another (a device-fit transfer, "
                                            "marked extrapolated)")

    def __post_init__(self) -> None:
        if self.fit in (None, ""):
            raise ConfigError("fit is required: a fit.json written by roofline.cli.fit")
        fitcheck.check_predict_grid(self.alphas, self.k, self.B, self.L, self.plot_B, self.plot_L, self.vllm_metrics)


def predict(req: PredictRequest) -> tuple[pd.DataFrame, dict]:
    """predict.csv and the figures in the output folder; returns (the k* rows, a summary)."""
    fit = costmodel.load_fit(req.fit)
    target = req.model or costmodel.fitted_model(fit)
    quality.check_model(fit, target.name, req.allow_other_model)
    drafter = DraftCost(req.drafter, req.draft_model, costmodel.load_fit(req.draft_fit) if req.draft_fit else None)
    alphas = {float(a): float(a) for a in req.alphas}
    if req.vllm_metrics:
        try:
            alphas.update(alphas_from_vllm(Path(req.vllm_metrics).read_text()))
        except ConfigError as e:  # the parser's message names the line and the counter, this the file
            raise ConfigError(f"vllm_metrics={req.vllm_metrics!r}: {e}") from None
    overhead = files.read_json(req.overhead, f"overhead={req.overhead!r}", "overhead.json") if req.overhead else None
    if overhead is not None:
        fitcheck.check_overhead(overhead, f"overhead={req.overhead!r}")
    fitcheck.check_context(req.plot_L, max(8, *req.k), target.max_context, target.name)  # before out_dir is written
    out = Path(req.out_dir or Path(req.fit).parent / f"predict-{target.name}-{req.drafter}")
    out.mkdir(parents=True, exist_ok=True)
    t = table(fit, alphas, req.k, req.B, req.L, req.dtype, drafter, target, req.mode, req.overhead_share, overhead)
    t, warnings = fitcheck.speedup_problems(t)
    warnings = fitcheck.unconverged(fit) + quality.noise_warnings(fit) + warnings
    t.to_csv(out / "predict.csv", index=False)
    costs = step_costs(fit, req.dtype, drafter, target, req.mode, req.overhead_share, overhead)
    plot_all(costs, req.B, req.L, req.plot_B, req.plot_L, out / "figures",
             f"{target.name} ({costs.source}, {fit['provenance']['device_name']})")
    best = t[t["k"] == t["k_star"]][["alpha", "B", "L", "k_star", "S", "throughput_tok_s", "extrapolated",
                                    "extrapolation"]]
    return best, dict(csv=str(out / "predict.csv"), rows=len(t), source=costs.source,
                      overhead_source=costs.overhead_source, warnings=warnings)


FIT_ONLY_KEYS = ("draft_fit", "vllm_metrics", "plot_B", "plot_L", "overhead_share", "overhead", "allow_other_model")


def check_whatif_keys(c: Mapping) -> None:
    """The keys a fit's prediction reads and the what-if does not (a drafter's own fit, a measured acceptance
    profile or round overhead, the figures' point; the what-if prices the round overhead from priors.yaml and
    draws no figure): given with a what-if they would be ignored, so they are refused, each by name."""
    fields = PredictRequest.__dataclass_fields__
    given = [k for k in FIT_ONLY_KEYS if k in c and c[k] != fields[k].default]
    if given:
        raise ConfigError(f"{', '.join(f'{k}={c[k]!r}' for k in given)}: read only with fit= (a GPU sweep's fit); "
                          "the what-if (device= without fit) does not use it: drop it")
    if c.get("mode") not in (None, "eager", "graph", "compiled"):
        raise ConfigError(f"mode={c['mode']!r}: allowed eager | graph | compiled (the what-if: eager = no CUDA "
                          "graphs, graph or compiled = CUDA graphs) or null (the engine's own)")


def predict_command(c: Mapping) -> tuple[str, dict]:
    """The predict command: roofline/conf/predict.yaml as a plain dict (`device`: a datasheet row or None)
    -> (console table, JSON summary). Without a fit but with a device: the what-if from the
    datasheet row and roofline/data/priors.yaml (the drafter's speedup: mtp, draft_model or ngram; each number an
    interval of three scenarios; mode: eager prices no CUDA graphs, graph or compiled with them; out_dir: the
    table and summary as files too)."""
    model = target_model(c)
    c = {k: v for k, v in c.items() if k not in ("overrides", "model", "checkpoint")}
    device = c.pop("device")
    what = dict(device=device, tp=c.pop("tp"), ep=c.pop("ep"), dp_attention=c.pop("dp_attention"),
                engine=c.pop("engine", None), calibrate=c.pop("calibrate", None),
                graph_batch_sizes=c.pop("graph_batch_sizes", None))
    if c.get("fit") in (None, "") and device:
        if model is None:
            raise ConfigError("model (a preset) or checkpoint (a Hugging Face model folder) is required for a what-if "
                              "(device=... without fit=...)")
        c = {**{k: f.default for k, f in PredictRequest.__dataclass_fields__.items() if f.default is not MISSING}, **c}
        check_whatif_keys(c)
        fitcheck.check_drafter(c["drafter"], c.get("draft_model"))
        fitcheck.check_predict_grid(c["alphas"], c["k"], c["B"], c["L"], c["plot_B"], c["plot_L"], None)
        label = served_label(c["dtype"], c, model, priced_weights(c))
        what["graphs"] = None if c.get("mode") is None else c["mode"] != "eager"
        w = whatif_of(what, model, label)
        drafter = c["drafter"]
        draft = get_preset(c["draft_model"]) if c.get("draft_model") else None
        mtp_missing = drafter == "mtp" and not model.mtp_layers
        ks = ([k for k in c["k"] if k == 0] or [0]) if mtp_missing else list(c["k"])
        rows = whatif.speedup_table(model, w.device, label, w.layout, c["alphas"], ks, c["B"], c["L"], w.setting,
                                    w.scale, w.calibration, drafter, draft)
        notes = [f"model {model.name!r} has no MTP module: plain decode (k = 0) only (drafter=ngram or "
                 "draft_model prices k > 0)"] if mtp_missing else []
        # the card's and capacity's memory rule (the engine's KV pool), at the grid's smallest point
        mem = whatif.memory_check(model, w.device, label, w.layout, min(c["B"]), min(c["L"]) + max(ks) + 1,
                                  with_mtp=bool(drafter == "mtp" and model.mtp_layers and max(ks)),
                                  draft=draft if max(ks) else None, setting=w.setting,
                                  eagle=drafter if drafter in whatif.EAGLE_HEADS and max(ks) else "")
        unfit = None if mem["fits"] else whatif.unfit_note(w.layout.label(), mem,
                                                            f" even at B = {min(c['B'])}, L = {min(c['L'])}")
        notes += [unfit] if unfit else []
        summary = dict(source="what-if", device=device, dtype=label, layout=w.layout.label(), drafter=drafter,
                       draft_model=draft.name if draft else None, cuda_graphs=w.setting.graphs,
                       engine=w.setting.engine or "all profiles (span)", calibration_scale=w.scale, rows=len(rows),
                       note="; ".join(notes) or None)
        if c.get("out_dir"):  # given: the table and this summary as files too (the what-if draws no figure)
            out = Path(c["out_dir"])
            out.mkdir(parents=True, exist_ok=True)
            files.write_csv_atomic(pd.DataFrame(rows), out / "predict.csv")
            files.write_json_atomic(out / "predict.json", summary)
            summary["out_dir"] = str(out)
        return pd.DataFrame(rows).round(3).to_string(index=False) + (f"\nwarning: {unfit}" if unfit else ""), summary
    fitcheck.check_drafter(c.get("drafter"), c.get("draft_model"))
    speculation.refuse_eagle_without_whatif(c.get("drafter"))
    draft = get_preset(c.pop("draft_model")) if c.get("draft_model") else None
    c["dtype"] = served_label(c["dtype"], c, model, c.get("weights"), pop=True)  # weights=native needs the target: model=
    best, summary = predict(from_dict(PredictRequest, c, "predict", lists_to_tuples=True, model=model, draft_model=draft))
    return "\n".join([best.round(3).to_string(index=False)] + [f"warning: {w}" for w in summary["warnings"]]), summary


def alphas_from_vllm(text: str, model_name: str | None = None) -> dict:
    """{label: per-position conditional acceptance} from a vLLM /metrics dump."""
    profile = parse_spec_decode(text, model_name).per_position_alpha()
    if not all(np.isfinite(profile)):
        raise ConfigError(f"vllm_metrics: per-position acceptance has positions nothing reached: {profile}")
    return {"vllm(" + ", ".join(f"{a:.3f}" for a in profile) + ")": list(profile)}


# ---- pictures -------------------------------------------------------------------------------

def plot_all(costs: Costs, Bs, Ls, B: int, L: int, out_dir: Path, title: str, k_max: int = 8) -> list[Path]:
    """S vs alpha (k = 1..k_max) at (B, L); k* map over (B, L) at alpha 0.8; break-even batch vs alpha."""
    grid = np.linspace(0.05, 0.99, 48)
    paths = []
    fig, ax = figures.subplots(figsize=(6, 4.2))
    for k in range(1, k_max + 1):
        ax.plot(grid, [speculation.speedup(float(a), k, B, L, costs.steps) for a in grid], label=f"k={k}")
    ax.axhline(1.0, color="k", lw=0.7)
    ax.set(xlabel="acceptance alpha (i.i.d.)", ylabel="speedup S = tau T(1) / R", title=f"{title}: B={B}, L={L}")
    ax.legend(fontsize=7, ncol=2)
    paths += _save(fig, out_dir, "speedup_vs_alpha")
    kstar = np.array([[speculation.best_k(0.8, b, l, costs.steps, k_max)[0] for b in Bs] for l in Ls])
    fig, ax = figures.subplots(figsize=(6, 4.2))
    im = ax.imshow(kstar, origin="lower", aspect="auto", cmap="viridis", vmin=0, vmax=k_max)
    ax.set(xticks=range(len(Bs)), xticklabels=Bs, yticks=range(len(Ls)), yticklabels=Ls, xlabel="batch B",
           ylabel="context L", title=f"{title}: k* at alpha=0.8 (0 = do not speculate)")
    for (i, j), v in np.ndenumerate(kstar):
        ax.text(j, i, str(v), ha="center", va="center", color="w", fontsize=8)
    fig.colorbar(im, ax=ax, label="k*")
    paths += _save(fig, out_dir, "kstar_map")
    fig, ax = figures.subplots(figsize=(6, 4.2))
    styles = ["-", "--", ":", "-."]
    for i, l in enumerate(Ls):  # lines that coincide (at the grid edge) stay visible: widths and dashes differ
        ax.plot(grid, [breakeven_batch(float(a), l, Bs, costs.steps, k_max) for a in grid], label=f"L={l}",
                ls=styles[i % len(styles)], lw=max(0.8, 3.0 - 0.7 * i), marker="os^vD"[i % 5], ms=3, markevery=6 + i)
    ax.axhline(max(Bs), color="0.5", lw=0.6, ls=":")
    ax.annotate(f"grid edge B={max(Bs)}: speculation still wins there", (0.02, max(Bs)), xycoords=("axes fraction", "data"),
                fontsize=7, va="bottom", color="0.4")
    ax.set(xlabel="acceptance alpha", ylabel="largest batch with S* > 1", yscale="log",
           title=f"{title}: batch above which speculation loses")
    ax.legend(fontsize=8)
    paths += _save(fig, out_dir, "breakeven_batch")
    return paths


def _save(fig, out_dir: Path, stem: str) -> list[Path]:
    fig.tight_layout()
    return figures.save(fig, out_dir, stem, dpi=110)


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (PredictRequest, FormatKeys, LayoutKeys, GraphKeys, WhatIfKeys, CheckpointKeys)


def run(c: dict) -> None:
    text, summary = predict_command(c)
    print(text)
    print(files.json_text(summary))
