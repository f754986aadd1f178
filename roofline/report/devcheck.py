"""The device check's own pieces (scripts/gpu_check.sh): the environment probe and the goals table.

`environment` records what the node really is (versions, the device's L2 against the
datasheet table, whether Triton runs interpreted) and which attention kernel the sweep's
shapes select, asked two ways: torch's dispatcher for the exact tensors, and on CUDA the
kernel names one profiled forward of a one-layer model of the real shapes launches.

`goals` reads the check's outputs and states, as ratios measured in one run, the GPU goals of
the project (README, "GPU"): Triton copy >= torch copy and >= 93% of the datasheet bandwidth;
the model's decode step at B=1 in compiled mode >= 85% of the measured copy ceiling; held-out
cost-model error <= 3%. A goal whose inputs are missing is "not measured", never met.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

import pandas as pd
import torch

from roofline.io import results
from roofline.measure.devices import is_cuda, datasheet_for_running_device
from roofline.measure.forward import count_kernels, eager_attention_backend
from roofline.model.config import ModelConfig
from roofline.model.decoder import build_model

LARGE = 4  # a working set >= 4x the cache is a DRAM/HBM measurement (as roofline.measure.ceilings)
GOALS = (("triton_copy_vs_torch_copy", ">= 1.00"), ("triton_copy_vs_datasheet", ">= 0.93"),
         ("decode_B1_compiled_vs_copy_ceiling", ">= 0.85"), ("heldout_fit_mape_pct", "<= 3.0"))


def _version(module: str) -> str | None:
    try:
        return getattr(__import__(module), "__version__", "?")
    except Exception:
        return None


def attention_probe(cfg: ModelConfig, dtype: torch.dtype, device: str, shapes: list[tuple[int, int, int]]) -> list[dict]:
    """For each (B, q, L): the backend torch's dispatcher selects for the decoder's attention at
    that point (uniform positions, as the sweep calls it) and, on CUDA, the one the kernel names
    of a profiled forward show. One decoder layer of the real shapes is enough: every layer
    attends alike."""
    max_b = max(b for b, _, _ in shapes)
    max_ctx = max(L + q for _, q, L in shapes)
    m = build_model(cfg.scaled(layers=1), max_batch=max_b, max_context=max_ctx, dtype=dtype, device=device)
    out = []
    for B, q, L in shapes:
        tokens = torch.randint(0, cfg.vocab, (B, q), device=device)
        fn = lambda: m(tokens, L)  # noqa: E731
        row = dict(B=B, q=q, L=L, dispatcher=eager_attention_backend(fn))
        row["kernels"] = count_kernels(fn, device)["kernel_attn_backend"] if is_cuda(device) else None
        out.append(row)
    del m
    return out


def environment(device: str, cfg: ModelConfig, dtype: torch.dtype, shapes: list[tuple[int, int, int]]) -> dict:
    """Versions, device, L2 (queried vs table), Triton mode, attention backends of the sweep's shapes."""
    sheet, matched = datasheet_for_running_device(device)
    env = dict(python=sys.version.split()[0], platform=platform.platform(), torch=torch.__version__,
               cuda=torch.version.cuda, triton=_version("triton"), hydra=_version("hydra"),
               omegaconf=_version("omegaconf"), numpy=_version("numpy"), pandas=_version("pandas"),
               TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET"), device=device,
               datasheet_key=sheet.key if matched else None, datasheet_l2_bytes=sheet.l2_bytes,
               datasheet_mem_bw_GBps=sheet.mem_bw_GBps)
    if is_cuda(device):
        p = torch.cuda.get_device_properties(torch.device(device))
        queried = int(getattr(p, "L2_cache_size", 0) or 0)
        env.update(device_name=p.name, sm_count=p.multi_processor_count, capability=f"{p.major}.{p.minor}",
                   total_memory_bytes=int(p.total_memory), l2_bytes_queried=queried,
                   l2_matches_table=None if not sheet.l2_bytes else queried == sheet.l2_bytes,
                   driver=_driver())
    else:
        env.update(device_name=sheet.name if matched else None, threads=torch.get_num_threads())
    env["attention"] = attention_probe(cfg, dtype, device, shapes)
    return env


def _driver() -> str | None:
    try:
        from roofline.measure.telemetry import _nvml
        nvml, _ = _nvml()
        v = nvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        return None


# --------------------------------------------------------------------------- goals


def best_copy(ceilings: dict, family: str) -> float | None:
    """Best GB/s of the `family` ("triton" or "torch") copy kernels, cold L2, at working sets
    >= LARGE x the cache (read + written bytes: the convention of roofline.measure.ceilings)."""
    cache = (ceilings.get("summary") or {}).get("cache_bytes") or 0
    rows = [r for r in ceilings.get("bandwidth", []) if r["kernel"].startswith(f"{family}_copy")
            and r["l2"] == "cold" and r["working_set_bytes"] >= LARGE * cache]
    return max((r["GBps"] for r in rows), default=None)


