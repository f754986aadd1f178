"""The one timing primitive: every number the project measures goes through `time_fn`.

Semantics (docs/design.md §4), in the order they happen:

1. Fail fast: settings are validated when built; the device and mode are checked before
   `fn` is ever called (graph mode needs CUDA; only cpu and cuda are timed).
2. Warm-up: `warmup` untimed calls, so that allocator growth, lazy initialisation
   (cuBLAS handles, oneDNN primitives), page faults and clock ramp-up are not measured.
   Modes: "eager" calls `fn`; "graph" captures it once into a CUDA graph and replays it;
   "compiled" runs `torch.compile(fn, fullgraph=True, dynamic=False)` with, on CUDA,
   mode="reduce-overhead" (Inductor's fused kernels replayed as CUDA graphs, as gpt-fast
   does): fewer kernels and no host launch cost. Compilation happens in the warm-up (at
   least 3 calls, so the CUDA-graph tree is recorded); a function torch.compile cannot take
   whole, or a CPU without a C++ compiler for Inductor, raises `CompileUnsupported`.
3. Repetitions: each rep times exactly ONE call of `fn` (or one CUDA-graph replay).
   CPU: `time.perf_counter_ns` around the call (CPU torch ops are synchronous).
   CUDA: a `torch.cuda.Event(enable_timing=True)` pair recorded on the current stream
   around the call, then a synchronise to read `elapsed_time`. The device is idle when the
   start event is recorded, so an eager time includes the host's launch overhead: that is
   the honest eager cost, and the reason decode-sized steps are timed with `mode="graph"`.
4. Cold L2: before every rep, and outside the timed region, `CacheFlusher` rewrites a
   buffer of 2x the last-level cache, so the workload's bytes come from DRAM/HBM again.
5. Adaptive stopping: after `min_reps`, keep adding reps until the distribution-free 95%
   confidence interval of the median is narrow (`rel_ci`), or `max_reps`, or the wall-time
   `budget_s` of the loop is spent. The reason is recorded in `stopped_by`.
6. Never a zero: a measured time that is not finite and > 0 raises `TimingError`.

The clock sits behind the small `Clock` protocol (`CpuClock` is the CPU twin of
`CudaEventClock`), and the statistics loop `run_reps` takes any `measure() -> seconds`
callable, so all of the logic above is tested on the CPU with scripted fakes.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import gc
import math
import os
import random
import statistics
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterator, NamedTuple, Protocol, Sequence

import torch

from roofline.measure.devices import parse_device
from roofline.io.fields import ConfigError, check_int, option

MODES = ("eager", "graph", "compiled")
L2_MODES = ("warm", "cold")
STOP_REASONS = ("rel_ci", "budget", "max_reps")
CPU_DEFAULT_LLC_BYTES = 64 * 2**20
CUDA_FALLBACK_L2_BYTES = 128 * 2**20


class TimingError(RuntimeError):
    """A measurement that cannot be trusted (a time <= 0, NaN or inf)."""


class CompileUnsupported(NotImplementedError):
    """mode="compiled" cannot run here (no C++ compiler for Inductor on the CPU, or torch.compile
    refused the function); a sweep records the point as `unsupported` with this message."""


@dataclass(frozen=True)
class TimerSettings:
    """How to time one callable. Recorded with every result row.

    `l2_bytes=0` means: the queried L2 size on CUDA, 64 MiB on the CPU (at least the
    last-level cache one core sees on current servers: Zen 4 has 32 MB per CCD), so the
    cold flush buffer (2x) is 128 MiB there. `threads=0` leaves torch's thread count as it
    is; the count actually used is recorded either way.
    """

    warmup: int = option(2, "untimed calls before the first timed one")
    min_reps: int = option(5, "timed calls at least (2 or more: a single run is never reported)")
    max_reps: int = option(40, "timed calls at most")
    rel_ci: float = option(0.03, "stop when the median's 95% CI half-width is below this share of it")
    budget_s: float = option(0.6, "timed seconds per point before stopping anyway (never below min_reps)")
    mode: str = option("eager", "eager | graph | compiled (a sweep replaces it per point by its modes axis)")
    l2: str = option("warm", "warm | cold (flush >= 2x the cache size before each rep)")
    l2_bytes: int = option(0, "cache to defeat; 0: queried L2 (cuda) or 64 MiB (cpu)")
    threads: int = option(0, "0: torch's default; the count used is recorded in every row")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError (a ValueError) naming the field and what it allows."""
        if self.mode not in MODES:
            raise ConfigError(f"timer.mode={self.mode!r}: allowed {MODES}")
        if self.l2 not in L2_MODES:
            raise ConfigError(f"timer.l2={self.l2!r}: allowed {L2_MODES}")
        _check_int("warmup", self.warmup, 0)
        # Two reps at least: docs/design.md forbids reporting a single run.
        _check_int("min_reps", self.min_reps, 2)
        at_least_min = f"integers >= min_reps={self.min_reps}"
        _check_int("max_reps", self.max_reps, self.min_reps, at_least_min)
        _check_int("l2_bytes", self.l2_bytes, 0)
        cores = os.cpu_count() or 1  # more threads than cores time the scheduler, not the kernels
        check_int("timer.threads", self.threads, 0, cores, f"0 (torch's default) to {cores} (this machine's cores)")
        for name in ("rel_ci", "budget_s"):
            v = getattr(self, name)
            number = isinstance(v, (int, float)) and not isinstance(v, bool)
            if not (number and v > 0 and math.isfinite(v)):
                raise ConfigError(f"timer.{name}={v!r}: allowed finite numbers > 0")


