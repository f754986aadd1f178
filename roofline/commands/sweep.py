"""time forward passes over a grid (q, B, L, dtypes, modes)

`python -m roofline.cli.sweep model=cpu-demo` (or `checkpoint=DIR`; `tp=2 [ep=2]`: several ranks,
spawned here or under torchrun / srun): points.jsonl and run.json in the run folder, the
one-screen table (T(q)/T(1), ms, GB/s, TFLOP/s) and the JSON summary on the console."""

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from roofline.io import files
from roofline.analysis import quality
from roofline.checkpoints.loader import checkpoint_config
from roofline.commands import FormatKeys, LayoutKeys, axis, not_both, served_label
from roofline.io import results
from roofline.io.fields import from_dict, option
from roofline.io.results import RUNS_ROOT
from roofline.measure.noise import NoiseSettings
from roofline.measure.sweep import SweepRequest, dry_run, run_sweep, summary_table
from roofline.measure.timer import TimerSettings
from roofline.model.config import ModelConfig
from roofline.parallel.layout import Layout
from roofline.parallel.runner import run_parallel_sweep


# what the `device` entry (roofline/conf/device/) means to this command: the torch device to run on
DEVICE_AS = "torch"


@dataclass(frozen=True)
class NoiseKeys(NoiseSettings):
    """The busy-machine check's settings and its switch."""

    enabled: bool = option(True, "false: no interleaved reference measurements, no noisy marks")


@dataclass(frozen=True)
class SweepKeys:
    """The sweep's keys that are not fields of the request: what to run it on, and how to run it."""

    model: dict | None = option(None, "model preset (roofline/conf/model/)")
    device: dict | None = option(None, "roofline/conf/device/: cpu | cuda | a datasheet GPU row (h200_sxm, ...); "
                                       "device.torch=cuda:N picks a GPU")
    progress: bool = option(True, "a progress bar on stderr")
    dry_run: bool = option(False, "true: print the expanded grid, each point's memory fit and a time bound; "
                                  "measure nothing")
    force: bool = option(False, "true: set the out_dir's previous run aside (previous-<time>/) and measure again")
    extend: bool = option(False, "true: add new grid values to the run in out_dir (the union grid; measured "
                                 "points kept)")
    retry_failed: bool = option(True, "on resume, measure again the points that failed with oom, too_big or error")
    noise: NoiseKeys = option(help="busy-machine check (roofline.measure.noise)", factory=NoiseKeys)


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (SweepRequest, FormatKeys, LayoutKeys, SweepKeys)


def build_request(c: dict) -> SweepRequest:
    """The sweep a composed config asks for, validated (also what the device check's dry run
    calls on the GPU branch's overrides: nothing here needs the device itself)."""
    not_both(c, "checkpoint", "model")
    model = checkpoint_config(c["checkpoint"]) if c["checkpoint"] else ModelConfig.from_dict(c["model"])
    return SweepRequest(model=model, q=axis(c["q"], "q"), B=axis(c["B"], "B"),
                     L=axis(c["L"], "L"), modes=axis(c["modes"], "modes"),
                     dtypes=tuple(d if d == "auto" else served_label(d, c, model, c["weights"])
                                  for d in axis(c["dtypes"], "dtypes")),
                     timer=from_dict(TimerSettings, c["timer"], "timer"), device=c["device"], layers=c["layers"],
                     mtp_q=axis(c["mtp_q"], "mtp_q"), seed=c["seed"], ceilings=c["ceilings"] or "",
                     overrides=tuple(c["overrides"]), checkpoint=c["checkpoint"] or "",
                     parallel=Layout(tp=c["tp"], ep=c["ep"], dp_attention=c["dp_attention"]),
                     cpu_gemm=c.get("cpu_gemm") or "auto", cpu_attention=c.get("cpu_attention") or "auto")


def run(c: dict, done=None) -> dict | None:
    """The sweep; returns the record of its job (None on a follower rank of a torchrun / srun
    launch: rank 0 reports). `done.summary` is set once the points are saved, so a signal from
    then on still says what was saved."""
    req = build_request(c)
    run_dir = Path(c["out_dir"]) if c["out_dir"] else req.default_out_dir(RUNS_ROOT)
    noise = {k: v for k, v in c["noise"].items() if k != "enabled"}
    noise = NoiseSettings(**noise) if c["noise"]["enabled"] else None  # checked in a dry run too
    if c["dry_run"]:
        print(dry_run(req, run_dir, force=c["force"], extend=c["extend"]))
        return dict(status="ok", dry_run=True)
    options = dict(force=c["force"], extend=c["extend"], retry_failed=c["retry_failed"])
    if req.parallel.devices > 1:  # the ranks are started here (or joined, under torchrun / srun)
        summary = run_parallel_sweep(req, run_dir, c["progress"], **options)
    else:
        summary = run_sweep(req, run_dir, progress=c["progress"], **options,
                            noise=noise)
    if summary is None:  # a follower rank of a torchrun / srun launch: rank 0 reports
        return None
    if done is not None:
        done.summary = summary  # a signal from here on still says what was saved
    print(summary_text(run_dir))
    print(files.json_text(summary))
    return dict(status="ok", **summary)


def summary_text(run_dir: Path) -> str:
    """The one-screen end-of-run table: T(q)/T(1), ms, GB/s, TFLOP/s per (kind, dtype, mode, B, L)."""
    df = results.load_run(run_dir)
    t = summary_table(df)
    head = f"key figure: {quality.key_figure(df)}"
    warnings = [f"warning: {w}" for w in quality.run_warnings(run_dir, df)]
    if t.empty:
        return "\n".join([head, "no successful points"] + warnings)
    with pd.option_context("display.width", 160, "display.max_rows", 200):
        table = t.round({"p50_ms": 3, "p90_ms": 3, "p99_ms": 3, "t_over_t1": 3, "GBps": 2, "TFLOPs": 4}).to_string(index=False)
    return "\n".join([head, table] + warnings)
