"""The datasheet table: what each device's vendor says its ceilings are, and which device this is.

A roofline point is judged against two ceilings side by side: the one measured on the same
device (roofline.measure.ceilings) and the vendor's datasheet. This module holds the second. Every
number in data/devices.yaml carries its source; the file's header states the units (GB/s with
1 GB = 1e9 B, dense TFLOP/s, bytes). The ridge point I* = F_peak / BW_peak (FLOP per byte)
splits memory-bound from compute-bound work: H200 bf16 is about 206 FLOP/B.

Rows are matched to torch.cuda.get_device_name() strings by regular expression; the longest
matched text wins, so "NVIDIA H200 NVL" is the NVL and not the SXM part. CPUs have no
datasheet row: their single "cpu" row is measured_only, and so is the stand-in returned for a
GPU the table does not know.
"""

from __future__ import annotations

import dataclasses
import platform
import re
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from types import MappingProxyType
from typing import TYPE_CHECKING

from roofline.io.fields import ConfigError, check_fields
from roofline.io.yamltext import load_yaml
from roofline.model.dtypes import DATASHEET_COLUMNS, datasheet_column

if TYPE_CHECKING:
    import torch

_NUMBER_FIELDS = ("mem_bw_GBps", "l2_bytes", "llc_bytes", "mem_bytes", "mem_bytes_reported")


@dataclasses.dataclass(frozen=True)
class Datasheet:
    key: str
    name: str
    vendor: str
    kind: str  # "gpu" | "cpu"
    mem_bw_GBps: float | None
    dense_tflops: Mapping[str, float | None]
    sparse_tflops: Mapping[str, float | None]
    l2_bytes: int | None
    mem_bytes: float | None
    sources: Mapping[str, str]
    measured_only: bool = False
    llc_bytes: int | None = None  # last-level cache when it is not the L2 (MI300X Infinity Cache)
    mem_bytes_reported: float | None = None  # the total the driver reports (nvidia-smi / rocm-smi), where read
    match: tuple[str, ...] = ()

    def usable_mem_bytes(self) -> float | None:
        """The memory an engine sizes its pools from: the driver-reported total where read (an HBM part's
        printed "80GB" is 80 GiB), else the printed capacity."""
        return self.mem_bytes_reported or self.mem_bytes

    def bandwidth_Bps(self) -> float | None:
        return None if self.mem_bw_GBps is None else self.mem_bw_GBps * 1e9

    def peak_flops(self, dtype: str, sparse: bool = False) -> float | None:
        """Datasheet peak in FLOP/s for a dtype name ("bfloat16", "torch.float16", "bf16", ...)."""
        table = self.sparse_tflops if sparse else self.dense_tflops
        tflops = table.get(datasheet_column(dtype))
        return None if tflops is None else tflops * 1e12

    def ridge(self, dtype: str) -> float | None:
        """Ridge intensity in FLOP/B: below it a kernel is bound by memory, above by compute."""
        flops, bw = self.peak_flops(dtype), self.bandwidth_Bps()
        return None if flops is None or bw is None else flops / bw

    def cache_bytes(self) -> int | None:
        """The largest on-chip cache in front of DRAM: what a cold-cache flush must exceed."""
        return self.llc_bytes if self.llc_bytes is not None else self.l2_bytes

    def source_for(self, field: str, dtype: str | None = None) -> str | None:
        if dtype is not None and f"{field}.{dtype}" in self.sources:
            return self.sources[f"{field}.{dtype}"]
        return self.sources.get(field)

    def numbers(self) -> list[tuple[str, str | None, float]]:
        """Every non-null number as (field, dtype or None, value)."""
        out = [(f, None, getattr(self, f)) for f in _NUMBER_FIELDS if getattr(self, f) is not None]
        for field in ("dense_tflops", "sparse_tflops"):
            out += [(field, d, v) for d, v in getattr(self, field).items() if v is not None]
        return out


def parse_device(device: str | torch.device, *, need_available: bool = True) -> torch.device:
    """The one reading of a device string: "cpu", "cuda" or "cuda:N" -> torch.device.

    Anything else fails naming the allowed forms. A CUDA device on a machine without CUDA
    fails too (need_available=False only checks the spelling: a config validated before it
    runs elsewhere). A bare "cuda" stays index-less; callers that need the index ask torch.
    """
    import torch  # here, not with the module: a datasheet what-if never starts torch
    text = str(device)
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda") or (dev.type == "cpu" and dev.index not in (None, 0)):
        raise ConfigError(f"device={text!r}: allowed 'cpu', 'cuda', 'cuda:N'")
    if dev.type == "cuda" and need_available and not torch.cuda.is_available():
        raise ConfigError(f"device={text!r}: CUDA is not available here (every GPU entry runs on cuda: cuda, cuda:N "
                          "or a datasheet GPU row such as h100_sxm); allowed ('cpu',)")
    return dev


def is_cuda(device: str | torch.device) -> bool:
    """Whether a device string names a CUDA device (its spelling checked, not its availability)."""
    return parse_device(device, need_available=False).type == "cuda"


