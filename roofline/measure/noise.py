"""Busy-machine detection for a sweep: notice, re-measure, mark.

A step time is only a property of the device when nothing else runs on it. Other processes on
the same cores (a shared CI machine, a build beside the sweep) or thermal throttling slow
the timed call and spread its repetitions, and a fit of such points reports them without a
word. Three signals, none of which costs a quiet run more than about a percent:

- the point's own spread: CV of its repetitions above `max_cv`;
- the point's own CPU share (CPU devices): the timer's process CPU time / (wall × threads)
  over the point's repetitions below `min_cpu_share`. A competitor that runs for the whole of
  one point slows every repetition alike (low CV) and may be gone by the next reference, so
  this is the signal that catches it;
- an interleaved reference: every `every` points the same fixed memory-bound call (a sum
  over a buffer larger than the caches) is timed again; slower than the quietest time seen in
  this run by more than `max_drift` means the machine changed under the points measured
  since the last reference (busy or throttling);
- the reference's CPU share: process CPU time / (wall time × threads) while it runs. The
  intra-op threads work (or spin) the whole time on an idle machine, so a share well below 1
  means the scheduler gave our threads' cores to someone else, even if the whole run is busy
  and the reference never looks slower than itself.

Nothing is held back: the sweep writes each row the moment it is measured (a run cut short by
Ctrl-C, SIGTERM or a time limit keeps every finished point), with `noisy` null (not judged
yet). The monitor remembers the last `every` points; when their window is judged it returns
one correction per point (its verdict: `noisy`, the reason, the reference's drift and CPU
share) that the sweep appends to the run folder's corrections file and the readers apply
(roofline.io.results.apply_corrections). A point of a busy window is measured again once the
reference says the machine is quiet; the new measurement is a correction too (the whole
timed row, `remeasured` = the attempt), and a point that stays busy is marked `noisy` with
the reason. The run folder gets noise.json and the console a warning;
roofline.analysis.costmodel leaves marked points out of the fit. A row whose window was never
judged (the run stopped first) keeps `noisy` null.

On CUDA the reference is a sum over a buffer several times the device's L2 (so it reads HBM,
not the cache), timed with CUDA events on the current stream (device time, not host jitter).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from roofline.io.fields import check_int, check_number, option
from roofline.measure.devices import is_cuda


@dataclass(frozen=True)
class NoiseSettings:
    every: int = option(6, "points between interleaved reference measurements")
    max_cv: float = option(0.25, "a point's repetitions spread more than this: re-measure, else mark noisy")
    max_drift: float = option(0.30, "reference slower than its quietest time in the run by more than this: busy")
    min_cpu_share: float = option(0.80, "reference got less of its threads' CPU time than this: busy")
    retries: int = option(2, "re-measurements of a busy window before its points are marked noisy")
    give_up: int = option(2, "after this many busy windows in a row, mark without retrying until a quiet check")
    settle_s: float = option(1.0, "wait before a retry (at most as long as the window took), to let a burst pass")
    ref_bytes: int = option(48 * 2**20, "the reference buffer, bytes (larger than a CPU's L3; on CUDA at least "
                                        "4x the L2)")
    ref_reps: int = option(3, "timed reads of the reference buffer per check")

    def __post_init__(self) -> None:
        for name in ("every", "ref_reps"):
            check_int(f"noise.{name}", getattr(self, name), 1)
        for name in ("retries", "give_up"):
            check_int(f"noise.{name}", getattr(self, name), 0)
        check_int("noise.ref_bytes", self.ref_bytes, 1)
        check_number("noise.max_cv", self.max_cv, 0.0, lo_open=True)
        check_number("noise.max_drift", self.max_drift, 0.0, lo_open=True)
        check_number("noise.min_cpu_share", self.min_cpu_share, 0.0, 1.0)
        check_number("noise.settle_s", self.settle_s, 0.0)


CUDA_L2_MULTIPLE = 4  # the CUDA reference reads at least this many times the device's L2


def reference_bytes(device: str, requested: int) -> int:
    """The reference buffer's size: `requested`, raised on CUDA to CUDA_L2_MULTIPLE x the
    device's L2 (queried from the driver) so that it measures device memory, not the cache."""
    if not is_cuda(device):
        return requested
    l2 = int(getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 0) or 0)
    return max(requested, CUDA_L2_MULTIPLE * l2)


