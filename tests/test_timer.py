"""The timing primitive: statistics, stopping rules, settings, flush and threads on the CPU;
CUDA events and graph replay on a GPU (marked `gpu`, skipped without CUDA)."""

from __future__ import annotations

import math
import random
import time

import pytest
import torch

from roofline.measure import timer as timing
from roofline.measure.timer import (
    CacheFlusher,
    CpuClock,
    TimerSettings,
    TimingError,
    TimingResult,
    make_clock,
    median_ci,
    run_reps,
    set_threads,
    summarize,
    time_fn,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class ScriptedClock:
    """A fake clock: calls fn, returns the next scripted duration, and advances a fake wall."""

    name = "scripted"

    def __init__(self, durations: list[float]) -> None:
        self.durations = durations
        self.calls = 0
        self.now = 0.0

    def measure(self, fn=lambda: None) -> float:
        fn()
        t = self.durations[self.calls % len(self.durations)]
        self.calls += 1
        self.now += t
        return t

    def sync(self) -> None:
        pass

    def wall(self) -> float:
        return self.now


# ----------------------------------------------------------------------- real CPU clock


def test_busy_wait_of_1ms_is_timed_in_seconds_between_two_bounds():
    """No tolerance on this machine's speed: the busy-wait cannot end early (lower bound), and
    the timed samples cannot add up to more than the wall time around the whole call (upper
    bound, whatever else runs on the machine); a unit error breaks one of the two."""
    s = TimerSettings(warmup=2, min_reps=15, max_reps=60, rel_ci=0.05, budget_s=1.0)
    t0 = time.perf_counter()
    r = time_fn(lambda: busy_wait(1e-3), s)
    outer = time.perf_counter() - t0
    assert r.min_s >= 1e-3
    assert sum(r.samples_s) <= outer
    assert r.p10_s <= r.median_s <= r.p90_s
    assert r.clock == "cpu_perf_counter_ns"


def test_warmup_calls_are_not_recorded():
    calls = 0

    def fn() -> None:
        nonlocal calls
        calls += 1

    s = TimerSettings(warmup=4, min_reps=7, max_reps=7)
    r = time_fn(lambda: (fn(), busy_wait(1e-5)), s)
    assert r.n == 7 and len(r.samples_s) == 7
    assert calls == 4 + 7


def test_cold_flush_happens_outside_the_timed_region():
    # Rewriting 128 MiB takes about 4 ms here (DRAM-bound); a 0.5 ms workload must not see it.
    s = TimerSettings(warmup=1, min_reps=5, max_reps=5, l2="cold", l2_bytes=64 * 2**20)
    r = time_fn(lambda: busy_wait(0.5e-3), s)
    assert r.median_s < 1.0e-3
    assert r.l2 == "cold" and r.flush_bytes >= 2 * 64 * 2**20


def test_graph_mode_on_cpu_raises_before_calling_fn():
    called = []
    with pytest.raises(ValueError, match=r"timer\.mode='graph'.*CUDA.*allowed \('eager',\)"):
        time_fn(lambda: called.append(1), TimerSettings(mode="graph"), "cpu")
    assert called == []


def test_unsupported_device_raises_naming_allowed_types():
    with pytest.raises(ValueError, match=r"device='meta': allowed 'cpu', 'cuda', 'cuda:N'"):
        make_clock("meta", TimerSettings())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_cuda_device_without_cuda_raises():
    with pytest.raises(ValueError, match=r"device='cuda': CUDA is not available"):
        time_fn(lambda: None, TimerSettings(), "cuda")


def test_cpu_clock_measures_one_call_in_seconds():
    t0 = time.perf_counter()
    t = CpuClock().measure(lambda: busy_wait(3e-3))
    assert 3e-3 <= t <= time.perf_counter() - t0  # never early, never longer than the wall time around it


# ----------------------------------------------------------------------- stopping rules


def test_constant_durations_stop_at_min_reps_by_rel_ci():
    clock = ScriptedClock([1e-3])
    s = TimerSettings(warmup=2, min_reps=6, max_reps=100)
    r = time_fn(lambda: None, s, clock=clock)
    assert (r.n, r.stopped_by, r.ci_rel) == (6, "rel_ci", 0.0)
    assert clock.calls == 6
    assert r.clock == "scripted"


def test_noisy_durations_stop_at_max_reps():
    clock = ScriptedClock([1e-3, 3e-3])  # the median's CI never narrows below 2%
    s = TimerSettings(min_reps=5, max_reps=40, budget_s=1e6)
    reps = run_reps(clock.measure, s, wall=clock.wall)
    assert (len(reps.samples), reps.stopped_by) == (40, "max_reps")


def test_noisy_durations_stop_at_budget():
    clock = ScriptedClock([1e-3, 3e-3])  # cumulative wall: 1, 4, 5, 8, ..., 20 (n=10), 21 ms
    s = TimerSettings(min_reps=5, max_reps=1000, budget_s=20.5e-3)
    reps = run_reps(clock.measure, s, wall=clock.wall)
    assert (len(reps.samples), reps.stopped_by) == (11, "budget")
    assert reps.total_s == pytest.approx(21e-3, rel=1e-9)


def test_budget_never_stops_before_min_reps():
    clock = ScriptedClock([1e-3, 3e-3])
    s = TimerSettings(min_reps=8, max_reps=1000, budget_s=1e-9)
    reps = run_reps(clock.measure, s, wall=clock.wall)
    assert (len(reps.samples), reps.stopped_by) == (8, "budget")


def test_noise_that_settles_stops_by_rel_ci_after_min_reps():
    # 4 outliers then a tight cluster: the order-statistic CI excludes the outliers at some n.
    clock = ScriptedClock([5e-3] * 2 + [1e-3] * 2 + [2e-3] * 500)
    s = TimerSettings(min_reps=5, max_reps=500, budget_s=1e6, rel_ci=0.02)
    reps = run_reps(clock.measure, s, wall=clock.wall)
    assert reps.stopped_by == "rel_ci"
    assert 5 < len(reps.samples) < 30


@pytest.mark.parametrize("bad", [0.0, -1e-6, math.nan, math.inf])
def test_non_positive_or_non_finite_duration_raises(bad):
    clock = ScriptedClock([1e-3, 1e-3, bad])
    with pytest.raises(TimingError, match=r"rep 2: measured"):
        run_reps(clock.measure, TimerSettings(min_reps=5, max_reps=10), wall=clock.wall)


def test_zero_from_a_clock_raises_through_time_fn():
    with pytest.raises(TimingError, match="<= 0"):
        time_fn(lambda: None, TimerSettings(), clock=ScriptedClock([0.0]))


# ----------------------------------------------------------------------- statistics


def test_summarize_known_samples_exactly():
    samples = [float(x) for x in range(1, 12)]  # 1..11, shuffled below
    random.Random(0).shuffle(samples)
    st = summarize(samples)
    assert (st.median_s, st.p10_s, st.p90_s) == (6.0, 2.0, 10.0)
    assert (st.min_s, st.mean_s, st.n) == (1.0, 6.0, 11)
    # sample std (ddof=1) of 1..11 is sqrt(11)
    assert st.cv == pytest.approx(math.sqrt(11.0) / 6.0, rel=1e-12)


def test_percentiles_interpolate_between_order_statistics():
    st = summarize([1.0, 2.0, 3.0, 4.0])  # numpy 'linear': position (n-1)p
    assert (st.p10_s, st.median_s, st.p90_s) == pytest.approx((1.3, 2.5, 3.7), rel=1e-12)


@pytest.mark.parametrize("n, ranks", [(10, (2, 9)), (20, (6, 15)), (100, (40, 61))])
def test_median_ci_uses_binomial_order_statistic_ranks(n, ranks):
    # Reference ranks from published binomial tables of the 95% median CI.
    samples = [float(i) for i in range(1, n + 1)]
    random.Random(n).shuffle(samples)
    assert median_ci(samples) == (float(ranks[0]), float(ranks[1]))


def test_median_ci_below_six_samples_is_the_full_range():
    assert median_ci([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0)


def test_median_ci_covers_the_true_median_at_about_95_percent():
    rng = random.Random(1)
    n, trials = 30, 2000
    hits = 0
    for _ in range(trials):
        xs = [rng.expovariate(1.0) for _ in range(n)]  # skewed, true median ln 2
        lo, hi = median_ci(xs)
        hits += lo <= math.log(2.0) <= hi
    # exact coverage for n=30 is 0.957; 4 binomial standard errors is about 0.018
    assert 0.935 <= hits / trials <= 0.98


# ----------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mode="x"), r"timer\.mode='x': allowed \('eager', 'graph', 'compiled'\)"),
        (dict(l2="hot"), r"timer\.l2='hot': allowed \('warm', 'cold'\)"),
        (dict(warmup=-1), r"timer\.warmup=-1: allowed integers >= 0"),
        (dict(min_reps=1), r"timer\.min_reps=1: allowed integers >= 2"),
        (dict(min_reps=10, max_reps=5), r"timer\.max_reps=5: allowed integers >= min_reps=10"),
        (dict(rel_ci=0.0), r"timer\.rel_ci=0\.0: allowed finite numbers > 0"),
        (dict(budget_s=math.inf), r"timer\.budget_s=inf: allowed finite numbers > 0"),
        (dict(l2_bytes=-1), r"timer\.l2_bytes=-1: allowed integers >= 0"),
        (dict(threads=2.5), r"timer\.threads=2\.5: allowed 0 \(torch.s default\) to \d+"),
    ],
)
def test_bad_settings_raise_naming_field_and_allowed_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TimerSettings(**kwargs)