def _row(raw: dict) -> Datasheet:
    raw = dict(raw)
    key = raw.get("key", "?")
    for field in ("dense_tflops", "sparse_tflops"):
        table = raw.get(field) or {}
        unknown = set(table) - set(DATASHEET_COLUMNS)
        if unknown:
            raise ValueError(f"devices.yaml {key}.{field}: unknown dtypes {sorted(unknown)}; "
                             f"allowed {list(DATASHEET_COLUMNS)}")
        if any(v is not None and not isinstance(v, int | float) for v in table.values()):
            raise ValueError(f"devices.yaml {key}.{field}: every entry must be a number or null")
        raw[field] = MappingProxyType({d: (None if v is None else float(v))
                                       for d, v in table.items()})
    for field in _NUMBER_FIELDS:
        value = raw.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"devices.yaml {key}.{field}={value!r}: expected a number or null "
                             "(YAML 1.1 reads 80.0e9 as text; write 80.0e+9)")
    raw["sources"] = MappingProxyType(dict(raw.get("sources") or {}))
    raw["match"] = tuple(raw.get("match") or ())
    check_fields(Datasheet, raw, f"devices.yaml {key}", error=ValueError)
    if raw.get("kind") not in ("gpu", "cpu"):
        raise ValueError(f"devices.yaml {key}.kind={raw.get('kind')!r}; allowed ['cpu', 'gpu']")
    return Datasheet(**raw)


@lru_cache(maxsize=1)
def _table() -> dict[str, Datasheet]:
    text = resources.files("roofline").joinpath("data/devices.yaml").read_text()
    rows = [_row(r) for r in load_yaml(text)["devices"]]
    table = {r.key: r for r in rows}
    if len(table) != len(rows):
        raise ValueError("devices.yaml: duplicate keys")
    return table


def list_datasheets() -> list[Datasheet]:
    return list(_table().values())


def get_datasheet(key: str) -> Datasheet:
    table = _table()
    if key not in table:
        raise ConfigError(f"device={key!r}: unknown; allowed {sorted(table)}")
    return table[key]


def detect(device_name: str) -> Datasheet | None:
    """The row whose pattern matches the longest part of device_name; None if none matches."""
    best, best_len = None, 0
    for row in _table().values():
        for pattern in row.match:
            m = re.search(pattern, device_name.strip(), flags=re.IGNORECASE)
            if m and len(m.group(0)) > best_len:
                best, best_len = row, len(m.group(0))
    return best


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def running_device_name(device: str = "cuda") -> str:
    """torch.cuda.get_device_name for "cuda"/"cuda:N"; the CPU model for "cpu"."""
    dev = parse_device(device)
    if dev.type == "cpu":
        return _cpu_model()
    import torch
    return torch.cuda.get_device_name(dev)


def datasheet_for_running_device(device: str = "cuda") -> tuple[Datasheet, bool]:
    """(row, matched). CPUs get the measured-only "cpu" row. A GPU the table does not know
    gets a measured-only stand-in named after the device, and matched=False."""
    name = running_device_name(device)
    if parse_device(device, need_available=False).type == "cpu":
        return get_datasheet("cpu"), True
    row = detect(name)
    if row is not None:
        return row, True
    unknown = Datasheet(key="unknown", name=name, vendor="unknown", kind="gpu", mem_bw_GBps=None,
                         dense_tflops=MappingProxyType({}), sparse_tflops=MappingProxyType({}),
                         l2_bytes=None, mem_bytes=None, sources=MappingProxyType({}),
                         measured_only=True)
    return unknown, False


def datasheet_row(device: str, datasheet: str | None) -> str | None:
    """The datasheet row of a device entry (roofline/conf/device/: a torch device and a row): the row
    named, checked against the table; else the running device's row (None: a GPU the table
    does not know). Where a datasheet is meant (card, predict, capacity) the row may be any
    device's: a what-if needs no such device here."""
    if datasheet is not None:
        return get_datasheet(datasheet).key
    row, matched = datasheet_for_running_device(device)
    return row.key if matched else None


def run_device(device: str, datasheet: str | None) -> str:
    """The torch device of a device entry (roofline/conf/device/), where a device is meant to run on
    (sweep, ceilings, collectives, specdec, acceptance). A named datasheet row must be of the
    same kind (a GPU row runs on cuda) and, where the GPU is here, be the row of that GPU."""
    dev = parse_device(device, need_available=False)
    if datasheet is None:
        return device
    row = get_datasheet(datasheet)
    if (row.kind == "cpu") != (dev.type == "cpu"):
        raise ConfigError(f"device.datasheet={datasheet!r} is a {row.kind} row but device.torch={device!r}")
    import torch
    if dev.type == "cuda" and torch.cuda.is_available():
        running, matched = datasheet_for_running_device(device)
        if running.key != datasheet:
            raise ConfigError(f"device={datasheet}: {device} is a {running.name} "
                              f"({running.key if matched else 'no datasheet row'}); use device=cuda"
                              + (f" or device={running.key}" if matched else ""))
    return device


def last_level_cache_bytes(device: str = "cpu", root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The device's real last-level cache: the CPU's highest cache level from sysfs (per
    instance, as the kernel reports it), the GPU's L2 from torch; None when not readable.
    (The cold-flush size is a different number: a default when nothing is queried.)"""
    if is_cuda(device):
        import torch
        if not torch.cuda.is_available():
            return None
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or None
    import glob
    best = None
    for d in glob.glob(f"{root}/index*"):
        try:
            level = int(open(f"{d}/level").read())
            kind = open(f"{d}/type").read().strip()
            size = open(f"{d}/size").read().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:].upper(), 1)
        n = int(size.rstrip("KkMmGg")) * mult if size.rstrip("KkMmGg").isdigit() else None
        if n and (best is None or level > best[0]):
            best = (level, n)
    return best[1] if best else None

