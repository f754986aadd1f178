"""Telemetry: NVML snapshots decoded correctly (through a fake pynvml), CPU twin, blocks."""

from __future__ import annotations

import sys
import types
from collections import namedtuple

import pytest

from roofline.measure import telemetry
from roofline.measure.telemetry import THROTTLE_BITS, Telemetry, decode_reasons, is_throttled, snapshot


class NVMLError(Exception):
    pass


def fake_nvml(reasons: int = THROTTLE_BITS["gpu_idle"], legacy: bool = False,
              power_unsupported: bool = False, init_fails: bool = False) -> types.ModuleType:
    """A stand-in for pynvml with the calls telemetry makes; counts init/shutdown."""
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 1, 2, 0
    m.state = {"reasons": reasons, "init": 0, "shutdown": 0}

    def init():
        if init_fails:
            raise NVMLError("Driver Not Loaded")
        m.state["init"] += 1

    def power(h):
        if power_unsupported:
            raise NVMLError("Not Supported")
        return 512_345  # mW

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.state.__setitem__("shutdown", m.state["shutdown"] + 1)
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    m.nvmlDeviceGetClockInfo = lambda h, kind: {1: 1980, 2: 2619}[kind]
    m.nvmlDeviceGetPowerUsage = power
    m.nvmlDeviceGetTemperature = lambda h, sensor: 61
    reasons_fn = lambda h: m.state["reasons"]  # noqa: E731
    if legacy:
        m.nvmlDeviceGetCurrentClocksThrottleReasons = reasons_fn
    else:
        m.nvmlDeviceGetCurrentClocksEventReasons = reasons_fn
    return m


@pytest.fixture
def nvml(monkeypatch):
    def install(**kw):
        m = fake_nvml(**kw)
        monkeypatch.setitem(sys.modules, "pynvml", m)
        return m
    return install


def test_snapshot_reads_clocks_power_temperature(nvml):
    nvml()
    s = snapshot(0)
    assert s["available"] is True
    assert (s["sm_clock_mhz"], s["mem_clock_mhz"], s["temperature_c"]) == (1980, 2619, 61)
    assert s["power_w"] == pytest.approx(512.345, abs=1e-9)


def test_power_cap_is_throttled_and_decoded(nvml):
    nvml(reasons=THROTTLE_BITS["sw_power_cap"] | THROTTLE_BITS["hw_thermal_slowdown"])
    s = snapshot(0)
    assert s["throttle_reasons"] == {"bitmask": 0x44, "names": ["sw_power_cap", "hw_thermal_slowdown"]}
    assert s["throttled"] is True


@pytest.mark.parametrize("reason", ["gpu_idle", "applications_clocks_setting", "sync_boost",
                                    "display_clock_setting"])
def test_benign_reasons_are_not_throttling(nvml, reason):
    nvml(reasons=THROTTLE_BITS[reason])
    assert snapshot(0)["throttled"] is False


@pytest.mark.parametrize("reason", ["sw_power_cap", "hw_slowdown", "sw_thermal_slowdown",
                                    "hw_thermal_slowdown", "hw_power_brake_slowdown"])
def test_each_slowdown_reason_is_throttling(reason):
    assert is_throttled(THROTTLE_BITS[reason] | THROTTLE_BITS["gpu_idle"])


def test_unknown_bits_are_kept_as_hex():
    assert decode_reasons(0x1 | 0x1000) == ["gpu_idle", "0x1000"]


def test_older_binding_throttle_reasons_call_is_used(nvml):
    nvml(reasons=THROTTLE_BITS["hw_slowdown"], legacy=True)
    assert snapshot(0)["throttle_reasons"]["names"] == ["hw_slowdown"]


def test_unsupported_field_is_none_and_the_rest_is_read(nvml):
    nvml(power_unsupported=True)
    s = snapshot(0)
    assert s["power_w"] is None and s["sm_clock_mhz"] == 1980


