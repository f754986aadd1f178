"""The sweep: rows with physics and provenance, failures as data, resume after a kill."""

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from roofline.io import results
from roofline.io.fields import ConfigError
from roofline.model.presets import REPO_ROOT, get_preset
from roofline.measure.sweep import SweepRequest, extrapolate_layers, grid, run_sweep
from roofline.measure.timer import TimerSettings

FAST = TimerSettings(warmup=1, min_reps=3, max_reps=5, budget_s=0.05)


def sweep_request(**kw):
    base = dict(model=get_preset("tiny"), q=(1, 2), B=(1, 2), L=(0, 8), timer=FAST)
    base.update(kw)
    return SweepRequest(**base)


@pytest.mark.slow
def test_rows_carry_timing_physics_and_provenance(tmp_path):
    s = sweep_request()
    out = run_sweep(s, tmp_path, progress=False)
    df = pd.read_csv(tmp_path / "points.csv")
    assert out["points"] == len(grid(s)) == len(df) == out["ok"]
    for col in results.KEY_COLUMNS + results.TIMING_COLUMNS + results.PHYSICS_COLUMNS + results.STATUS_COLUMNS:
        assert col in df.columns, col
    for col in ("device_name", "torch_version", "threads", "git_commit", "time_utc", "overrides"):
        assert col in df.columns, col
    assert (df["t_median_s"] > 0).all()
    pd.testing.assert_series_equal(df["achieved_GBps"], df["bytes_total"] / df["t_median_s"] / 1e9,
                                   check_names=False, rtol=1e-9)
    assert set(df["kind"]) == {"forward", "mtp"}  # tiny has an MTP module
    # what each forward ran: its attention kernel and its dispatched ops, profiled once per point
    fwd = df[df["kind"] == "forward"]
    chosen = {d.split()[0] for d in df["decode_attention"]}  # cpu_attention=auto: one path, timed at build
    assert len(chosen) == 1 and chosen <= {"grouped", "sdpa"}
    want = {"grouped": "cpu_grouped_matmul", "sdpa": "flash"}[chosen.pop()]
    assert set(fwd.loc[fwd["q"] == 1, "attn_backend"]) == {want}
    assert set(fwd.loc[fwd["q"] == 2, "attn_backend"]) == {"flash"}
    assert (df["kernels_per_forward"] > 0).all() and set(df["kernels_counted"]) == {"cpu_top_level_ops"}
    assert set(df["energy_J_per_token"]) == {"n/a (no NVML on cpu)"}  # a string, never 0 or a made-up number
    # uniform positions: no mask at q=1; at q=2 one [2, L+2] bool mask, written once and read by 2 layers
    assert (fwd.loc[fwd["q"] == 1, "mask_bytes"] == 0).all()
    q2 = fwd[fwd["q"] == 2]
    assert (q2["mask_bytes"] == 2 * (q2["L"] + 2) * 3).all()


@pytest.mark.parametrize("impl, backend", [("grouped", "cpu_grouped_matmul"), ("sdpa", "flash")])
def test_a_named_cpu_decode_attention_is_what_the_decode_rows_ran(tmp_path, impl, backend):
    out = run_sweep(sweep_request(q=(1,), B=(1,), L=(8,), cpu_attention=impl), tmp_path, progress=False)
    df = pd.read_csv(tmp_path / "points.csv")
    assert out["ok"] == len(df) > 0
    assert set(df["decode_attention"]) == {f"{impl} (asked for)"}
    assert set(df.loc[df["kind"] == "forward", "attn_backend"]) == {backend}


def test_a_cpu_attention_that_does_not_exist_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"cpu_attention='flash'.*allowed \('auto', 'grouped', 'sdpa'\)"):
        sweep_request(cpu_attention="flash")


