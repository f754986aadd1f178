"""Collectives: nccl-tests' bus-bandwidth factors, sizes, the latency + bytes/bandwidth fit."""

import numpy as np
import pytest

from roofline.io.fields import ConfigError
from roofline.parallel.collectives import CollectiveRequest, bus_factor, fit, seconds
from roofline.parallel.cost import Collective


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_bus_factors_are_nccl_tests_definitions(n):
    # doc/PERFORMANCE.md "Summary": AllReduce 2(n-1)/n; ReduceScatter, AllGather, AlltoAll (n-1)/n; Broadcast 1
    assert bus_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for kind in ("reduce_scatter", "all_gather", "all_to_all"):
        assert bus_factor(kind, n) == pytest.approx((n - 1) / n)
    assert bus_factor("broadcast", n) == 1.0


def test_bus_factor_rejects_unknown_collective():
    with pytest.raises(ConfigError, match="collective='gather'"):
        bus_factor("gather", 2)


def test_sizes_divide_over_ranks_and_span_the_range():
    s = CollectiveRequest(min_bytes=8, max_bytes=2**20, factor=4, world=4, dtype="float32").sizes()
    assert all(x % (4 * 4) == 0 for x in s)
    assert s[0] == 16 and 2**20 / 4 < s[-1] <= 2**20 and s == sorted(s)


def test_fit_recovers_latency_and_bandwidth():
    rng = np.random.default_rng(3)
    rows = []
    for S in [8 * 4**i for i in range(12)]:
        t = 20e-6 + S / 50e9
        rows.append(dict(kind="all_reduce", size_bytes=S, ranks=8, time_us=t * 1e6 * (1 + 0.01 * rng.standard_normal())))
    f = fit(rows)["all_reduce"]
    assert f["latency_us"] == pytest.approx(20, rel=0.05)
    assert f["algbw_GBps"] == pytest.approx(50, rel=0.05)
    assert f["busbw_GBps"] == pytest.approx(50 * 2 * 7 / 8, rel=0.05)


def test_seconds_sums_each_call():
    fitted = dict(all_reduce=dict(latency_us=10.0, algbw_GBps=100.0), broadcast=dict(latency_us=5.0, algbw_GBps=1.0))
    t = seconds([Collective("all_reduce", 1e6, 4), Collective("send_recv", 1e3, 1)], fitted)
    assert t == pytest.approx(4 * (10e-6 + 1e6 / 100e9) + 5e-6 + 1e3 / 1e9)
    with pytest.raises(ConfigError, match="no 'all_to_all'"):
        seconds([Collective("all_to_all", 1.0, 1)], fitted)


@pytest.mark.slow
def test_gloo_measurement_on_two_ranks(tmp_path):
    from roofline.parallel.collectives import run_collectives
    doc = run_collectives(CollectiveRequest(kinds=("all_reduce", "all_to_all"), max_bytes=4096, reps=2), tmp_path)
    assert {r["kind"] for r in doc["rows"]} == {"all_reduce", "all_to_all"}
    for r in doc["rows"]:
        assert r["time_us"] > 0 and r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * bus_factor(r["kind"], 2))
    assert (tmp_path / "collectives.json").exists() and (tmp_path / "collectives.csv").exists()


@pytest.mark.slow
def test_in_step_measurement_streams_a_buffer_before_each_timed_operation(tmp_path):
    """flush_bytes > 0: the rows and the document say so, and each operation is timed on its own
    (at most 10 per loop, each after the untimed flush)."""
    from roofline.parallel.collectives import run_collectives
    doc = run_collectives(CollectiveRequest(kinds=("all_reduce",), max_bytes=64, reps=2, flush_bytes=2**20), tmp_path)
    assert doc["spec"]["flush_bytes"] == 2**20
    assert all(r["flush_bytes"] == 2**20 and r["iters"] <= 10 and r["time_us"] > 0 for r in doc["rows"])


def test_a_negative_flush_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="flush_bytes"):
        CollectiveRequest(flush_bytes=-1)


@pytest.mark.gpu
def test_nccl_measurement_on_one_gpu_reduces_its_times_on_the_rank_device(tmp_path):
    """One rank under NCCL: every tensor a collective sees must be on the rank's CUDA device (the
    per-loop time that is max-reduced across ranks was a CPU tensor, which NCCL refuses)."""
    from roofline.parallel.collectives import run_collectives
    doc = run_collectives(CollectiveRequest(kinds=("all_reduce",), max_bytes=4096, reps=2, device="cuda", world=1),
                          tmp_path)
    assert doc["rows"] and all(r["time_us"] > 0 for r in doc["rows"])
