"""pytest-benchmark of the bandwidth kernels: `make bench` (pytest benchmarks --benchmark-only).

Not part of the default test run (pytest's testpaths is tests/). Each kernel is checked
against its reference before it is benchmarked. GB/s = bytes_moved (read + written) /
median / 1e9 is stored in extra_info. On CUDA the host clock of pytest-benchmark would time
launch + sync, so the device time comes from roofline.measure.timer (CUDA events) and is what the
GB/s uses; the host-clock statistics are kept as pytest-benchmark's own columns. No test
asserts an absolute time: compare runs with `pytest-benchmark compare`.
"""

from __future__ import annotations

import pytest
import torch

from roofline.measure import kernels

from roofline.measure import timer

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
MiB = 2**20
WORKING_SETS = (4 * MiB, 64 * MiB, 1024 * MiB) if CUDA else (1 * MiB, 16 * MiB, 256 * MiB)
NAMES = [n for n, k in kernels.KERNELS.items()
         if not k.uses_triton or (CUDA and kernels.triton_available())]
DTYPE = torch.float32


def _buffers(spec: kernels.CeilingKernel, working_set: int) -> tuple[kernels.Buffers, int]:
    elem = torch.empty((), dtype=DTYPE).element_size()
    arrays = max(1, round(spec.bytes_moved(MiB, elem) / (MiB * elem)))
    n = -(-working_set // (arrays * elem))
    return spec.make_buffers(n, DTYPE, DEVICE), spec.bytes_moved(n, elem)


@pytest.mark.parametrize("working_set", WORKING_SETS, ids=lambda b: f"{b // MiB}MiB")
@pytest.mark.parametrize("name", NAMES)
def test_bandwidth_kernel(benchmark, name, working_set):
    spec = kernels.KERNELS[name]
    kernels.check(spec, 3 * 8192 + 5, DTYPE, DEVICE)  # correct before fast
    bufs, moved = _buffers(spec, working_set)
    run = lambda: spec.run(bufs)  # noqa: E731
    benchmark.extra_info.update(kernel=name, dtype=str(DTYPE), device=DEVICE,
                                working_set_bytes=working_set, bytes_moved=moved)
    if CUDA:
        synced = lambda: (run(), torch.cuda.synchronize())  # noqa: E731
        benchmark.pedantic(synced, rounds=20, iterations=1, warmup_rounds=3)
        r = timer.time_fn(run, timer.TimerSettings(l2="cold"), DEVICE)
        benchmark.extra_info.update(device_median_s=r.median_s, timer_clock=r.clock,
                                    GBps=moved / r.median_s / 1e9)
    else:
        benchmark.pedantic(run, rounds=10, iterations=1, warmup_rounds=2)
        median = benchmark.stats.stats.median
        benchmark.extra_info.update(host_median_s=median, GBps=moved / median / 1e9)