def test_a_math_attention_row_on_cuda_is_not_called_a_memory_measurement(tmp_path, monkeypatch):
    from roofline.measure import sweep as sweep_mod

    def as_if_cuda_math(w, p, timer):
        row = sweep_mod._measure(w, p, timer)
        return {**row, "attn_backend": "math"}

    monkeypatch.setattr(sweep_mod, "is_math_fallback", lambda row, device: row["attn_backend"] == "math")
    run_sweep(sweep_request(q=(1,), B=(1,), L=(0,)), tmp_path, progress=False, measure=as_if_cuda_math)
    df = pd.read_csv(tmp_path / "points.csv")
    assert set(df["status"]) == {"math_fallback"} and df["error"].str.contains("not a memory measurement").all()
    assert (df["t_median_s"] > 0).all()  # the time is kept, the label is refused


def test_an_oom_point_becomes_a_row_and_the_sweep_goes_on(tmp_path):
    from roofline.measure.sweep import _measure

    def flaky(w, p, timer):
        if p.q == 2 and p.B == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        return _measure(w, p, timer)

    out = run_sweep(sweep_request(), tmp_path, progress=False, measure=flaky)
    df = pd.read_csv(tmp_path / "points.csv")
    bad = df[df["status"] != "ok"]
    assert set(bad["status"]) == {"oom"} and len(bad) == 2  # q=2, B=2 at both L
    assert bad["error"].str.contains("out of memory").all()
    assert out["ok"] == len(df) - 2


def test_only_an_unsupported_combination_is_an_unsupported_row_and_a_bug_is_an_error_row(tmp_path):
    from roofline.measure.sweep import _measure
    from roofline.model.quant import Unsupported

    def step(w, p, timer):
        if p.q == 2:
            raise Unsupported("weights=fp8 on device=cpu: no fast kernel")
        if p.B == 2:
            raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")  # a bug, not a combination
        return _measure(w, p, timer)

    run_sweep(sweep_request(L=(0,)), tmp_path, progress=False, measure=step)
    df = pd.read_csv(tmp_path / "points.csv")
    by = {(r.q, r.B): r for r in df.itertuples()}
    assert by[(2, 1)].status == by[(2, 2)].status == "unsupported" and "no fast kernel" in by[(2, 1)].error
    assert by[(1, 2)].status == "error" and by[(1, 2)].error.startswith("TypeError: unsupported operand")
    assert by[(1, 1)].status == "ok"


def test_a_model_that_cannot_fit_becomes_too_big_rows(tmp_path, monkeypatch):
    from roofline.measure import memory
    monkeypatch.setattr(memory, "available", lambda device: (1e3, "1 kB available"))
    run_sweep(sweep_request(), tmp_path, progress=False)
    df = pd.read_csv(tmp_path / "points.csv")
    assert (df["status"] == "too_big").all(), df["error"].iloc[0]
    assert df["error"].str.startswith("TooBig: needs").all()


