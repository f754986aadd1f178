"""A sweep notices a busy machine, re-measures what it can and marks what it cannot."""

import json
import os
import subprocess
import sys
import time

import pytest

from roofline.measure.noise import NoiseMonitor, NoiseSettings
from roofline.model.presets import get_preset

FAST = NoiseSettings(every=3, retries=2, settle_s=0.0)


class FakeReference:
    """Returns the scripted (seconds, CPU share) of each reference check in turn."""

    def __init__(self, script):
        self.script, self.calls = list(script), 0

    def __call__(self):
        self.calls += 1
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]


QUIET, SLOW, STARVED = (1.0, 1.0), (2.0, 1.0), (1.0, 0.4)


def row(i, cv=0.01):
    return dict(point_id=f"p{i}", status="ok", t_median_s=1.0, t_cv=cv)


def applied(written, fixes):
    """The rows as the readers see them: each written row with its corrections applied in order."""
    by_id = {r["point_id"]: dict(r) for r in written}
    for c in fixes:
        by_id[c["point_id"]].update(c["set"])
    return list(by_id.values())


def run(monitor, n, cv=0.01, again=None):
    written, fixes = [], []
    for i in range(n):
        written.append(row(i, cv))  # the sweep writes the row first; the monitor never holds it
        fixes += monitor.add(written[-1], again or (lambda i=i: {**row(i), "fresh": True}))
    return applied(written, fixes + monitor.flush())


def test_a_quiet_machine_passes_every_point_once_in_order():
    m = NoiseMonitor(FAST, reference=FakeReference([QUIET]), log=lambda _: None)
    out = run(m, 7)
    assert [r["point_id"] for r in out] == [f"p{i}" for i in range(7)]
    assert not any(r["noisy"] for r in out) and not any("fresh" in r for r in out)
    assert m.summary()["flagged"] == 0


def test_a_slow_reference_window_is_remeasured_once_the_machine_is_quiet_again():
    # start quiet; the first window's check is slow; the retry's check is quiet; the check after it too
    m = NoiseMonitor(FAST, reference=FakeReference([QUIET, SLOW, QUIET, QUIET]), log=lambda _: None)
    out = run(m, 3)
    assert all(r["fresh"] and r["remeasured"] == 1 and not r["noisy"] for r in out)
    assert m.summary()["flagged"] == 3 and m.summary()["remeasured"] == 3


@pytest.mark.parametrize("busy", [SLOW, STARVED], ids=["slow", "starved-of-cpu"])
def test_a_machine_that_stays_busy_gets_its_points_marked_with_the_reason(busy):
    logs = []
    m = NoiseMonitor(FAST, reference=FakeReference([QUIET, busy]), log=logs.append)
    out = run(m, 3)
    assert all(r["noisy"] for r in out)
    assert "reference" in out[0]["noise_reason"]
    assert m.finish()["noisy"] == 3 and any("WARNING" in s for s in logs)


def test_a_whole_run_on_a_busy_machine_is_caught_by_the_cpu_share():
    """The reference never looks slower than itself (busy from the start): the CPU share still says so."""
    m = NoiseMonitor(FAST, reference=FakeReference([STARVED]), log=lambda _: None)
    assert all(r["noisy"] for r in run(m, 3))


def test_a_spread_point_is_remeasured_and_kept_when_the_remeasurement_is_tight():
    m = NoiseMonitor(FAST, reference=FakeReference([QUIET]), log=lambda _: None)
    out = run(m, 3, cv=0.6)
    assert all(r["fresh"] and not r["noisy"] for r in out)
    m = NoiseMonitor(FAST, reference=FakeReference([QUIET]), log=lambda _: None)
    out = run(m, 3, cv=0.6, again=lambda: row(0, cv=0.6))
    assert all(r["noisy"] and r["noise_reason"].startswith("CV") for r in out)


def test_failed_points_are_never_flagged():
    m = NoiseMonitor(FAST, reference=FakeReference([QUIET, SLOW]), log=lambda _: None)
    out = m.add(dict(point_id="x", status="oom", t_cv=None)) + m.flush()
    assert out[0]["set"]["noisy"] is False


def test_the_monitor_returns_verdicts_not_rows_and_a_window_is_judged_every_n_points():
    """add() never returns (or keeps) a row to be written later: until the window is full it
    returns nothing, then one correction per point of the window, with the verdict fields."""
    m = NoiseMonitor(FAST, reference=FakeReference([QUIET]), log=lambda _: None)
    assert m.add(row(0)) == [] and m.add(row(1)) == []
    fixes = m.add(row(2))
    assert [c["point_id"] for c in fixes] == ["p0", "p1", "p2"]
    assert all(set(c["set"]) == {"noisy", "noise_reason", "ref_drift", "ref_cpu_share"} for c in fixes)
    assert m.flush() == []


def test_a_remeasurement_that_fails_keeps_the_first_measurement_and_marks_it():
    m = NoiseMonitor(FAST, reference=FakeReference([QUIET, SLOW, QUIET, QUIET]), log=lambda _: None)

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access")
    fixes = m.add(row(0), broken) + m.flush()
    assert fixes[0]["set"]["noisy"] is True and "t_median_s" not in fixes[0]["set"]


def _busy_loop():
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