def test_nvml_is_initialised_once_and_shut_down_once(nvml):
    m = nvml()
    for _ in range(3):
        snapshot(0)
    tel = Telemetry("cpu")
    tel.index = 0  # as on a GPU: each block takes two snapshots
    with tel.block("a"):
        pass
    assert m.state["init"] == 1 and m.state["shutdown"] == 0
    telemetry.shutdown()
    telemetry.shutdown()
    assert m.state["shutdown"] == 1
    snapshot(0)  # a later use initialises again
    assert m.state["init"] == 2
    telemetry.shutdown()


def test_failed_init_is_remembered_not_retried_per_snapshot(nvml):
    m = nvml(init_fails=True)
    calls = []
    m.nvmlInit = lambda: calls.append(1) or (_ for _ in ()).throw(NVMLError("Driver Not Loaded"))
    assert snapshot(0)["available"] is False and snapshot(0)["available"] is False
    assert calls == [1]


def test_failed_init_is_unavailable_not_an_error(nvml):
    nvml(init_fails=True)
    s = snapshot(0)
    assert s["available"] is False and "Driver Not Loaded" in s["reason"]


def test_without_pynvml_telemetry_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    s = snapshot(0)
    assert s["available"] is False and "nvidia-ml-py" in s["reason"]
    assert not telemetry.nvml_available()


def test_cpu_snapshot_records_the_cpu_frequency(monkeypatch):
    psutil = pytest.importorskip("psutil")
    freq = namedtuple("scpufreq", "current min max")
    monkeypatch.setattr(psutil, "cpu_freq", lambda: freq(2345.0, 0.0, 0.0))
    assert snapshot(None) == {"available": False, "reason": "cpu", "cpu_freq_mhz": 2345.0}


def test_cpu_frequency_unreadable_is_none(monkeypatch):
    psutil = pytest.importorskip("psutil")
    monkeypatch.setattr(psutil, "cpu_freq", lambda: None)
    assert snapshot(None)["cpu_freq_mhz"] is None


def test_cpu_block_records_before_and_after_unavailable():
    tel = Telemetry("cpu")
    with tel.block("work"):
        pass
    (r,) = tel.records
    assert r["block"] == "work" and r["wall_s"] >= 0
    assert r["before"]["available"] is False and r["after"]["available"] is False
    assert r["throttled"] is None and tel.throttled is None


def test_block_flags_throttling_that_starts_inside_it(nvml):
    m = nvml(reasons=THROTTLE_BITS["gpu_idle"])
    tel = Telemetry("cuda:0")  # no CUDA here: the NVML index falls back to 0
    with tel.block("calm"):
        pass
    with tel.block("hot"):
        m.state["reasons"] = THROTTLE_BITS["sw_power_cap"]
    calm, hot = tel.records
    assert calm["throttled"] is False
    assert hot["before"]["throttled"] is False and hot["after"]["throttled"] is True
    assert hot["throttled"] is True and tel.throttled is True


def test_block_is_recorded_when_the_body_raises(nvml):
    nvml()
    tel = Telemetry("cuda:0")
    with pytest.raises(RuntimeError):
        with tel.block("boom"):
            raise RuntimeError("oom")
    assert [r["block"] for r in tel.records] == ["boom"] and "after" in tel.records[0]


def test_energy_per_token_is_na_on_the_cpu_and_fn_is_not_called():
    calls = []
    assert telemetry.energy_per_token(lambda: calls.append(1), None, 4) == "n/a (no NVML on cpu)"
    assert calls == []


def test_energy_per_token_from_a_fake_counter():
    """Counter 1000 mJ before the calls, 7000 mJ after: 6 J over the calls' B·q tokens. The
    device is synchronised before the first reading and after every call (a graph replay
    returns before it has run: the clock must see finished steps)."""
    readings = iter([1000.0, 1000.0, 7000.0])
    calls, syncs = [], []
    e = telemetry.energy_per_token(lambda: calls.append(1), 0, 5, sync=lambda: syncs.append(len(calls)),
                                   counter=lambda i: (next(readings), None), clock=lambda: 0.1 * len(calls),
                                   min_s=0.45)
    assert len(calls) == 5  # 3 calls are not yet 0.45 s: it runs on to the 5th
    assert syncs == [0, 1, 2, 3, 4, 5]
    assert e == pytest.approx(6.0 / (5 * 5))