# ----------------------------------------------------------------------- flush, threads, rows


def test_cold_flusher_rewrites_at_least_twice_l2_bytes():
    l2_bytes = 3 * 2**20 + 5
    f = CacheFlusher("cold", l2_bytes)
    f.flush()
    f.flush()
    assert f.nbytes >= 2 * l2_bytes
    assert f.flushes == 2
    assert bool((f.buffer == 2).all())  # every element was read and written by each flush


def test_warm_flusher_allocates_and_does_nothing():
    f = CacheFlusher("warm", 64 * 2**20)
    f.flush()
    assert (f.buffer, f.nbytes, f.flushes) == (None, 0, 0)


def test_threads_are_set_during_the_call_and_restored_after():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        s = TimerSettings(threads=1, min_reps=3, max_reps=3)
        r = time_fn(lambda: seen.append(torch.get_num_threads()), s, clock=ScriptedClock([1e-3]))
        assert set(seen) == {1} and r.threads == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_set_threads_restores_after_an_exception():
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    with pytest.raises(RuntimeError, match="boom"):
        with set_threads(target) as used:
            assert used == torch.get_num_threads() == target
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def test_to_row_flattens_scalars_with_prefix_and_leaves_samples_out():
    clock = ScriptedClock([1e-3, 2e-3, 3e-3])
    r = time_fn(lambda: None, TimerSettings(min_reps=3, max_reps=3), clock=clock)
    row = r.to_row()
    assert set(row) == {
        "t_median_s", "t_p10_s", "t_p90_s", "t_mean_s", "t_min_s", "t_cv", "t_n", "t_ci_rel",
        "t_total_s", "t_stopped_by", "t_clock", "t_mode", "t_l2", "t_flush_bytes", "t_threads", "t_cpu_share",
    }
    assert row["t_median_s"] == 2e-3 and row["t_stopped_by"] == "max_reps"
    assert set(r.to_row(prefix="step_")) == {"step_" + k[2:] for k in row}
    assert isinstance(r, TimingResult)