@pytest.mark.slow
def test_a_sweep_beside_busy_loops_is_flagged(tmp_path):
    """Busy loops on every core while a small sweep runs: the run must say so (noise.json, the
    console, the rows). No timing tolerance: only that the busy machine was noticed."""
    from roofline.measure.sweep import SweepRequest, run_sweep
    from roofline.measure.timer import TimerSettings
    loops = [_busy_loop() for _ in range(os.cpu_count() or 2)]
    try:
        time.sleep(0.5)
        req = SweepRequest(model=get_preset("tiny"), q=(1, 4), B=(1,), L=(16, 64), timer=TimerSettings(
            warmup=1, min_reps=3, max_reps=5, budget_s=0.05))
        summary = run_sweep(req, tmp_path, progress=False,
                            noise=NoiseSettings(every=2, retries=1, settle_s=0.1))
    finally:
        for p in loops:
            p.kill()
            p.wait()
    noise = json.loads((tmp_path / "noise.json").read_text())
    assert noise["busy_checks"] >= 1 and noise["flagged"] >= 1
    assert summary["noisy"] >= 1


def test_a_machine_that_stays_busy_is_not_retried_window_after_window():
    ref = FakeReference([QUIET, SLOW])
    m = NoiseMonitor(FAST, reference=ref, log=lambda _: None)
    run(m, 12)  # four windows, all busy
    # windows 1-2: one check + two retry checks each; windows 3-4: one check each (plus the start)
    assert ref.calls == 1 + 3 + 3 + 1 + 1
    assert m.summary()["noisy"] == 12


def test_a_point_starved_of_cpu_between_quiet_references_is_caught_by_its_own_share():
    """A competitor that ran for the whole of one point and was gone by the next reference: the
    point's repetitions agree (low CV) and every reference is quiet, but its threads got half
    their CPU time. It is re-measured; the fresh row, with its full share, is kept unmarked."""
    m = NoiseMonitor(FAST, reference=FakeReference([QUIET]), log=lambda _: None)
    rows = [dict(row(0), t_cpu_share=0.93), dict(row(1), t_cpu_share=0.45), dict(row(2), t_cpu_share=0.91)]
    fixes = []
    for i, r in enumerate(rows):
        fixes += m.add(r, lambda i=i: {**row(i), "t_cpu_share": 0.92, "fresh": True})
    out = applied(rows, fixes + m.flush())
    assert [("fresh" in r, r["noisy"]) for r in out] == [(False, False), (True, False), (False, False)]
    assert m.summary()["flagged"] == 1


def test_a_point_that_stays_starved_is_marked_with_its_share():
    m = NoiseMonitor(FAST, reference=FakeReference([QUIET]), log=lambda _: None)
    starved = lambda: {**row(0), "t_cpu_share": 0.5}  # noqa: E731
    first = starved()
    out = applied([first], m.add(first, starved) + m.flush())
    assert out[0]["noisy"] and "50% of their CPU time" in out[0]["noise_reason"]


def test_the_timer_reports_the_cpu_share_its_threads_got():
    import torch
    from roofline.measure.timer import TimerSettings, time_fn
    x = torch.ones(256, 256)
    r = time_fn(lambda: x @ x, TimerSettings(warmup=1, min_reps=3, max_reps=3, threads=1), "cpu")
    # CPU time / (wall x threads): finite and positive on a CPU; it may exceed 1 when other threads
    # of the process run meanwhile (an OpenMP pool still spinning from an earlier op), never NaN
    assert r.cpu_share == r.cpu_share and r.cpu_share > 0.0
    assert r.to_row()["t_cpu_share"] == r.cpu_share


def test_the_cpu_reference_keeps_its_size_and_reports_its_cpu_share():
    from roofline.measure.noise import Reference, reference_bytes
    assert reference_bytes("cpu", 48 * 2**20) == 48 * 2**20
    ref = Reference("cpu", 2**20, 2)
    seconds, share = ref()
    assert seconds > 0 and share > 0


@pytest.mark.gpu
def test_the_cuda_reference_reads_past_the_l2_and_is_timed_on_the_device():
    """On a GPU the reference buffer is at least 4x the L2 the driver reports (48 MiB fits in an
    H200's 60 MiB L2) and its time comes from CUDA events; the CPU share does not apply (1.0)."""
    import torch
    from roofline.measure.noise import CUDA_L2_MULTIPLE, Reference
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    ref = Reference("cuda", 48 * 2**20, 3)
    assert ref.nbytes >= CUDA_L2_MULTIPLE * l2 and ref.buf.is_cuda
    seconds, share = ref()
    assert share == 1.0 and ref.nbytes / seconds / 1e9 > 100  # an HBM read, not a host round trip


@pytest.mark.parametrize("field, value", [("every", 0), ("retries", -1), ("max_cv", -1.0), ("max_cv", 0),
                                          ("min_cpu_share", 2), ("every", 2.5), ("every", True),
                                          ("settle_s", float("nan")), ("ref_reps", 0)])
def test_noise_settings_refuse_values_that_would_run_without_meaning(field, value):
    """N11: noise.every=0, retries=-1, max_cv=-1, min_cpu_share=2 used to run without a word."""
    from roofline.io.fields import ConfigError
    with pytest.raises(ConfigError, match=rf"noise\.{field}="):
        NoiseSettings(**{field: value})


def test_noise_settings_defaults_and_edges_are_accepted():
    NoiseSettings()
    NoiseSettings(every=1, retries=0, give_up=0, min_cpu_share=1.0, settle_s=0.0)


def test_a_dry_run_checks_the_noise_settings_too():
    """N11's reproduction was a dry run: it exited 0 with noise.every=0."""
    p = subprocess.run([sys.executable, "-m", "roofline.cli.sweep", "model=tiny", "q=[1]", "B=[1]", "L=[16]",
                        "noise.every=0", "dry_run=true"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "noise.every=0" in p.stderr, p.stderr[-500:]