def sweep_rows(run_dirs: list[Path]) -> pd.DataFrame:
    """Every row of the sweep folders, read from points.jsonl with its corrections applied (a
    sweep stopped by its time limit keeps the points it finished)."""
    frames = [results.to_frame(results.apply_corrections(d, results.read_rows(Path(d) / "points.jsonl")))
              for d in run_dirs if (Path(d) / "points.jsonl").exists()]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _goal(name: str, value: float | None, detail: str) -> dict:
    target = dict(GOALS)[name]
    if value is None:
        return dict(goal=name, target=target, measured=None, met=None, detail=detail)
    bound = float(target.split()[1])
    met = value >= bound if target.startswith(">=") else value <= bound
    return dict(goal=name, target=target, measured=round(value, 4), met=bool(met), detail=detail)


def goals(ceilings: dict | None, rows: pd.DataFrame, fit: dict | None, datasheet_GBps: float | None) -> list[dict]:
    """The project's GPU goals as ratios of one run (met: True/False; None = not measured)."""
    triton = best_copy(ceilings, "triton") if ceilings else None
    torch_copy = best_copy(ceilings, "torch") if ceilings else None
    out = [
        _goal("triton_copy_vs_torch_copy", triton / torch_copy if triton and torch_copy else None,
              f"best Triton copy {triton} GB/s vs torch copy {torch_copy} GB/s (cold L2, >= {LARGE}x cache)"),
        _goal("triton_copy_vs_datasheet", triton / datasheet_GBps if triton and datasheet_GBps else None,
              f"best Triton copy {triton} GB/s vs datasheet {datasheet_GBps} GB/s"),
    ]
    decode = pd.DataFrame()
    if not rows.empty and {"mode", "status"} <= set(rows.columns):
        decode = rows[(rows["mode"] == "compiled") & (rows["kind"] == "forward") & (rows["q"] == 1)
                      & (rows["B"] == 1) & (rows["status"] == "ok")]
    ratio = None
    if torch_copy or triton:
        ceiling = max(v for v in (triton, torch_copy) if v)
        if not decode.empty:
            ratio = float((decode["achieved_GBps"] / ceiling).min())
        detail = (f"decode q=1 B=1 compiled at L={sorted(decode['L'].tolist())}: achieved "
                  f"{[round(v, 1) for v in decode['achieved_GBps']]} GB/s (weights + KV read + KV write + "
                  f"embedding rows, per median step) vs measured copy ceiling {ceiling} GB/s; the lowest L counts")
    else:
        detail = "no measured copy ceiling"
    out.append(_goal("decode_B1_compiled_vs_copy_ceiling", ratio, detail))
    mape = None
    for g in (fit or {}).get("groups", []):
        if g["key"].get("kind") == "forward":
            for e in g["errors"]:
                if e["method"] == "fit" and e["regime"] == "all" and "held-out" in e["split"] and e["n"]:
                    mape = e["MAPE_pct"] if mape is None else max(mape, e["MAPE_pct"])
    out.append(_goal("heldout_fit_mape_pct", mape, "K-fold held-out mean |pred/meas - 1| of the forward fit"))
    return out


def _table(df: pd.DataFrame) -> str:
    return df.to_markdown(index=False) if _has_tabulate() else "```\n" + df.to_string(index=False) + "\n```"


def tq_table(rows: pd.DataFrame) -> pd.DataFrame:
    """T(q)/T(1) per (mode, B, L) of the ok forward rows at full depth, with ms and GB/s."""
    from roofline.measure.sweep import summary_table
    need = {"status", "layers_run", "layers_full", "kind", "t_median_s", "achieved_GBps", "achieved_TFLOPs"}
    if rows.empty or not need <= set(rows.columns):
        return pd.DataFrame()
    t = summary_table(rows)
    if t.empty:
        return t
    t = t[t["kind"] == "forward"].drop(columns=["kind"])
    return t.round({"t_ms": 3, "t_over_t1": 3, "GBps": 1, "TFLOPs": 2})


def failures(steps: list[dict], logs: Path | None, lines: int = 8) -> list[dict]:
    """The steps that did not exit 0, each with the last `lines` lines of its log."""
    out = []
    for s in steps:
        if str(s["rc"]) == "0":
            continue
        log = Path(logs) / f"{s['step']}.log" if logs else None
        tail = log.read_text(errors="replace").splitlines()[-lines:] if log and log.exists() else []
        out.append(dict(step=s["step"], rc=s["rc"], tail=tail))
    return out