@dataclass
class Reference:
    """Timed repetitions of one fixed call, with the CPU share the process got meanwhile."""
    device: str
    nbytes: int
    reps: int
    buf: torch.Tensor = field(init=False)
    cuda: bool = field(init=False)

    def __post_init__(self) -> None:
        self.cuda = is_cuda(self.device)  # read once, outside the timed loop
        self.nbytes = reference_bytes(self.device, self.nbytes)
        self.buf = torch.ones(self.nbytes // 4, dtype=torch.float32, device=self.device)

    def _cuda_once(self) -> float:
        """Device seconds of one sum, between two CUDA events on the current stream."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.buf.sum()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def __call__(self) -> tuple[float, float]:
        """(median seconds, CPU share in [0, ~1]; 1.0 on CUDA, where the host's share says nothing)."""
        times, cpu, wall = [], 0.0, 0.0
        self.buf.sum()  # warm-up
        if self.cuda:
            torch.cuda.synchronize()
            return statistics.median(self._cuda_once() for _ in range(self.reps)), 1.0
        for _ in range(self.reps):
            c0, t0 = time.process_time(), time.perf_counter()
            self.buf.sum()
            t1, c1 = time.perf_counter(), time.process_time()
            times.append(t1 - t0)
            cpu, wall = cpu + (c1 - c0), wall + (t1 - t0)
        share = cpu / (wall * torch.get_num_threads()) if wall > 0 else 1.0
        return statistics.median(times), share


@dataclass
class _Seen:
    """A point of the current window: what was written for it, and how to measure it again."""
    row: dict
    remeasure: Callable[[], dict] | None
    point_id: str = ""


class NoiseMonitor:
    """Watches the sweep's per-point loop without holding anything back: the sweep writes each
    row at once, then calls `add(row, remeasure)`; `flush` at the end of a workload (while it
    can still re-measure), `finish` once. `add` and `flush` return corrections
    (dict(point_id, set={fields}, samples=[...] or None)) to append to the run folder."""

    def __init__(self, settings: NoiseSettings = NoiseSettings(), device: str = "cpu", log=print,
                 reference: Callable[[], tuple[float, float]] | None = None):
        self.s, self.log = settings, log
        self.reference = reference or Reference(device, settings.ref_bytes, settings.ref_reps)
        self.window: list[_Seen] = []
        self.quietest = float("inf")
        self.checks: list[dict] = []
        self.counts = dict(points=0, flagged=0, remeasured=0, noisy=0)
        self.busy_streak = 0  # busy windows in a row: a machine that stays busy is not retried
        self.own_s = 0.0  # time spent on references and waits: the monitor's cost
        self.check()
        self.window_start = time.perf_counter()

    def check(self) -> dict:
        t0 = time.perf_counter()
        ref_s, share = self.reference()
        self.own_s += time.perf_counter() - t0
        self.quietest = min(self.quietest, ref_s)
        drift = ref_s / self.quietest - 1.0
        why = []
        if drift > self.s.max_drift:
            why.append(f"reference {1 + drift:.2f}x its quietest time in this run")
        if share < self.s.min_cpu_share:
            why.append(f"reference got {100 * share:.0f}% of its threads' CPU time")
        c = dict(time_s=time.time(), ref_s=ref_s, drift=drift, cpu_share=share, busy=bool(why), why="; ".join(why))
        self.checks.append(c)
        return c

    def add(self, row: dict, remeasure: Callable[[], dict] | None = None) -> list[dict]:
        """A row that is already written; the window's corrections once it is full."""
        self.counts["points"] += 1
        self.window.append(_Seen(row, remeasure, row.get("point_id")))
        return self.flush() if len(self.window) >= self.s.every else []

    def _spread(self, row: dict) -> str:
        """The point's own signals: its repetitions' spread and the CPU share its threads got."""
        if row.get("status", "ok") != "ok":
            return ""
        cv, share = row.get("t_cv"), row.get("t_cpu_share")
        why = []
        if cv is not None and cv == cv and cv > self.s.max_cv:
            why.append(f"CV {cv:.2f} > {self.s.max_cv}")
        if share is not None and share == share and share < self.s.min_cpu_share:
            why.append(f"its threads got {100 * share:.0f}% of their CPU time")
        return "; ".join(why)

    def _again(self, h: _Seen, attempt: int) -> dict | None:
        """A fresh measurement of h's point, or None when it failed (the written row stands)."""
        try:
            fresh = h.remeasure()
        except Exception as e:  # a re-measurement that fails never takes the first one with it
            self.log(f"noise: re-measuring {h.row.get('point_id')} failed ({type(e).__name__}: {e}); "
                     "its first measurement stands")
            h.remeasure = None
            return None
        if fresh.get("status", "ok") != "ok":
            h.remeasure = None
            return None
        return {**fresh, "remeasured": attempt + 1}

    def flush(self) -> list[dict]:
        """Judge the window against a fresh reference; re-measure busy or spread points.
        Returns one correction per point of the window (its verdict, and its new
        measurement where it was measured again)."""
        if not self.window:
            return []
        c = self.check()
        bad = [h for h in self.window if h.row.get("status", "ok") == "ok" and (c["busy"] or self._spread(h.row))]
        reasons = {id(h): c["why"] if c["busy"] else self._spread(h.row) for h in bad}
        fresh: dict[int, dict] = {}
        self.counts["flagged"] += len(bad)
        if bad:
            self.log(f"noise: {len(bad)} point(s) timed on a busy machine "
                     f"({c['why'] or self._spread(bad[0].row)}); re-measuring")
        self.busy_streak = self.busy_streak + 1 if c["busy"] else 0
        retries = 0 if self.busy_streak > self.s.give_up else self.s.retries
        for attempt in range(retries):
            bad = [h for h in bad if h.remeasure is not None]
            if not bad:
                break
            if c["busy"]:
                wait = min(self.s.settle_s, time.perf_counter() - self.window_start)
                time.sleep(wait)
                self.own_s += wait
                c = self.check()
                if c["busy"]:
                    continue
                self.busy_streak = 0
            for h in bad:
                again = self._again(h, attempt)
                if again is not None:
                    fresh[id(h)] = h.row = again
                    self.counts["remeasured"] += 1
            c = self.check()
            still = [h for h in bad if c["busy"] or self._spread(h.row)]
            reasons.update({id(h): c["why"] if c["busy"] else self._spread(h.row) for h in still})
            bad = still
        noisy = {id(h) for h in bad} | {id(h) for h in self.window if id(h) in reasons and h.remeasure is None}
        out = []
        for h in self.window:
            marked = id(h) in noisy
            self.counts["noisy"] += marked
            verdict = dict(noisy=marked, noise_reason=reasons.get(id(h)) if marked else None,
                           ref_drift=c["drift"], ref_cpu_share=c["cpu_share"])
            new = dict(fresh.get(id(h), {}))
            samples = new.pop("_samples", None)
            out.append(dict(point_id=h.point_id, set={**new, **verdict}, samples=samples))
        self.window = []
        self.window_start = time.perf_counter()
        return out

    def summary(self) -> dict:
        return dict(settings=asdict(self.s), **self.counts, monitor_s=round(self.own_s, 3),
                    busy_checks=sum(c["busy"] for c in self.checks), checks=self.checks)

    def finish(self, run_dir: Path | None = None) -> dict:
        """noise.json in the run folder; a console warning when anything was busy."""
        out = self.summary()
        if run_dir is not None:
            Path(run_dir, "noise.json").write_text(json.dumps(out, indent=1))
        if out["busy_checks"] or out["flagged"]:
            self.log(f"WARNING noise: the machine was busy or throttling during this sweep: "
                     f"{out['busy_checks']} of {len(self.checks)} reference checks busy, {out['flagged']} of "
                     f"{out['points']} points flagged, {out['remeasured']} re-measurements, {out['noisy']} points "
                     f"marked noisy (the fit leaves them out while at least 2/3 of the points are clean); see noise.json")
        return out
