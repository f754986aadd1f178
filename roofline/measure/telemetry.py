"""Device telemetry around a measurement: clocks, power, temperature and throttling.

A bandwidth or FLOP ceiling measured while the GPU was power- or thermally-capped is a
ceiling of that state, not of the device. NVML says why clocks are below their maximum as a
bitmask of "clock event" (formerly "throttle") reasons; we record it before and after each
measured block and flag a block `throttled` when a reason that lowers clocks under load is
set (power cap, thermal or hardware slowdown). GPU idle, application-clock settings, sync
boost and display settings are not throttling.

NVML comes from the maintained binding `pynvml` (pip package nvidia-ml-py). Without it, or
on the CPU, a snapshot is {"available": False, ...}; on the CPU it adds the current core
frequency from psutil where the platform reports one. Snapshots never raise: telemetry must
not break a measurement.

NVML is initialised once per process, on first use, and shut down at exit: nvmlInit
enumerates every device and costs milliseconds, which per snapshot (two per measured block)
would sit between the blocks of a ceilings run.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import time
from typing import Iterator

import torch

# NVML's nvmlClocksEventReason* / nvmlClocksThrottleReason* bits (nvml.h; stable ABI).
THROTTLE_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
# Reasons that pull clocks down while the device is busy: the measurement is of a capped state.
THROTTLING = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
              "hw_power_brake_slowdown")


def decode_reasons(bitmask: int) -> list[str]:
    """Names of the set bits, in bit order; unknown bits as hex."""
    names = [name for name, bit in THROTTLE_BITS.items() if bitmask & bit]
    unknown = bitmask & ~sum(THROTTLE_BITS.values())
    return names + ([hex(unknown)] if unknown else [])


def is_throttled(bitmask: int) -> bool:
    return any(bitmask & THROTTLE_BITS[name] for name in THROTTLING)


def _pynvml():
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


_session: tuple[object, str | None] | None = None  # (pynvml, why unusable) of this process's one nvmlInit


def _nvml():
    """(pynvml initialised, None), or (None, why not). nvmlInit runs once per binding per process."""
    global _session
    nvml = _pynvml()
    if nvml is None:
        return None, "pynvml not installed (pip install nvidia-ml-py)"
    if _session is None or _session[0] is not nvml:
        try:
            nvml.nvmlInit()
            _session = (nvml, None)
            atexit.register(shutdown)
        except Exception as e:
            _session = (nvml, f"nvmlInit failed: {e}")
    return (None, _session[1]) if _session[1] else (nvml, None)


def shutdown() -> None:
    """nvmlShutdown for the process's one nvmlInit (registered at exit; safe to call twice)."""
    global _session
    if _session is not None and _session[1] is None:
        _query(_session[0].nvmlShutdown)
    _session = None


def nvml_available() -> bool:
    return _nvml()[0] is not None


def _cpu_freq_mhz() -> float | None:
    try:
        import psutil

        freq = psutil.cpu_freq()
        return None if freq is None or not freq.current else float(freq.current)
    except Exception:  # not implemented on this platform, or no psutil
        return None


def _query(fn, *args):
    """One NVML field; None where the device does not support it."""
    try:
        return fn(*args)
    except Exception:
        return None


def _reasons(nvml, handle) -> int | None:
    getter = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
              or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
    return None if getter is None else _query(getter, handle)