def moe_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The MoE run's decode rows (q = 1, ok, full depth) by mode, the experts it ran and B: median step ms and
    T(B)/T(1) at the same L (> 1 when the touched experts are run and read; 1.00 when every expert is)."""
    need = {"status", "kind", "q", "B", "L", "t_median_s", "mode"}
    if rows.empty or not need <= set(rows.columns):
        return pd.DataFrame()
    d = rows[(rows["status"] == "ok") & (rows["kind"] == "forward") & (rows["q"] == 1)]
    if {"layers_run", "layers_full"} <= set(d.columns):
        d = d[d["layers_run"] == d["layers_full"]]
    if d.empty:
        return pd.DataFrame()
    keys = ["mode"] + (["moe_impl"] if "moe_impl" in d.columns else []) + ["L", "B"]
    t = d.groupby(keys, dropna=False)["t_median_s"].median().rename("t_ms").reset_index()
    t["t_ms"] = 1e3 * t["t_ms"]
    one = t[t["B"] == 1][keys[:-1] + ["t_ms"]].rename(columns={"t_ms": "t_B1_ms"})
    t = t.merge(one, on=keys[:-1], how="left")
    t["t_over_t_B1"] = t["t_ms"] / t.pop("t_B1_ms")
    return t.round({"t_ms": 3, "t_over_t_B1": 3})


def summary_markdown(steps: list[dict], env: dict | None, goal_rows: list[dict], rows: pd.DataFrame,
                     logs: Path | None = None, moe_rows: pd.DataFrame | None = None,
                     moe_fit: dict | None = None) -> str:
    """summary.md: the device, the steps, the goals, T(q)/T(1), rows by status, the MoE run (the experts
    it ran, T(B)/T(1), its fit's groups), the failures."""
    lines = ["# Device check", ""]
    if env:
        lines.append(f"Device: {env.get('device_name')} ({env.get('device')}); torch {env.get('torch')}, "
                     f"CUDA {env.get('cuda')}, triton {env.get('triton')}, python {env.get('python')}; "
                     f"TRITON_INTERPRET={env.get('TRITON_INTERPRET')}; L2 queried {env.get('l2_bytes_queried')} B, "
                     f"table {env.get('datasheet_l2_bytes')} B.")
        lines.append("")
    lines += ["## Steps", "", "| step | exit | seconds | limit s |", "| --- | --- | --- | --- |"]
    lines += [f"| {s['step']} | {s['rc']} | {s['seconds']} | {s['limit_s']} |" for s in steps]
    lines += ["", "Exit 124: the step reached its time limit (SIGINT, then what it had finished was kept); "
              "125: skipped, the check's time budget was spent.", ""]
    lines += ["## Goals (ratios measured in this run)", "", "| goal | target | measured | met | how |",
              "| --- | --- | --- | --- | --- |"]
    for g in goal_rows:
        met = "not measured" if g["met"] is None else ("yes" if g["met"] else "no")
        lines.append(f"| {g['goal']} | {g['target']} | {g['measured']} | {met} | {g['detail']} |")
    tq = tq_table(rows)
    lines += ["", "## T(q)/T(1) (forward, full depth, ok rows)", ""]
    lines.append(_table(tq) if not tq.empty else "no ok forward rows")
    if not rows.empty:
        lines += ["", "## Sweep rows by status and mode", ""]
        cols = [c for c in ("mode", "status", "attn_backend", "cuda_graphs", "noisy") if c in rows.columns]
        lines.append(_table(rows.groupby(cols, dropna=False).size().rename("rows").reset_index()))
    if moe_rows is not None:
        mt = moe_table(moe_rows)
        lines += ["", "## MoE decode (q = 1): the experts each mode ran, T(B)/T(1)", ""]
        lines.append(_table(mt) if not mt.empty else "no ok MoE decode rows")
        for g in (moe_fit or {}).get("groups", []):
            fit_err = [e for e in g.get("errors", []) if e.get("method") == "fit" and e.get("regime") == "all"]
            mape = ", ".join(f"{e['split']}: {e['MAPE_pct']:.1f}%" for e in fit_err if e.get("n"))
            lines.append(f"- fit group {g['key']}: moe_impl {g.get('moe_impl')}, {g.get('n_points')} points"
                         + (f"; MAPE {mape}" if mape else ""))
    fails = failures(steps, logs)
    lines += ["", "## Failures", ""]
    if not fails:
        lines.append("none: every step exited 0")
    for f in fails:
        lines += [f"### {f['step']} (exit {f['rc']})", "", "```", *f["tail"], "```", ""]
    return "\n".join(lines) + "\n"


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
        return True
    except ImportError:
        return False


def read_steps(path: Path) -> list[dict]:
    """steps.tsv written by the script: step, rc, seconds, limit_s per line."""
    out = []
    if Path(path).exists():
        for line in Path(path).read_text().splitlines()[1:]:
            step, rc, seconds, limit = (line.split("\t") + ["", "", "", ""])[:4]
            out.append(dict(step=step, rc=rc, seconds=seconds, limit_s=limit))
    return out


def load_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