@pytest.mark.parametrize("field, kw, msg", [
    ("q", dict(q=(0,)), "q=\\[0\\]: allowed integers >= 1"),
    ("B", dict(B=(1, -2)), "B=\\[-2\\]"),
    ("L", dict(L=(255,)), "max_context"),
    ("modes", dict(modes=("fast",)), "allowed \\('eager', 'graph', 'compiled', 'auto'\\)"),
    ("grid", dict(q=()), "no points"),
    ("dtypes", dict(dtypes=("int8",)), "allowed"),
    ("layers", dict(layers=2), "layers=2"),
    ("graph on cpu", dict(modes=("graph",)), "needs device=cuda"),
])
def test_bad_input_fails_before_anything_is_written(tmp_path, field, kw, msg):
    with pytest.raises(ValueError, match=msg):
        run_sweep(sweep_request(**kw), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_unknown_timer_mode_names_the_field():
    with pytest.raises(ConfigError, match="timer.mode"):
        TimerSettings(mode="turbo")


@pytest.mark.slow
def test_a_run_folder_of_another_sweep_is_refused(tmp_path):
    run_sweep(sweep_request(), tmp_path, progress=False)
    with pytest.raises(ConfigError, match="different sweep"):
        run_sweep(sweep_request(q=(1, 4)), tmp_path, progress=False)


def test_torn_last_line_is_dropped_and_cut(tmp_path):
    f = tmp_path / "points.jsonl"
    f.write_text(json.dumps({"point_id": "a"}) + "\n" + '{"point_id": "b", "t_med')
    assert [r["point_id"] for r in results.read_rows(f, repair=True)] == ["a"]
    assert f.read_text().endswith("}\n")


def test_layer_extrapolation_is_linear_in_depth():
    base = dict(kind="forward", dtype="bfloat16", mode="eager", q=1, B=1, L=0, status="ok")
    rows = [dict(base, layers_run=2, t_median_s=3.0, t_p10_s=2.9, t_p90_s=3.1, t_ci_rel=0.01),
            dict(base, layers_run=4, t_median_s=5.0, t_p10_s=4.8, t_p90_s=5.2, t_ci_rel=0.01)]
    full = extrapolate_layers(rows, 12)[0]
    assert full["t_median_s"] == pytest.approx(1.0 + 12 * 1.0)  # a = 1 s, b = 1 s/layer
    assert full["status"] == "ok"
    # lever m = (12 - 2) / 2 = 5: T = -4 T_2 + 5 T_4, so +-sqrt((4 * 1% * 3 s)^2 + (5 * 1% * 5 s)^2) = 0.277 s of 13 s
    assert full["extrapolation_rel_err"] == pytest.approx(0.02133, rel=1e-3)
    assert full["t_p10_s"] == pytest.approx(13.0 * 4.8 / 5.0) and full["t_p90_s"] == pytest.approx(13.0 * 5.2 / 5.0)
    assert full["extrapolated"] and full["layers_measured"] == "2,4" and full["layers_run"] == 12


@pytest.mark.parametrize("ci, noisy, why", [(0.05, False, "lever of 5.0"), (0.01, True, "noisy")])
def test_layer_extrapolation_is_refused_when_it_cannot_hold_10_percent(ci, noisy, why):
    """5% CIs through a lever of 5 give +-20% at 12 layers: refused, with the reason; and a
    noisy input is never extrapolated."""
    base = dict(kind="forward", dtype="bfloat16", mode="eager", q=1, B=1, L=0, status="ok", t_p10_s=1, t_p90_s=1)
    rows = [dict(base, layers_run=2, t_median_s=3.0, t_ci_rel=ci, noisy=noisy),
            dict(base, layers_run=4, t_median_s=5.0, t_ci_rel=ci)]
    full = extrapolate_layers(rows, 12)[0]
    assert full["status"] == "refused" and why in full["error"]


def test_sliced_sweep_writes_extrapolated_full_depth_rows(tmp_path):
    cfg = get_preset("tiny").scaled(layers=4)
    run_sweep(sweep_request(model=cfg, layers=1, q=(1,), B=(1,), L=(0,)), tmp_path, progress=False)
    df = pd.read_csv(tmp_path / "points.csv")
    full = df[df["extrapolated"] == True]  # noqa: E712
    assert set(df["layers_run"]) == {1, 2, 4}
    assert len(full) == 1 and (full["layers_run"] == 4).all() and (full["kind"] == "forward").all()


def _sweep_cmd(out_dir):
    return [sys.executable, "-m", "roofline.cli.sweep", "model=tiny", "q=[1,2,3,4,5,6]", "B=[1,2]", "L=[0,16,32]",
            "timer.min_reps=20", "timer.max_reps=20", "timer.budget_s=10", "progress=false", f"out_dir={out_dir}"]


@pytest.mark.slow
def test_resume_after_a_kill_loses_and_repeats_nothing(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(_sweep_cmd(out), cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    jsonl = out / "points.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not jsonl.exists() or len(jsonl.read_text().splitlines()) < 5):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = results.read_rows(jsonl)
    total = len(grid(sweep_request(q=(1, 2, 3, 4, 5, 6), B=(1, 2), L=(0, 16, 32))))
    assert 5 <= len(before) < total, "the kill must land mid-run"
    done = subprocess.run(_sweep_cmd(out), cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    after = results.read_rows(jsonl)
    ids = [r["point_id"] for r in after]
    assert len(ids) == len(set(ids)) == total
    assert summary["resumed"] == len(before) and summary["measured_now"] == total - len(before)
    kept = {r["point_id"]: r["t_median_s"] for r in after}
    assert all(kept[r["point_id"]] == r["t_median_s"] for r in before)


@pytest.mark.slow
def test_bad_input_exits_nonzero_naming_the_field(tmp_path):
    for arg, msg in (("q=[0]", "q=[0]"), ("model=nope", "model=nope: unknown; allowed ['cpu-demo'"),
                     ("timer.mode=turbo", "timer.mode"), ("L=[99999]", "max_context")):
        r = subprocess.run([sys.executable, "-m", "roofline.cli.sweep", "model=tiny", arg,
                            f"out_dir={tmp_path / 'x'}"], cwd=REPO_ROOT, capture_output=True, text=True)
        assert r.returncode != 0 and msg in r.stderr + r.stdout, (arg, r.stderr)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("launcher", ["basic", "submitit_local"])
@pytest.mark.slow
def test_multirun_aggregates_every_job_even_a_failed_one(tmp_path, launcher):
    sweep_dir = tmp_path / "mr"
    cmd = [sys.executable, "-m", "roofline.cli.sweep", "-m", f"hydra/launcher={launcher}", "model=tiny",
           "dtypes=[bfloat16],[float32]", "q=[1],[0]", "B=[1]", "L=[0]", "timer.min_reps=3",
           "timer.budget_s=0.05", "progress=false", f"hydra.sweep.dir={sweep_dir}",
           f"out_dir={tmp_path}/runs/${{hydra:job.num}}"]
    r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0, "a failed job makes the multirun exit non-zero"
    agg = pd.read_csv(sweep_dir / "aggregate.csv")
    assert set(agg["dtype"]) == {"bfloat16", "float32"}  # the two good jobs
    assert len(agg) == 4  # forward + mtp each
    summary = json.loads([l for l in r.stdout.splitlines() if l.startswith('{"aggregate"')][-1])
    assert summary["jobs"] == 4 and len(summary["jobs_failed"]) == 2


def test_ceiling_columns_give_measured_and_datasheet_percentages_side_by_side():
    from roofline.measure.devices import get_datasheet
    from roofline.measure.sweep import ceiling_columns
    measured = {"summary": {"mem_bw_GBps": 4000.0, "peak_tflops": {"bfloat16": 800.0}}}
    row = dict(achieved_GBps=3000.0, achieved_TFLOPs=10.0, intensity=3.0)
    c = ceiling_columns(row, "bfloat16", measured, get_datasheet("h200_sxm"))
    assert c["pct_measured_bw"] == pytest.approx(75.0)
    assert c["pct_datasheet_bw"] == pytest.approx(62.5)  # of 4800 GB/s
    assert c["pct_measured_flops"] == pytest.approx(1.25)
    assert c["ridge_measured"] == pytest.approx(200.0) and c["bound_measured"] == "memory"


def test_a_quick_ceilings_run_at_start_fills_the_ceiling_columns(tmp_path, monkeypatch):
    import roofline.measure.ceilings as ce
    fake = {"schema_version": 1, "summary": {"mem_bw_GBps": 10.0, "peak_tflops": {"bfloat16": 1.0}}}
    monkeypatch.setattr(ce, "measure_ceilings", lambda sweep_request: fake)
    written = []
    monkeypatch.setattr(ce, "write_ceilings", lambda result, run_dir: written.append(run_dir))
    run_sweep(sweep_request(ceilings="quick", q=(1,), B=(1,), L=(0,)), tmp_path, progress=False)
    df = pd.read_csv(tmp_path / "points.csv")
    assert written == [tmp_path]
    pd.testing.assert_series_equal(df["pct_measured_bw"], df["achieved_GBps"] * 10, check_names=False)


def test_a_compiled_row_says_whether_inductor_really_used_cuda_graphs():
    from roofline.measure.sweep import _used_cuda_graphs
    assert _used_cuda_graphs("compiled", "cpu", 0, 0) is None  # no CUDA graphs off CUDA: not claimed
    assert _used_cuda_graphs("graph", "cuda", 0, 0) is True
    assert _used_cuda_graphs("eager", "cuda", 0, 0) is False
    assert _used_cuda_graphs("compiled", "cuda", 3, 3) is True
    assert _used_cuda_graphs("compiled", "cuda", 3, 4) is False  # Inductor skipped cudagraphs meanwhile