# ----------------------------------------------------------------------- GPU


@pytest.mark.gpu
@needs_cuda
def test_cuda_events_time_a_copy_at_a_plausible_bandwidth():
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    r = time_fn(lambda: y.copy_(x), TimerSettings(min_reps=10, max_reps=50), "cuda")
    gbps = 2 * x.numel() / r.median_s / 1e9  # read + write
    assert r.clock == "cuda_events"
    assert 50 < gbps < 10_000  # a unit error (ms vs s) would be off by 1000x


@pytest.mark.gpu
@needs_cuda
def test_graph_mode_replays_the_captured_work_once_per_call():
    counter = torch.zeros(1, device="cuda")
    s = TimerSettings(warmup=2, min_reps=5, max_reps=5, mode="graph")
    r = time_fn(lambda: counter.add_(1), s, "cuda")
    torch.cuda.synchronize()
    # side-stream warm-up (2) + untimed replays (2) + timed replays (5); capture runs nothing
    assert counter.item() == 2 + 2 + 5
    assert (r.mode, r.n) == ("graph", 5)


@pytest.mark.gpu
@needs_cuda
def test_cold_l2_on_cuda_sizes_the_flush_from_the_device():
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    x = torch.empty(2**20, device="cuda")
    r = time_fn(lambda: x.mul_(1.0), TimerSettings(l2="cold", min_reps=5, max_reps=20), "cuda")
    assert r.flush_bytes >= 2 * getattr(props, "L2_cache_size", 1)


