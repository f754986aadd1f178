"""batch and devices for a latency and throughput target

`python -m roofline.cli.capacity model=llama-3.1-8b device=h200_sxm` (datasheet what-if) or
`fit=<run>/fit.json memory_gb=64` (measured device parameters): capacity.csv, capacity.json and
the throughput-vs-latency picture; `layouts=true` plans devices and layouts (tp / ep /
dp-attention / pp) from the datasheet row + roofline/data/priors.yaml. The plans themselves are
roofline.analysis.capacity's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from roofline.analysis import costmodel, fitcheck, quality
from roofline.analysis.capacity import (PRICED_WHATIF, CapacityRequest, Speculation, Workload, check_inputs,
                                        device_memory_bytes, plan, plan_whatif, whatif_of)
from roofline.analysis.predict import DraftCost
from roofline.io import files
from roofline.commands import (CheckpointKeys, FormatKeys, GraphKeys, LayoutKeys, priced_weights, served_label,
                               target_model)
from roofline.io.fields import ConfigError, from_dict, option
from roofline.io.results import RUNS_ROOT
from roofline.measure.devices import detect, get_datasheet
from roofline.model.config import ModelConfig
from roofline.model.formats import precision_columns
from roofline.model.presets import get_preset
from roofline.model.speculation import HEAD_DRAFTERS
from roofline.parallel import whatif
from roofline.parallel.engines import engine_name, run_scheduling
from roofline.report import figures


# what the `device` entry (roofline/conf/device/) means to this command: the datasheet row priced
DEVICE_AS = "datasheet"


@dataclass(frozen=True)
class CapacityKeys:
    """The keys no library class holds as they are given: the device entry, the speculation's switch
    and drafter (they build CapacityRequest.speculation), the layouts plan and its price."""

    device: dict | None = option(None, "without fit: a datasheet row (roofline/conf/device/), a WHAT-IF flagged "
                                       "extrapolated")
    speculative: bool = option(False, "also plan with speculative decoding (off unless asked: alpha is yours "
                                      "to give)")
    drafter: str = option("ngram", "mtp (presets with MTP) | eagle | eagle3 (an EAGLE head; the what-if only) | ngram "
                                   "| draft_model")
    draft_model: str | None = option(None, "preset name of the draft model (drafter=draft_model)")
    layouts: bool = option(False, "true: which layout and how many devices (tp/ep/dp-attention/pp) from datasheet "
                                  "+ priors.yaml, in dtype + weights/kv/lm_head; speculation: drafter=mtp | eagle | "
                                  "eagle3")
    price_per_device_hour: float | None = option(None, "with layouts: USD per device-hour, for the cost per "
                                                       "million tokens")


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (CapacityRequest, FormatKeys, LayoutKeys, GraphKeys, Workload, Speculation, CapacityKeys, CheckpointKeys)


def plan_request(req: CapacityRequest) -> tuple[pd.DataFrame, dict, Path]:
    """capacity.csv, capacity.json and the throughput-vs-latency picture in one folder."""
    if req.fit:
        fit, extrapolated = costmodel.load_fit(req.fit), False
        quality.check_model(fit, req.model.name, req.allow_other_model)
        sheet = detect(fit["provenance"]["device_name"])
    else:
        table, summary = plan_whatif(req)
        return _write(req, table, summary)
    mem = device_memory_bytes(req.memory_gb, sheet)
    if not mem:
        raise ConfigError("memory_gb is required: the device has no datasheet memory size (a CPU)")
    table, summary = plan(fit, req.model, req.dtype, req.work, mem, req.B, req.speculation, extrapolated,
                          max_running=req.max_running_seqs or None)
    return _write(req, table, summary)


def _write(req: CapacityRequest, table: pd.DataFrame, summary: dict) -> tuple[pd.DataFrame, dict, Path]:
    out = Path(req.out_dir or RUNS_ROOT / "capacity") / f"{req.model.name}-{summary['device'].replace(' ', '_')}-{req.dtype}"
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "capacity.csv", index=False)
    files.write_json_atomic(out / "capacity.json", summary)
    plot(table, summary, out / "throughput_vs_latency.png")
    return table, summary, out


def plot(table: pd.DataFrame, summary: dict, path) -> None:
    fig, ax = figures.subplots(figsize=(6, 4.2))
    y = "tok_s_per_device"
    for spec, g in table.groupby("spec"):
        ok = g["fits_memory"]
        ax.plot(g["itl_ms"], g[y], "-o" if spec else "-s", label="speculative" if spec else "plain decode")
        ax.scatter(g.loc[~ok, "itl_ms"], g.loc[~ok, y], marker="x", color="r", zorder=3)
        for _, r in g.iterrows():
            ax.annotate(f"B={r['B']}", (r["itl_ms"], r[y]), fontsize=6)
    ax.axvline(summary["workload"]["itl_target_ms"], color="k", ls=":", lw=0.8, label="ITL target")
    flag = "\n(WHAT-IF, extrapolated)" if summary["extrapolated"] else ""
    tpot = summary.get("priced") == PRICED_WHATIF  # a sustained service's mean ITL, its prompts' steps in it
    ax.set(xscale="log", yscale="log", xlabel="mean inter-token latency, TPOT (ms)" if tpot else
           "inter-token latency, decode step (ms)", ylabel="tokens/s per device",
           title=f"{summary['model']} on {summary['device']}{flag}")
    ax.legend(fontsize=8, title="x: does not fit in memory", title_fontsize=7)
    fig.tight_layout()
    path = Path(path)
    figures.save(fig, path.parent, path.stem, dpi=110)


WORKLOAD_KEYS = ("context", "output", "itl_target_ms", "target_tok_s", "ttft_target_ms")  # Workload's, in order


def workload_of(c: dict) -> Workload:
    """The workload of a capacity config dict, for both plans (ttft_target_ms optional: a config dict built without
    the key has no TTFT target)."""
    return Workload(*(c[f] for f in WORKLOAD_KEYS[:-1]), c.get("ttft_target_ms"))


def request_from_config(c: dict, model: ModelConfig | None = None) -> CapacityRequest:
    """The one-device plan of roofline/conf/capacity.yaml from its plain config dict (its `layouts` and
    `overrides` keys already taken off): the precision overrides applied to `dtype`
    (weights=native: the preset's released format), the workload and the speculation. `model`: the priced
    model when already resolved (target_model: checkpoint= or the preset)."""

    fitcheck.check_capacity_config(c)
    c = dict(c)
    model = model or target_model(c)
    c.pop("checkpoint", None)
    c.pop("price_per_device_hour", None)
    c["engine"] = engine_name(c.get("engine"))
    work = workload_of(c)
    for f in WORKLOAD_KEYS:
        c.pop(f, None)
    alpha, k, drafter, draft = (c.pop(f) for f in ("alpha", "k", "drafter", "draft_model"))
    spec = Speculation(alpha, k, DraftCost(drafter, get_preset(draft) if draft else None)) \
        if c.pop("speculative") else None
    c["dtype"] = served_label(c["dtype"], c, model, priced_weights(c), pop=True)
    return from_dict(CapacityRequest, c, "capacity", lists_to_tuples=True, model=model, work=work, speculation=spec)


LAYOUT_SPEC_DRAFTERS = HEAD_DRAFTERS  # drafters the layouts' what-if prices on every rank: the
# preset's own MTP module, an EAGLE head over the target


def plan_layouts(c: dict, model: ModelConfig | None = None) -> tuple[pd.DataFrame, dict]:
    """`layouts=true` of roofline/conf/capacity.yaml from its plain config dict: for every layout that fits
    the device, the largest batch meeting the ITL target, tokens/s per replica and the devices
    for the target throughput, each with its interval (optimistic / typical / pessimistic
    priors), in the precision `dtype` + `weights` / `kv` / `lm_head` give (weights=native: the
    preset's released format). Speculation: the preset's MTP module (drafter=mtp) or an EAGLE head (eagle | eagle3)
    chained k times; other drafters are not priced per rank and say so in the summary."""

    fitcheck.check_capacity_config(c)
    given = [f"{k}={c[k]!r}" for k, default in (("tp", 1), ("ep", 1), ("dp_attention", False))
             if c.get(k, default) != default] + ([f"fit={c['fit']!r}"] if c.get("fit") else [])
    if given:  # the layouts plan would ignore them: it plans every layout from the datasheet and the priors
        raise ConfigError(f"{', '.join(given)}: layouts=true plans every layout (tp, ep, dp_attention, pp) from the "
                          "datasheet and the priors; drop it, or drop layouts=true to plan that one")
    model = model or target_model(c)
    label = served_label(c["dtype"], c, model, priced_weights(c))
    work = workload_of(c)
    spec = bool(c.get("speculative"))
    drafter = c.get("drafter")
    head_spec = spec and drafter in LAYOUT_SPEC_DRAFTERS and (drafter != "mtp" or model.mtp_layers > 0)
    if head_spec:
        check_inputs(1.0, [1], spec=Speculation(c["alpha"], c["k"]))
    device = get_datasheet(c["device"])
    mem = device_memory_bytes(c.get("memory_gb"), device)
    w = whatif_of(c, model, label)
    own_cap = run_scheduling({"max_running_seqs": c.get("max_running_seqs")}, "").get("max_running")
    rows = pd.DataFrame(whatif.capacity(model, device, label, work.context, work.output, work.itl_target_ms,
                                        work.target_tok_s, c.get("price_per_device_hour"),
                                        c["alpha"] if head_spec else None, c["k"], w.setting,
                                        batches=tuple(c.get("B") or (1, 2, 4, 8, 16, 32, 64, 128, 256)),
                                        scale=w.scale, calibration=w.calibration, mem_bytes=mem,
                                        drafter=drafter if head_spec else "mtp",
                                        max_running=own_cap, ttft_target_ms=work.ttft_target_ms))
    note = None
    if spec and not head_spec:
        note = (f"speculation with drafter={c.get('drafter')!r} is not priced per rank (allowed with layouts: "
                f"{LAYOUT_SPEC_DRAFTERS}, mtp on a preset with an MTP module); plain decode only")
    summary = dict(model=model.name, dtype=label, **precision_columns(label), device=device.name,
                   memory_GB=(mem or 0) / 1e9, workload=work.__dict__,
                   speculation=dict(alpha=c["alpha"], k=c["k"], drafter=drafter) if head_spec else None,
                   engine=w.setting.engine or "all profiles (span)", calibration_scale=w.scale, priced=PRICED_WHATIF,
                   what_if="datasheet row + kernels.yaml + engines.yaml + priors.yaml (roofline.parallel.whatif)",
                   layouts=len(rows), note=note)
    return rows, summary


def run(c: dict) -> None:
    c = dict(c)
    model = target_model(c)
    c.pop("overrides")
    if c.pop("layouts"):  # how many devices, which layout: an interval from the priors
        rows, summary = plan_layouts(c, model)
        with pd.option_context("display.width", 250, "display.max_columns", 40):
            print(rows.round(3).to_string(index=False) if not rows.empty else "no layout meets the ITL target")
        print(files.json_text(summary, default=str))
        return
    table, summary, _ = plan_request(request_from_config(c, model))
    print(table.round(3).to_string(index=False))
    print(files.json_text(summary, default=str))
