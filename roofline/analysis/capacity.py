"""Capacity planning: tokens/s and inter-token latency per device vs batch, the largest batch that
meets an ITL target and fits in memory, and the devices needed for an aggregate tokens/s.

Two sources of step times. A fitted cost model (`plan`, a fit.json: t0, BW_eff, F_eff, knee applied to the
preset's accounting) prices decode alone: a step at mid-generation context L = context + output/2, tokens/s
B / ITL (the fit has no prompt term). The what-if (`plan_whatif`, flagged `extrapolated=true`: a datasheet row +
roofline/data/kernels.yaml, engines.yaml and priors.yaml, roofline.parallel.whatif) prices a sustained service at
B running sequences (`whatif.sustained`): the requests' prompts prefilled in the running steps, so the mean
inter-token latency (TPOT, `itl_ms`) and the tokens/s carry the prefill's share of the replica's time, the ITL
median and TTFT beside them. Memory per device = all weights (the MTP module too when it drafts) + KV cache of
every sequence at context + output. `plan` is one device per replica (a model whose weights do not fit is
reported as such); `plan_layouts` (roofline.commands.capacity) plans devices and layouts (tp / ep / dp-attention /
pp) per rank from the same what-if, in the served precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from roofline.analysis import fitcheck, quality
from roofline.analysis.calibrate import POINTS_FILE, calibrated

from roofline.model import speculation
from roofline.model.formats import parse_precision, precision_columns
from roofline.io.fields import ConfigError, internal, option
from roofline.model.config import ModelConfig
from roofline.analysis.predict import DraftCost, step_costs
from roofline.measure import memory
from roofline.measure.devices import Datasheet, get_datasheet


# what a plan's ITL and tokens/s hold, by the source of its step times (the summaries' `priced`)
PRICED_FIT = "decode steps at context + output/2 (a fit has no prompt term): ITL the step, tokens/s B / ITL"
PRICED_WHATIF = ("a sustained service at B running sequences (whatif.sustained): itl_ms the mean inter-token latency "
                 "(TPOT) with the steps that carry the prompts' chunks, tokens/s with the prefill's share of the time")


@dataclass(frozen=True)
class Workload:
    context: int = option(1024, "prompt tokens per sequence (the what-if prefills them in the running steps; a fit: "
                                "already cached)")
    output: int = option(256, "generated tokens per sequence")
    itl_target_ms: float = option(50.0, "mean inter-token latency target (ms; TPOT: the what-if's includes the steps "
                                        "that carry the prompts)")
    target_tok_s: float = option(10000.0, "aggregate generated tokens/s wanted")
    ttft_target_ms: float | None = option(None, "what-if: a median time-to-first-token target (ms) of the sustained "
                                                "service too; null: none")

    def __post_init__(self) -> None:
        for name, lo in (("context", 0), ("output", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{name}={v!r}: allowed integers >= {lo}")
        for name in ("itl_target_ms", "target_tok_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
                raise ConfigError(f"{name}={v!r}: allowed a number > 0")
        v = self.ttft_target_ms
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf):
            raise ConfigError(f"ttft_target_ms={v!r}: allowed a number > 0, or null (no TTFT target)")


def planned_rows(t: pd.DataFrame) -> pd.DataFrame:
    """The rows of a plan's table a plan may pick: they fit the memory, meet the ITL target (and the TTFT target, a
    what-if's `meets_ttft`) and stay within the deployment's cap on running sequences."""
    return t[t["fits_memory"] & t["meets_itl"] & t["within_cap"] & t.get("meets_ttft", True)]


def device_memory_bytes(memory_gb: float | None, device) -> float | None:
    """The memory of one device a plan uses: a user's memory_gb (GB), else the datasheet row's as the driver
    reports it (Datasheet.usable_mem_bytes, what whatif.memory_check reads by default); None without either."""
    if memory_gb:
        return memory_gb * 1e9
    return device.usable_mem_bytes() if device is not None else None


def check_inputs(mem_bytes: float, Bs, bw_eff: float = 0.8, f_eff: float = 0.7, t0_s: float = 0.0,
                 spec: "Speculation | None" = None) -> None:
    """Bad input fails before anything is computed or written, naming the field."""
    if not (isinstance(mem_bytes, (int, float)) and 0 < mem_bytes < math.inf):
        raise ConfigError(f"memory_gb={mem_bytes / 1e9 if isinstance(mem_bytes, (int, float)) else mem_bytes!r}: "
                          "allowed a number > 0")
    bad = [b for b in Bs if isinstance(b, bool) or not isinstance(b, int) or b < 1]
    if bad or not list(Bs):
        raise ConfigError(f"B={list(Bs)}: allowed a non-empty list of integers >= 1")
    for name, v in (("bw_efficiency", bw_eff), ("flops_efficiency", f_eff)):
        if not (isinstance(v, (int, float)) and 0 < v <= 1):
            raise ConfigError(f"{name}={v!r}: allowed a fraction in (0, 1] of the datasheet ceiling")
    if not (isinstance(t0_s, (int, float)) and 0 <= t0_s < math.inf):
        raise ConfigError(f"t0_ms={t0_s * 1e3 if isinstance(t0_s, (int, float)) else t0_s!r}: allowed a number >= 0")
    if spec is not None:
        if not (isinstance(spec.alpha, (int, float)) and 0 <= spec.alpha < 1):
            raise ConfigError(f"alpha={spec.alpha!r}: allowed an acceptance rate in [0, 1)")
        if isinstance(spec.k, bool) or not isinstance(spec.k, int) or spec.k < 1:
            raise ConfigError(f"k={spec.k!r}: allowed integers >= 1")


@dataclass(frozen=True)
class Speculation:
    alpha: float = option(0.8, "speculation: i.i.d. acceptance rate (yours to give)")
    k: int = option(2, "speculation: draft length")
    drafter: DraftCost = internal(DraftCost("mtp"), "the command's drafter and draft_model keys "
                                                    "(roofline.commands.capacity.CapacityKeys)")


def batch_table(fit: dict, cfg: ModelConfig, dtype: str, work: Workload, Bs, spec: Speculation | None,
                mode: str | None = None) -> pd.DataFrame:
    """Per-device tokens/s and ITL for each batch, plain decode and (optionally) speculative."""
    L = work.context + work.output // 2
    plain = step_costs(fit, dtype, DraftCost("ngram"), cfg, mode)
    rows = []
    for B in Bs:
        t1 = plain.steps.target(1, B, L)
        rows.append(dict(B=B, spec=False, alpha=np.nan, k=0, step_s=t1, itl_ms=t1 * 1e3,
                         tok_s_per_device=B / t1))
        if spec is not None:
            c = step_costs(fit, dtype, spec.drafter, cfg, mode)
            r = speculation.round_time(spec.k, B, L, c.steps)
            tau = speculation.tau_iid(spec.alpha, spec.k)
            rows.append(dict(B=B, spec=True, alpha=spec.alpha, k=spec.k, step_s=r, itl_ms=r / tau * 1e3,
                             tok_s_per_device=B * tau / r))
    return pd.DataFrame(rows).assign(L_priced=L)


def plan(fit: dict, cfg: ModelConfig, dtype: str, work: Workload, mem_bytes: float, Bs,
         spec: Speculation | None = None, extrapolated: bool = False, mode: str | None = None,
         max_running: int | None = None) -> tuple[pd.DataFrame, dict]:
    """(per-batch table, summary): largest batch meeting the ITL target and memory (and `max_running`, the
    deployment's cap on running sequences, where given: `within_cap`), devices needed."""
    check_inputs(mem_bytes, Bs, spec=spec)
    if work.ttft_target_ms is not None:
        raise ConfigError(f"ttft_target_ms={work.ttft_target_ms!r}: a fit's plan prices decode steps alone, no prompt; "
                          "a TTFT target needs the what-if (drop fit=)")
    if not fit["provenance"].get("what_if"):
        bad = fitcheck.unusable_groups(fit, {"forward"} | ({"mtp"} if spec and spec.drafter.kind == "mtp" else set()))
        if bad:
            raise ConfigError("fit: " + "; ".join(quality.fit_warnings(dict(groups=bad))) + ": refit on more points")
    why = [f"what-if: {fit['provenance']['what_if']}"] if fit["provenance"].get("what_if") else \
        quality.extrapolation(fit, cfg.name, parse_precision(dtype).label, q=[1] + ([spec.k + 1] if spec else []), B=list(Bs),
                              L=work.context + work.output // 2)
    extrapolated = extrapolated or bool(why)
    tokens_per_seq = work.context + work.output
    with_mtp = spec is not None and spec.drafter.kind == "mtp"
    weights = memory.resident_bytes(cfg, dtype, 1, tokens_per_seq, with_mtp).weights
    t = batch_table(fit, cfg, dtype, work, Bs, spec, mode)
    draft = spec.drafter.model if spec is not None and spec.drafter.kind == "draft_model" else None

    def resident(b, s):  # a speculative row holds the MTP module, or the draft model's weights and KV, too
        r = memory.resident_bytes(cfg, dtype, b, tokens_per_seq, s and with_mtp)
        d = memory.resident_bytes(draft, dtype, b, tokens_per_seq, False) if s and draft else memory.Resident(0.0, 0.0)
        return memory.Resident(r.weights + d.weights, r.kv + d.kv)
    t["mem_GB"] = [resident(b, s).total / 1e9 for b, s in zip(t["B"], t["spec"])]
    t["fits_memory"] = t["mem_GB"] * 1e9 <= mem_bytes
    t["meets_itl"] = t["itl_ms"] <= work.itl_target_ms
    t["within_cap"] = t["B"] <= max_running if max_running else True
    t["extrapolated"] = extrapolated
    summary = dict(model=cfg.name, dtype=parse_precision(dtype).label, **precision_columns(dtype),
                   device=fit["provenance"].get("device_name"),
                   memory_GB=mem_bytes / 1e9, weights_GB=weights / 1e9, workload=work.__dict__,
                   speculation=None if spec is None else dict(alpha=spec.alpha, k=spec.k, drafter=spec.drafter.kind),
                   extrapolated=extrapolated, extrapolation=why, fit_problems=quality.fit_warnings(fit),
                   what_if=fit["provenance"].get("what_if"), max_running_seqs=max_running or None,
                   priced=PRICED_FIT)
    if weights > mem_bytes:
        summary["fits_one_device"] = False
        summary["note"] = (f"weights alone need {weights / 1e9:.1f} GB > {mem_bytes / 1e9:.1f} GB on one device; "
                           "tensor parallelism is not modelled")
        return t, summary
    summary["fits_one_device"] = True
    for label, sub in (("plain", t[~t["spec"]]), ("spec", t[t["spec"]])):
        if sub.empty:
            continue
        one = resident(1, label == "spec")
        b_mem = max(0, int((mem_bytes - one.weights) // one.kv)) if one.kv > 0 else 0
        ok = planned_rows(sub)
        best = ok.loc[ok["tok_s_per_device"].idxmax()] if not ok.empty else None
        summary[label] = dict(
            max_batch_by_memory=b_mem,
            max_batch_meeting_itl_in_grid=None if best is None else int(ok["B"].max()),
            best_batch=None if best is None else int(best["B"]),
            tok_s_per_device=None if best is None else float(best["tok_s_per_device"]),
            itl_ms=None if best is None else float(best["itl_ms"]),
            devices_for_target=None if best is None else math.ceil(work.target_tok_s / best["tok_s_per_device"]))
    return t, summary


@dataclass(frozen=True)
class CapacityRequest:
    """One capacity plan (roofline/conf/capacity.yaml): a fitted device, or a datasheet what-if."""

    model: ModelConfig = option(help="model preset (roofline/conf/model/)")
    dtype: str = option("bfloat16", "float32 | bfloat16 | float16: activations (and every class not overridden)")
    fit: str | None = option(None, "a fit.json: use its fitted device parameters (measured)")
    device: str = internal("h200_sxm", "the command's `device` key (a roofline/conf/device/ entry): its "
                                       "datasheet row; without fit a what-if flagged extrapolated")
    calibrate: str | None = option(None, f"what-if: {POINTS_FILE} of this model "
                                         "(roofline.analysis.calibrate)")
    engine: str | None = option(None, "what-if: an engine profile (roofline/conf/engine/: vllm, sglang, trtllm, "
                                      "...); null: the interval spans them")
    tp: int = internal(1, "the what-if layout: the tp key (roofline.commands.LayoutKeys)")
    ep: int = internal(1, "the what-if layout: the ep key (roofline.commands.LayoutKeys)")
    dp_attention: bool = internal(False, "the what-if layout: the dp_attention key (roofline.commands.LayoutKeys)")
    graph_batch_sizes: tuple | None = internal(None, "the what-if's CUDA-graph sizes: the graph_batch_sizes key "
                                                     "(roofline.commands.GraphKeys)")
    memory_gb: float | None = option(None, "device memory (GB, 1e9 B); null: the datasheet row's, as the driver "
                                           "reports it (an H100's 80 GiB: 85.5 GB); required for CPU fits")
    work: Workload = internal(Workload(), "the context, output, itl_target_ms and target_tok_s keys (Workload)")
    B: tuple[int, ...] = option((1, 2, 4, 8, 16, 32, 64, 128, 256), "batch sizes planned")
    max_running_seqs: int = option(0, "the deployment's cap on running sequences (--max-num-seqs, "
                                      "--max-running-requests, max_batch_size): no larger batch is planned; 0: the "
                                      "engine's defaults (what-if: engines.yaml max_running_seqs, "
                                      "spec_max_running_seqs), none with a fit")
    speculation: Speculation | None = internal(None, "the speculative, alpha, k, drafter and draft_model keys "
                                                     "(Speculation, roofline.commands.capacity.CapacityKeys)")
    out_dir: str = option("", "the plans' root folder (a <model>-<device>-<dtype> folder in it); "
                              "empty: <results root>/capacity")
    allow_other_model: bool = option(False, "true: apply a fit of one model to another (a device-fit transfer, "
                                            "marked extrapolated)")

    def __post_init__(self) -> None:
        from roofline.parallel.engines import run_scheduling
        run_scheduling(dict(max_running_seqs=self.max_running_seqs), "")  # an integer >= 1, or 0: the engine's


def whatif_of(c: dict, model: ModelConfig, label: str):
    """The one what-if model (roofline.parallel.whatif) for a plain config dict's device, layout,
    engine and calibration."""
    from roofline.parallel import whatif
    from roofline.parallel.engines import engine_name, graph_batch_sizes
    from roofline.parallel.layout import Layout
    if not c.get("device"):
        raise ConfigError("device is required for a what-if (a datasheet row of roofline/conf/device/)")
    w = whatif.WhatIf(model, get_datasheet(c["device"]), label,
                      Layout(tp=c.get("tp", 1), ep=c.get("ep", 1), dp_attention=c.get("dp_attention", False)),
                      whatif.Setting(engine=engine_name(c.get("engine")), graphs=c.get("graphs"),
                                     graph_batch_sizes=graph_batch_sizes(c)))
    w.setting.engine_names()  # an unknown engine fails here, naming engine=
    if c.get("calibrate"):
        w = calibrated(w, c["calibrate"])
    return w


def plan_whatif(req: "CapacityRequest") -> tuple[pd.DataFrame, dict]:
    """The plan without a fit: per batch, ITL and tokens/s per device from the what-if model
    (each an interval), memory per device with the drafter's weights and KV, on one layout."""
    from roofline.parallel import whatif
    c = dict(device=req.device, tp=req.tp, ep=req.ep, dp_attention=req.dp_attention, engine=req.engine,
             calibrate=req.calibrate, graph_batch_sizes=req.graph_batch_sizes)
    w = whatif_of(c, req.model, req.dtype)
    spec, work = req.speculation, req.work
    check_inputs(req.memory_gb * 1e9 if req.memory_gb is not None else 1.0, req.B, spec=spec)
    mem_bytes = device_memory_bytes(req.memory_gb, w.device)
    L, tokens = work.context + work.output // 2, work.context + work.output  # the mean context a decode step sees
    mtp = spec is not None and spec.drafter.kind == "mtp"
    eagle = spec.drafter.kind if spec is not None and spec.drafter.kind in whatif.EAGLE_HEADS else ""
    draft = spec.drafter.model if spec is not None and spec.drafter.kind == "draft_model" else None
    if mtp and req.model.mtp_layers < 1:
        raise ConfigError(f"drafter=mtp: model {req.model.name!r} has no MTP module (mtp_layers=0)")
    dw = w.draft_what_if(draft) if draft else None
    # the engine's cap on running sequences (the deployment's own, else its defaults; SGLang's 48 with speculation)
    modes = [False, True] if spec is not None else [False]  # plain decode, and speculative where asked
    caps = {sp: whatif.planned_cap(w, sp, req.max_running_seqs or None) for sp in modes}
    rows = []
    for B in sorted(set(req.B) | {c for c in caps.values() if c and c < max(req.B)}):  # a cap inside the grid: planned
        for sp in modes:
            sd = whatif.SpecDecode(spec.k, (spec.alpha,), spec.drafter.kind, dw) if sp else None
            run = whatif.sustained(w, B, work.context, work.output, sd, req.max_running_seqs or None)
            t, out = run["itl_mean_s"], run["tok_s_per_gpu"]
            meets_itl, meets_ttft = whatif.meets_targets(run, work.itl_target_ms, work.ttft_target_ms)
            mem = whatif.memory_check(req.model, w.device, req.dtype, w.layout, B, tokens, sp and mtp, draft if sp else None,
                                      mem_bytes=mem_bytes, setting=w.setting, eagle=eagle if sp else "")
            rows.append(dict(B=B, spec=sp, alpha=spec.alpha if sp else np.nan, k=spec.k if sp else 0,
                             itl_ms=t["typical"] * 1e3, itl_ms_optimistic=t["optimistic"] * 1e3,
                             itl_ms_pessimistic=t["pessimistic"] * 1e3, itl_median_ms=run["itl_s"]["typical"] * 1e3,
                             ttft_ms=run["ttft_s"]["typical"] * 1e3, tok_s_per_device=out["typical"],
                             tok_s_per_device_optimistic=out["optimistic"],
                             tok_s_per_device_pessimistic=out["pessimistic"],
                             mem_GB=mem["mem_per_device_GB"], fits_memory=mem["fits"],
                             meets_itl=meets_itl, meets_ttft=meets_ttft,
                             within_cap=caps[sp] is None or B <= caps[sp], extrapolated=True, L_priced=L))
    table = pd.DataFrame(rows)
    summary = dict(model=req.model.name, dtype=parse_precision(req.dtype).label, **precision_columns(req.dtype),
                   device=w.device.name, layout=w.layout.label(), engine=req.engine or "all profiles (span)",
                   memory_GB=(mem_bytes or 0) / 1e9,
                   workload=work.__dict__,
                   speculation=None if spec is None else dict(alpha=spec.alpha, k=spec.k, drafter=spec.drafter.kind),
                   extrapolated=True, calibration_scale=w.scale,
                   max_running_seqs=dict(plain=caps[False], **({"spec": caps[True]} if True in caps else {})),
                   priced=PRICED_WHATIF,
                   what_if="datasheet row + kernels.yaml + engines.yaml + priors.yaml (roofline.parallel.whatif)")
    fits = table[table["fits_memory"]]
    summary["fits_device"] = bool(len(fits))
    if fits.empty:
        summary["note"] = (f"does not fit {w.device.name} as {w.layout.label()} at any batch of {list(req.B)}: "
                           f"{table['mem_GB'].min():.1f} GB per device needed of {summary['memory_GB']:.0f} GB; "
                           "give more devices (tp=, or layouts=true to plan every layout) or a smaller format (weights=)")
    for label, sub in (("plain", table[~table["spec"]]), ("spec", table[table["spec"]])):
        ok = planned_rows(sub)
        if sub.empty:
            continue
        best = ok.loc[ok["tok_s_per_device"].idxmax()] if not ok.empty else None
        per_replica = w.layout.devices  # a layout is deployed whole: a tp8 replica is 8 devices
        replicas = None if best is None else math.ceil(work.target_tok_s / (best["tok_s_per_device"] * per_replica))
        summary[label] = dict(best_batch=None if best is None else int(best["B"]),
                              tok_s_per_device=None if best is None else float(best["tok_s_per_device"]),
                              itl_ms=None if best is None else float(best["itl_ms"]),
                              devices_per_replica=per_replica, replicas_for_target=replicas,
                              devices_for_target=None if best is None else replicas * per_replica)
    return table, summary