def snapshot(device_index: int | None = 0) -> dict:
    """Clocks (MHz), power (W), temperature (°C) and throttle reasons of NVML device
    `device_index`; `None` means the CPU. Fields NVML cannot read are None."""
    if device_index is None:
        return {"available": False, "reason": "cpu", "cpu_freq_mhz": _cpu_freq_mhz()}
    nvml, why = _nvml()
    if nvml is None:
        return {"available": False, "reason": why}
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(device_index)
        power_mw = _query(nvml.nvmlDeviceGetPowerUsage, h)
        bitmask = _reasons(nvml, h)
        return {
            "available": True,
            "device_index": device_index,
            "sm_clock_mhz": _query(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
            "mem_clock_mhz": _query(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM),
            "power_w": None if power_mw is None else power_mw / 1000.0,
            "temperature_c": _query(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
            "throttle_reasons": None if bitmask is None else {
                "bitmask": int(bitmask), "names": decode_reasons(int(bitmask))},
            "throttled": None if bitmask is None else is_throttled(int(bitmask)),
        }
    except Exception as e:
        return {"available": False, "reason": f"NVML query failed: {e}"}


ENERGY_MIN_S = 0.5  # an energy pass runs the step at least this long (NVML's counter ticks in ms)
ENERGY_MAX_S = 5.0  # and never longer than this, however slow one step is
ENERGY_MIN_CALLS = 3


def energy_counter_mj(device_index: int | None) -> tuple[float | None, str | None]:
    """(NVML's total energy counter of the device in mJ, None), or (None, why it cannot be read).
    `None` is the CPU, which has no NVML counter."""
    if device_index is None:
        return None, "no NVML on cpu"
    nvml, why = _nvml()
    if nvml is None:
        return None, f"no NVML: {why}"
    handle = _query(nvml.nvmlDeviceGetHandleByIndex, device_index)
    getter = getattr(nvml, "nvmlDeviceGetTotalEnergyConsumption", None)  # mJ since the driver loaded (Volta+)
    value = None if handle is None or getter is None else _query(getter, handle)
    return (float(value), None) if value is not None else (None, "NVML reports no energy counter on this device")


def energy_per_token(fn, device_index: int | None, tokens_per_call: int, sync=lambda: None,
                     counter=energy_counter_mj, clock=time.perf_counter, min_s: float = ENERGY_MIN_S,
                     max_s: float = ENERGY_MAX_S) -> float | str:
    """Joules per token of a warmed-up step `fn` that processes `tokens_per_call` tokens: NVML's
    energy counter read around at least ENERGY_MIN_CALLS calls and `min_s` seconds of calls.
    The device is synchronised after every call, so the clock measures finished steps (a CUDA
    graph replay returns before it runs: without the sync the loop would queue thousands of
    replays and wait for them at the end), and the pass stops after `max_s` seconds whatever
    the count. Where no counter can be read (the CPU, no pynvml, a device without the counter)
    the answer is the string 'n/a (why)', never a number, and `fn` is not called."""
    e0, why = counter(device_index)
    if e0 is None:
        return f"n/a ({why})"
    sync()
    e0, _ = counter(device_index)
    t0, calls = clock(), 0
    while (calls < ENERGY_MIN_CALLS or clock() - t0 < min_s) and clock() - t0 < max_s:
        fn()
        sync()
        calls += 1
    e1, why = counter(device_index)
    if e1 is None or e0 is None or e1 <= e0:
        return f"n/a (the energy counter did not advance over {calls} calls: {why or 'too coarse'})"
    return (e1 - e0) / 1e3 / (calls * tokens_per_call)


def nvml_index(device: str | torch.device) -> int | None:
    """The NVML index of a torch device; None for the CPU.

    NVML numbers all GPUs of the machine, CUDA only the visible ones, so the two differ
    under CUDA_VISIBLE_DEVICES; the device's UUID, known to both, maps one to the other.
    Without NVML (or a UUID NVML does not know) the CUDA index is the best there is.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    nvml, handle = nvml_handle(dev)
    if handle is not None:
        index = _query(nvml.nvmlDeviceGetIndex, handle)
        if index is not None:
            return int(index)
    return dev.index if dev.index is not None else 0


def nvml_handle(device: str | torch.device, uuid_of=None) -> tuple[object | None, object | None]:
    """(pynvml, the NVML handle of the torch CUDA device `device`, found by its UUID), through
    the process's one nvmlInit; (pynvml or None, None) where it cannot be found. `uuid_of`
    (index -> the UUID string torch reports) is for tests."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None, None
    nvml, _ = _nvml()
    if nvml is None:
        return None, None
    index = dev.index if dev.index is not None else 0
    try:
        uuid = str((uuid_of or (lambda i: torch.cuda.get_device_properties(i).uuid))(index))
    except Exception:
        return nvml, None
    uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    handle = _query(nvml.nvmlDeviceGetHandleByUUID, uuid.encode())
    if handle is None:
        handle = _query(nvml.nvmlDeviceGetHandleByUUID, uuid)
    return nvml, handle


class Telemetry:
    """Records a snapshot before and after each named block of a measurement."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = str(device)
        self.index = nvml_index(device)
        self.records: list[dict] = []

    @contextlib.contextmanager
    def block(self, name: str) -> Iterator[dict]:
        """`with tel.block("bandwidth/torch_copy"):` appends {"block", "before", "after",
        "wall_s", "throttled"}; throttled is None when it could not be read."""
        record = {"block": name, "before": snapshot(self.index)}
        t0 = time.perf_counter()
        try:
            yield record
        finally:
            record["wall_s"] = time.perf_counter() - t0
            record["after"] = snapshot(self.index)
            flags = [s.get("throttled") for s in (record["before"], record["after"])]
            known = [f for f in flags if f is not None]
            record["throttled"] = any(known) if known else None
            self.records.append(record)

    @property
    def throttled(self) -> bool | None:
        """True if any block was throttled, False if all were read and none was, else None."""
        flags = [r["throttled"] for r in self.records]
        if any(f is True for f in flags):
            return True
        return False if flags and all(f is False for f in flags) else None