def _check_int(name: str, v: Any, lo: int, allowed: str | None = None) -> None:
    check_int(f"timer.{name}", v, lo, allowed=allowed)


# --------------------------------------------------------------------------- statistics


@lru_cache(maxsize=None)
def _median_ci_ranks(n: int, confidence: float) -> tuple[int, int]:
    """1-based ranks (l, u) of the order statistics that bracket the median.

    The count B of samples below the true median is Binomial(n, 1/2) for any continuous
    distribution, so P(x_(l) <= median < x_(u)) = 1 - 2 P(B <= l-1) with u = n + 1 - l.
    We take the largest l with P(B <= l-1) <= (1 - confidence)/2, from scipy's binomial
    quantile (exact for every n). For n < 6 no pair reaches 95%; we then return the full
    range (l=1), the widest interval the data allow (coverage 1 - 2^(1-n)).
    """
    from scipy.stats import binom
    tail = (1.0 - confidence) / 2.0
    k = int(binom.ppf(tail, n, 0.5))  # the smallest k with P(B <= k) >= tail
    l = k + 1 if binom.cdf(k, n, 0.5) <= tail else k  # the largest l with P(B <= l - 1) <= tail
    l = min(max(1, l), (n + 1) // 2)  # l <= (n+1)/2 keeps u >= l
    return l, n + 1 - l


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median from order statistics.

    No normality is assumed (timings are skewed: a floor plus a right tail of
    interruptions). See `_median_ci_ranks` for the binomial argument.
    """
    if not samples:
        raise ValueError("median_ci: no samples")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"median_ci: confidence={confidence!r}: allowed 0 < confidence < 1")
    s = sorted(samples)
    l, u = _median_ci_ranks(len(s), confidence)
    return s[l - 1], s[u - 1]


def _quantile(s: Sequence[float], p: float) -> float:
    """Linear interpolation between order statistics of sorted `s` (numpy's default)."""
    pos = (len(s) - 1) * p
    i = math.floor(pos)
    j = min(i + 1, len(s) - 1)
    return s[i] + (s[j] - s[i]) * (pos - i)


def _ci_rel_sorted(s: Sequence[float], confidence: float = 0.95) -> float:
    l, u = _median_ci_ranks(len(s), confidence)
    return (s[u - 1] - s[l - 1]) / 2.0 / _quantile(s, 0.5)


@dataclass(frozen=True)
class Summary:
    """Robust statistics of one set of timings, all in seconds except cv and ci_rel."""

    median_s: float
    p10_s: float
    p90_s: float
    mean_s: float
    min_s: float
    cv: float  # sample std (ddof=1) / mean; NaN for a single sample
    n: int
    ci_lo_s: float
    ci_hi_s: float
    ci_rel: float  # (ci_hi - ci_lo) / 2 / median: relative half-width of the 95% CI


def summarize(samples: Sequence[float]) -> Summary:
    """Median, p10/p90 (linear interpolation), mean, min, CV and the median's 95% CI."""
    if not samples:
        raise ValueError("summarize: no samples")
    for i, t in enumerate(samples):
        _check_time(t, i)
    s = sorted(samples)
    n = len(s)
    mean = math.fsum(s) / n
    cv = statistics.stdev(s) / mean if n > 1 else math.nan
    lo, hi = median_ci(s)
    med = _quantile(s, 0.5)
    return Summary(
        median_s=med, p10_s=_quantile(s, 0.1), p90_s=_quantile(s, 0.9), mean_s=mean,
        min_s=s[0], cv=cv, n=n, ci_lo_s=lo, ci_hi_s=hi, ci_rel=(hi - lo) / 2.0 / med,
    )


def _check_time(t: float, rep: int) -> None:
    if not (t > 0.0 and math.isfinite(t)):
        raise TimingError(
            f"rep {rep}: measured {t!r} s; a time <= 0 (or NaN/inf) means the clock did not "
            "resolve the call or the work was not inside the timed region"
        )


class Reps(NamedTuple):
    samples: list[float]
    stopped_by: str
    total_s: float  # wall time of the whole loop: flushes, syncs and timed calls
    cpu_s: float = float("nan")  # process CPU time over the same loop (all threads)


def run_reps(
    measure: Callable[[], float],
    settings: TimerSettings,
    wall: Callable[[], float] = time.perf_counter,
) -> Reps:
    """The adaptive loop, independent of any clock: `measure()` returns one rep in seconds.

    After `min_reps`, stop at the first of: the median's CI half-width <= `rel_ci` of the
    median ("rel_ci"), `max_reps` reps ("max_reps"), `budget_s` of `wall` time spent
    ("budget"). The budget is wall time, flushes and syncs included, because that is what
    a sweep pays per point; `wall` is injectable so tests can script it.
    """
    samples: list[float] = []
    ordered: list[float] = []
    t0, c0 = wall(), time.process_time()
    while True:
        t = measure()
        _check_time(t, len(samples))
        samples.append(t)
        bisect.insort(ordered, t)
        n, total = len(samples), wall() - t0
        if n < settings.min_reps:
            continue
        stop = ("rel_ci" if _ci_rel_sorted(ordered) <= settings.rel_ci else "max_reps" if n >= settings.max_reps
                else "budget" if total >= settings.budget_s else None)
        if stop:
            return Reps(samples, stop, total, time.process_time() - c0)


# --------------------------------------------------------------------------- clocks


class Clock(Protocol):
    """Times one call. `name` is recorded in every row; `sync` drains pending device work."""

    name: str

    def measure(self, fn: Callable[[], Any]) -> float: ...

    def sync(self) -> None: ...


class CpuClock:
    """perf_counter_ns around the call: monotonic, ns resolution, and CPU ops are synchronous."""

    name = "cpu_perf_counter_ns"

    def measure(self, fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - t0) * 1e-9

    def sync(self) -> None:
        pass


class CudaEventClock:
    """A CUDA event pair on the current stream; device time, read after a per-rep sync.

    Syncing every rep keeps reps independent (no queue of work hides launch gaps or
    overlaps the next rep's flush); the host time spent in the sync is not in the sample.
    """

    name = "cuda_events"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def measure(self, fn: Callable[[], Any]) -> float:
        stream = torch.cuda.current_stream(self.device)
        self._start.record(stream)
        fn()
        self._end.record(stream)
        self._end.synchronize()
        return self._start.elapsed_time(self._end) * 1e-3  # elapsed_time is in ms

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)


def _resolve_device(device: str | torch.device) -> torch.device:
    dev = parse_device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def make_clock(device: str | torch.device, settings: TimerSettings) -> Clock:
    """The clock for a device; rejects combinations that cannot be measured, before any call."""
    dev = _resolve_device(device)
    if dev.type == "cpu":
        if settings.mode == "graph":
            raise ConfigError(
                "timer.mode='graph': CUDA-graph replay needs a CUDA device; "
                f"on device={str(device)!r} allowed ('eager',)"
            )
        return CpuClock()
    return CudaEventClock(dev)


# --------------------------------------------------------------------------- L2 flush


def resolve_l2_bytes(device: str | torch.device, settings: TimerSettings) -> int:
    """The cache size the cold flush must defeat: the setting, else queried, else a default."""
    if settings.l2_bytes > 0:
        return settings.l2_bytes
    dev = torch.device(device)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        return int(getattr(props, "L2_cache_size", 0) or CUDA_FALLBACK_L2_BYTES)
    return CPU_DEFAULT_LLC_BYTES


class CacheFlusher:
    """Evicts the workload from the last-level cache between reps (`l2="cold"`).

    The buffer (2x the cache, so that no replacement policy keeps the workload's lines) is
    allocated once; each `flush` does a read-modify-write of all of it (`add_(1)`): reads
    pull every line in, and unlike a large memset it cannot be turned into non-temporal
    stores that bypass the cache. For `l2="warm"` it allocates nothing and does nothing.
    """

    def __init__(self, l2: str, l2_bytes: int, device: str | torch.device = "cpu") -> None:
        if l2 not in L2_MODES:
            raise ConfigError(f"timer.l2={l2!r}: allowed {L2_MODES}")
        self.l2 = l2
        self.flushes = 0
        self.buffer: torch.Tensor | None = None
        if l2 == "cold":
            numel = -(-2 * l2_bytes // 4)
            self.buffer = torch.zeros(numel, dtype=torch.int32, device=device)

    @property
    def nbytes(self) -> int:
        """Bytes rewritten per flush (0 when warm)."""
        return 0 if self.buffer is None else self.buffer.numel() * self.buffer.element_size()

    def flush(self) -> None:
        if self.buffer is not None:
            self.buffer.add_(1)
            self.flushes += 1


# --------------------------------------------------------------------------- threads


@contextlib.contextmanager
def set_threads(n: int) -> Iterator[int]:
    """Run with `n` torch intra-op threads (0: unchanged); restore the previous count after.

    Yields the count actually in effect, which is what a result row records.
    """
    previous = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No garbage-collection pauses inside the reps (as `timeit` does)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# --------------------------------------------------------------------------- time_fn


@dataclass(frozen=True)
class TimingResult:
    """Statistics of one timed callable plus the settings that shaped them (all seconds)."""

    median_s: float
    p10_s: float
    p90_s: float
    mean_s: float
    min_s: float
    cv: float
    n: int
    ci_rel: float
    total_s: float
    stopped_by: str
    clock: str
    mode: str
    l2: str
    flush_bytes: int  # bytes rewritten before each rep; 0 when l2 == "warm"
    threads: int
    samples_s: tuple[float, ...]
    probe: dict | None = None  # what time_fn's `probe` returned (not a timing)
    # CPU devices: process CPU time / (wall time x intra-op threads) over the reps. The threads
    # work or spin the whole time on an idle machine (~0.9-1; above 1 when other threads of the
    # process also run); well below 1, the scheduler gave their cores to someone else while this
    # point was timed (roofline.measure.noise). NaN on GPUs.
    cpu_share: float = float("nan")

    def to_row(self, prefix: str = "t_") -> dict[str, Any]:
        """Scalar fields for a result row (the samples and the probe stay out of flat tables)."""
        return {
            prefix + f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("samples_s", "probe")
        }


def _capture_graph(fn: Callable[[], Any], warmup: int, device: torch.device) -> Any:
    """Capture `fn` into a CUDA graph, warming it up on a side stream first (as PyTorch
    documents: lazy initialisation such as cuBLAS workspaces must not happen in capture).

    `fn` must use static buffers: a replay reruns the captured kernels on the same
    addresses, so inputs are updated in place and outputs read from the tensors `fn` wrote
    during capture. Host-side work and syncs inside `fn` are not replayed.
    """
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize(device)
    return graph


COMPILE_WARMUP = 3  # calls: compile, then record and warm the CUDA-graph tree


def _cxx_compiler() -> str | None:
    import shutil
    for name in (os.environ.get("CXX", ""), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def compile_fn(fn: Callable[[], Any], device: torch.device, backend: str = "inductor") -> Callable[[], Any]:
    """`fn` compiled whole (fullgraph, static shapes); on CUDA with CUDA graphs (reduce-overhead).

    Each call first marks a new CUDA-graph-tree step, so replays never wait on outputs of the
    previous call that nobody reads. Raises CompileUnsupported where Inductor cannot run.
    """
    if backend == "inductor" and device.type == "cpu" and _cxx_compiler() is None:
        raise CompileUnsupported("timer.mode='compiled': torch.compile (Inductor) on the CPU needs a C++ "
                                 "compiler (none of $CXX, c++, g++, clang++ is on PATH); use modes eager")
    torch._dynamo.reset()  # a fresh cache: each timed callable compiles for itself, never falls back
    mode = "reduce-overhead" if device.type == "cuda" and backend == "inductor" else None
    compiled = torch.compile(fn, backend=backend, mode=mode, fullgraph=True, dynamic=False)
    if device.type != "cuda" or mode is None:
        return compiled

    def step() -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return compiled()
    return step


def _compile_errors(fn: Callable[[], Any]) -> Callable[[], Any]:
    """First calls of a compiled function: torch.compile's own failures become CompileUnsupported."""
    def call() -> Any:
        try:
            return fn()
        except Exception as e:
            if type(e).__module__.startswith(("torch._dynamo", "torch._inductor")):
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise CompileUnsupported(f"timer.mode='compiled': torch.compile failed: "
                                         f"{type(e).__name__}: {first}"[:400]) from e
            raise
    return call


def time_fn(
    fn: Callable[[], Any],
    settings: TimerSettings,
    device: str | torch.device = "cpu",
    *,
    clock: Clock | None = None,
    probe: Callable[[Callable[[], Any]], dict] | None = None,
    compiler: Callable[[Callable[[], Any], torch.device], Callable[[], Any]] = compile_fn,
) -> TimingResult:
    """Time `fn` on `device` under `settings`; see the module docstring for the semantics.

    In graph mode `fn` is called `max(warmup, 1)` times eagerly on a side stream and once
    under capture (not executed); the graph is then replayed `warmup` times untimed and
    once per rep. In compiled mode `compiler(fn, device)` is called `max(warmup, 3)` times
    untimed, then once per rep. `clock` replaces the device's clock (tests inject scripted
    fakes). `probe`, if given, is called once with the warmed-up callable (fn, the graph's
    replay or the compiled function) before the reps, outside any timed region; what it
    returns is kept in `TimingResult.probe` (the sweep counts kernels per forward with it).
    """
    dev = _resolve_device(device)
    default_clock = make_clock(dev, settings)  # rejects graph mode on the CPU before any call
    clock = clock or default_clock
    flusher = CacheFlusher(settings.l2, resolve_l2_bytes(dev, settings), dev)
    on_cuda = dev.type == "cuda"
    with set_threads(settings.threads) as threads, (
        torch.cuda.device(dev) if on_cuda else contextlib.nullcontext()
    ):
        target = fn
        warmup = settings.warmup
        if settings.mode == "graph":
            target = _capture_graph(fn, settings.warmup, dev).replay  # keeps the graph alive
        elif settings.mode == "compiled":
            target, warmup = compiler(fn, dev), max(settings.warmup, COMPILE_WARMUP)
            checked = _compile_errors(target)
            for _ in range(warmup):
                checked()
            warmup = 0
        for _ in range(warmup):
            target()
        probed = probe(target) if probe is not None else None
        flusher.flush()  # first touch of the flush buffer (page faults) before the loop
        clock.sync()

        def one_rep() -> float:
            flusher.flush()  # outside the timed region; stream-ordered before the start event
            return clock.measure(target)

        with _gc_paused():
            reps = run_reps(one_rep, settings)
    stats = summarize(reps.samples)
    return TimingResult(
        median_s=stats.median_s, p10_s=stats.p10_s, p90_s=stats.p90_s, mean_s=stats.mean_s,
        min_s=stats.min_s, cv=stats.cv, n=stats.n, ci_rel=stats.ci_rel, total_s=reps.total_s,
        stopped_by=reps.stopped_by, clock=clock.name, mode=settings.mode, l2=settings.l2,
        flush_bytes=flusher.nbytes, threads=threads, samples_s=tuple(reps.samples), probe=probed,
        cpu_share=reps.cpu_s / (reps.total_s * threads) if not on_cuda and reps.total_s > 0 else float("nan"),
    )


def time_interleaved(fns: dict[Any, Callable[[], Any]], settings: TimerSettings, rounds: int,
                     device: str | torch.device = "cpu", seed: int = 0,
                     timer: Callable[..., TimingResult] | None = None) -> dict[Any, Summary]:
    """Several callables timed in turns, for their RATIOS: `rounds` rounds, each of which times
    every callable once through `time_fn` (its warm-up, then exactly `settings.min_reps` reps) in
    a fresh random order; each callable's samples over all rounds are pooled into one Summary.

    Why: on a shared machine the speed drifts over seconds (other tenants, clocks). Points timed
    one after another each catch a different part of that drift, and a table of them can say
    T(5) < T(1); timed in turns, the drift lands on every callable alike, so their ratios hold
    while the absolute times move. `timer` replaces time_fn (tests inject a scripted one)."""
    check_int("rounds", rounds, 1)
    per_visit = dataclasses.replace(settings, max_reps=settings.min_reps)
    timer = timer or time_fn
    samples: dict[Any, list[float]] = {key: [] for key in fns}
    order = list(fns)
    rng = random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(order)
        for key in order:
            samples[key] += timer(fns[key], per_visit, device).samples_s
    return {key: summarize(s) for key, s in samples.items()}
