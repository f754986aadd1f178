"""Memory: the real peak in the model's dtype, the cgroup limit, a per-point check that refuses
before anything is allocated."""

import pandas as pd
import pytest

from roofline.measure import memory
from roofline.measure.sweep import SweepRequest, grid, run_sweep
from roofline.measure.timer import TimerSettings
from roofline.model.presets import get_preset

FAST = TimerSettings(warmup=1, min_reps=3, max_reps=4, budget_s=0.02)


def test_cgroup_v2_limit_is_read(tmp_path):
    (tmp_path / "memory.max").write_text("5000000000\n")
    (tmp_path / "memory.current").write_text("1000000000\n")
    cg = memory.cgroup_memory(tmp_path, tmp_path / "none")
    assert cg["limit"] == 5e9 and cg["usage"] == 1e9


def test_cgroup_v1_limit_is_read_and_unlimited_is_none(tmp_path):
    v1 = tmp_path / "memory"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text("2147483648\n")
    (v1 / "memory.usage_in_bytes").write_text("0\n")
    assert memory.cgroup_memory(tmp_path, tmp_path / "none")["limit"] == 2**31
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memory.cgroup_memory(tmp_path, tmp_path / "none") is None
    (tmp_path / "memory.max").write_text("max\n")
    assert memory.cgroup_memory(tmp_path, tmp_path / "none") is None


def test_the_process_cgroup_path_is_followed(tmp_path):
    sub = tmp_path / "user.slice" / "job"
    sub.mkdir(parents=True)
    (sub / "memory.max").write_text("3000000000\n")
    (sub / "memory.current").write_text("0\n")
    (tmp_path / "cgroup").write_text("0::/user.slice/job\n")
    assert memory.cgroup_memory(tmp_path, tmp_path / "cgroup")["limit"] == 3e9


def test_a_hybrid_v1_v2_host_finds_the_memory_controllers_limit(tmp_path):
    """H1: `/proc/self/cgroup` of a hybrid host lists `N:memory:/path` and then `0::/`; the unified
    line must not overwrite the memory controller's path (a 2 GiB job was SIGKILLed with no row)."""
    job = tmp_path / "memory" / "process_api" / "job"
    job.mkdir(parents=True)
    (job / "memory.limit_in_bytes").write_text(f"{2 * 2**30}\n")
    (job / "memory.usage_in_bytes").write_text(f"{2**28}\n")
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # the root: unlimited
    (tmp_path / "cgroup").write_text("12:cpu,cpuacct:/process_api/job\n4:memory:/process_api/job\n0::/\n")
    cg = memory.cgroup_memory(tmp_path, tmp_path / "cgroup")
    assert cg is not None and cg["limit"] == 2 * 2**30 and cg["usage"] == 2**28
    assert cg["source"].endswith("process_api/job/memory.limit_in_bytes")


def test_a_limit_on_a_parent_cgroup_binds(tmp_path):
    (tmp_path / "slice" / "job").mkdir(parents=True)
    (tmp_path / "slice" / "memory.max").write_text("1000000000\n")
    (tmp_path / "slice" / "job" / "memory.max").write_text("max\n")
    (tmp_path / "cgroup").write_text("0::/slice/job\n")
    assert memory.cgroup_memory(tmp_path, tmp_path / "cgroup")["limit"] == 1e9


def test_a_cgroup_below_host_memory_caps_what_the_cpu_can_give(monkeypatch):
    monkeypatch.setattr(memory, "cgroup_memory", lambda: dict(limit=5e9, usage=4e9, source="memory.max"))
    free, where = memory.available("cpu")
    assert free == pytest.approx(1e9) and "cgroup limit" in where


def test_an_under_limit_cgroup_refuses_before_allocation(monkeypatch):
    monkeypatch.setattr(memory, "cgroup_memory", lambda: dict(limit=5e9, usage=0.0, source="memory.max"))
    cfg = get_preset("llama-3.1-8b").scaled(layers=1)
    need = memory.peak_bytes(cfg, "bfloat16", 1, 1024)
    assert 5e9 * memory.HEADROOM < need.total < 9e9  # one layer of 8B in bf16: mostly the 1 GB vocabulary matrices
    with pytest.raises(memory.TooBig, match="cgroup limit"):
        memory.require_fit(get_preset("llama-3.1-8b").scaled(layers=8), "bfloat16", 1, 1024, "cpu")


def test_weights_are_counted_in_their_dtype():
    cfg = get_preset("cpu-demo")
    bf16, fp32 = (memory.resident_bytes(cfg, d, 1, 128) for d in ("bfloat16", "float32"))
    assert fp32.weights == pytest.approx(2 * bf16.weights)


def test_one_oversized_grid_value_is_too_big_alone(tmp_path, monkeypatch):
    cfg = get_preset("tiny")
    small = memory.peak_bytes(cfg, "bfloat16", 1, 8 + 2, 2)
    big = memory.peak_bytes(cfg, "bfloat16", 64, 8 + 2, 2)
    free = (small.total + big.total) / 2 / memory.HEADROOM
    monkeypatch.setattr(memory, "available", lambda device: (free, f"{free / 1e9:.4f} GB available"))
    s = SweepRequest(model=cfg, q=(1, 2), B=(1, 64), L=(8,), timer=FAST)
    run_sweep(s, tmp_path, progress=False)
    df = pd.read_csv(tmp_path / "points.csv")
    assert len(df) == len(grid(s))
    assert (df.loc[df["B"] == 64, "status"] == "too_big").all()
    assert (df.loc[df["B"] == 1, "status"] == "ok").all()
    assert df.loc[df["B"] == 64, "error"].str.contains("needs").all()


def test_specdec_checks_memory_before_anything(tmp_path, monkeypatch):
    from roofline.spec.validation import SpecValidationRequest, run_validation
    monkeypatch.setattr(memory, "available", lambda device: (1e3, "1 kB available"))
    req = SpecValidationRequest(model=get_preset("tiny"), alphas=(0.5,), ks=(1,), Bs=(1,), prompt_len=8, max_new=4, reps=1,
                       real_drafters=(), dtype="float32", device="cpu", seed=0, timer=FAST)
    with pytest.raises(memory.TooBig, match="tiny needs"):
        run_validation(req, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_dry_run_prints_grid_memory_and_time_and_writes_nothing(tmp_path, monkeypatch):
    from roofline.measure.sweep import dry_run
    cfg = get_preset("tiny")
    small = memory.peak_bytes(cfg, "bfloat16", 1, 8 + 2, 2)
    big = memory.peak_bytes(cfg, "bfloat16", 64, 8 + 2, 2)
    free = (small.total + big.total) / 2 / memory.HEADROOM
    monkeypatch.setattr(memory, "available", lambda device: (free, "test memory"))
    text = dry_run(SweepRequest(model=cfg, q=(1, 2), B=(1, 64), L=(8,), timer=FAST), tmp_path / "run")
    lines = text.splitlines()
    assert "nothing measured or written" in lines[0] and "q=[1, 2], B=[1, 64], L=[8]" in lines[1]
    assert "6 points" in lines[2] and "3 too big for test memory" in lines[2]  # forward q=1,2 and mtp q=1, at B=1, 64
    assert sum("TOO BIG" in l and "B64" in l for l in lines) == 3 and sum("fits (build 1)" in l for l in lines) == 3
    assert lines[-1].startswith("time: about ") and "for the 6 points to measure" in lines[-1]
    assert "1 warm-up passes" in lines[-1] and "timer.budget_s 0.02" in lines[-1]
    assert not (tmp_path / "run").exists()