def test_energy_pass_stops_at_its_time_bound_however_slow_the_step():
    readings = iter([0.0, 0.0, 9000.0])
    calls = []
    e = telemetry.energy_per_token(lambda: calls.append(1), 0, 2, counter=lambda i: (next(readings), None),
                                   clock=lambda: 10.0 * len(calls), max_s=5.0)
    assert len(calls) == 1 and e == pytest.approx(9.0 / 2)  # one 10 s step, not ENERGY_MIN_CALLS of them


def test_nvml_handle_is_found_by_uuid_not_by_the_cuda_index(nvml):
    """Under CUDA_VISIBLE_DEVICES=3 the process's cuda:0 is NVML's GPU 3: the handle comes from
    the UUID torch reports, and provenance reads that GPU's clocks."""
    m = nvml()
    by_uuid = {}
    m.nvmlDeviceGetHandleByUUID = lambda u: by_uuid.setdefault(u if isinstance(u, str) else u.decode(), "h3")
    m.nvmlDeviceGetIndex = lambda h: 3 if h == "h3" else 0
    lib, h = telemetry.nvml_handle("cuda:0", uuid_of=lambda i: "GPU-abc" if i == 0 else "GPU-other")
    assert h == "h3" and list(by_uuid) == ["GPU-abc"] and lib.nvmlDeviceGetIndex(h) == 3


def test_energy_counter_that_does_not_advance_is_na_not_zero():
    e = telemetry.energy_per_token(lambda: None, 0, 5, counter=lambda i: (42.0, None), min_s=0.0)
    assert isinstance(e, str) and e.startswith("n/a (the energy counter did not advance over 3 calls")


def test_energy_counter_through_a_fake_nvml(nvml):
    m = nvml()
    assert telemetry.energy_counter_mj(0) == (None, "NVML reports no energy counter on this device")
    m.nvmlDeviceGetTotalEnergyConsumption = lambda h: 123_456
    assert telemetry.energy_counter_mj(0) == (123456.0, None)
    assert telemetry.energy_counter_mj(None) == (None, "no NVML on cpu")


def test_provenance_reads_the_clocks_of_the_gpu_found_by_uuid_through_the_one_nvml_session(nvml, monkeypatch):
    """provenance asks telemetry for the handle (UUID-mapped, NVML initialised once per process),
    so its clocks and power limit are of the GPU the sweep runs on, and nvmlInit runs once."""
    from roofline.measure import provenance
    m = nvml()
    m.nvmlSystemGetDriverVersion = lambda: b"580.159.04"
    m.nvmlDeviceGetHandleByUUID = lambda u: "h3"
    m.nvmlDeviceGetIndex = lambda h: 3 if h == "h3" else 0
    m.nvmlDeviceGetClockInfo = lambda h, kind: {1: 1980, 2: 3201}[kind] if h == "h3" else 0
    m.nvmlDeviceGetPowerManagementLimit = lambda h: 700_000 if h == "h3" else 1
    monkeypatch.setattr(telemetry, "_session", None)
    real = telemetry.nvml_handle
    monkeypatch.setattr(telemetry, "nvml_handle", lambda dev: real(dev, uuid_of=lambda i: "GPU-abc"))
    info = provenance._nvml_clocks("cuda:0")
    info2 = provenance._nvml_clocks("cuda:0")
    assert info == info2 == dict(nvml_index=3, driver_version="580.159.04", sm_clock_mhz=1980,
                                 mem_clock_mhz=3201, power_limit_w=700.0)
    assert m.state["init"] == 1
