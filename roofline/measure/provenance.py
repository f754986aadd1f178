"""Where a number came from: device, software versions, threads, clocks, code version, time."""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
from functools import lru_cache

from roofline.io.files import REPO_ROOT
from roofline.measure.devices import running_device_name


@lru_cache(maxsize=1)
def git_commit() -> str:
    """HEAD of the checkout the library runs from, '+dirty' when tracked files changed."""
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        head = run("rev-parse", "--short=12", "HEAD").stdout.strip()
        dirty = run("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return (head + ("+dirty" if dirty else "")) or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def code_version() -> str:
    """What code measured: the git commit of the checkout, else the installed package's version."""
    commit = git_commit()
    if commit != "unknown":
        return commit
    try:
        from importlib.metadata import version
        return "roofline " + version("roofline")
    except Exception:  # not installed either
        return "unknown"


def _triton_version() -> str | None:
    try:
        import triton
        return triton.__version__
    except Exception:  # not installed, or broken without a GPU
        return None


def _nvml_clocks(device: str) -> dict:
    """Driver, clocks and power limit of the torch device `device`, read from NVML through the
    process's one initialisation (roofline.measure.telemetry) at the device's NVML index (mapped
    by UUID: under CUDA_VISIBLE_DEVICES the CUDA index is not NVML's). {} without NVML."""
    from roofline.measure.telemetry import nvml_handle
    nvml, h = nvml_handle(device)
    if h is None:
        return {}
    try:
        driver = nvml.nvmlSystemGetDriverVersion()
        return dict(
            nvml_index=int(nvml.nvmlDeviceGetIndex(h)),
            driver_version=driver.decode() if isinstance(driver, bytes) else driver,
            sm_clock_mhz=nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
            mem_clock_mhz=nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
            power_limit_w=nvml.nvmlDeviceGetPowerManagementLimit(h) / 1000,
        )
    except Exception:
        return {}


def collect(device: str) -> dict:
    """Provenance fields shared by every row of a run on `device` ('cpu' or 'cuda[:N]')."""
    import torch  # a run's provenance has a torch; an analysis that imports this module need not start it
    dev = torch.device(device)
    info = dict(
        device=str(dev), device_name=running_device_name(str(dev)),
        cpu_model=running_device_name("cpu"), torch_version=torch.__version__,
        triton_version=_triton_version(), python_version=platform.python_version(),
        cuda_version=torch.version.cuda, threads=torch.get_num_threads(), git_commit=git_commit(),
        time_utc=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )
    if dev.type == "cuda":
        info.update(_nvml_clocks(str(dev)))
    return info