# --------------------------------------------------------------------------- compiled mode


def _dynamo_only(fn, device):
    """torch.compile without Inductor (no C++ toolchain, seconds): the timer's compiled-mode logic."""
    return timing.compile_fn(fn, torch.device(device), backend="eager")


def test_compiled_mode_warms_up_then_probes_the_compiled_callable_once():
    x = torch.randn(64)
    calls, probed = [], []
    settings = timing.TimerSettings(mode="compiled", warmup=1, min_reps=3, max_reps=3, budget_s=5.0)

    def fn():
        calls.append(1)  # runs while dynamo traces; the compiled graph does not call back into Python
        return x * 2 + 1

    r = timing.time_fn(fn, settings, "cpu", compiler=_dynamo_only,
                       probe=lambda target: probed.append(target) or {"seen": float(target()[0])})
    assert r.mode == "compiled" and r.n == 3 and len(probed) == 1
    assert r.probe == {"seen": float(x[0] * 2 + 1)}
    assert "probe" not in r.to_row()


def test_compiled_mode_reports_a_graph_break_as_unsupported():
    x = torch.randn(8)

    def breaks():
        torch._dynamo.graph_break()
        return x + 1

    with pytest.raises(timing.CompileUnsupported, match="torch.compile failed"):
        timing.time_fn(breaks, timing.TimerSettings(mode="compiled", min_reps=2), "cpu", compiler=_dynamo_only)


def test_compiled_mode_without_a_cxx_compiler_is_unsupported_before_any_call(monkeypatch):
    import shutil
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    called = []
    with pytest.raises(timing.CompileUnsupported, match="C\\+\\+ compiler"):
        timing.time_fn(lambda: called.append(1), timing.TimerSettings(mode="compiled", min_reps=2), "cpu")
    assert called == []


@pytest.mark.slow
def test_compiled_mode_with_inductor_on_the_cpu_matches_eager():
    if timing._cxx_compiler() is None:
        pytest.skip("no C++ compiler for Inductor")
    x = torch.randn(4096)
    out = {}
    settings = timing.TimerSettings(mode="compiled", warmup=1, min_reps=2, max_reps=2, budget_s=5.0)
    timing.time_fn(lambda: torch.nn.functional.silu(x) * x, settings, "cpu",
                   probe=lambda target: out.setdefault("y", target()))
    torch.testing.assert_close(out["y"], torch.nn.functional.silu(x) * x)


def test_more_threads_than_cores_is_refused():
    """N17: timer.threads=100000 was accepted."""
    import os
    from roofline.io.fields import ConfigError
    from roofline.measure.timer import TimerSettings
    with pytest.raises(ConfigError, match=r"timer\.threads=100000: allowed 0 .* to \d+"):
        TimerSettings(threads=100000)
    TimerSettings(threads=os.cpu_count() or 1)
