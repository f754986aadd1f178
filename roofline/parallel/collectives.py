"""Collectives timed as nccl-tests times them, and fitted as latency + bytes / bandwidth.

Definitions (nccl-tests doc/PERFORMANCE.md, https://github.com/NVIDIA/nccl-tests):
S is the operation's size in bytes — the buffer for all-reduce and broadcast, the TOTAL array
(per-rank count × n) for all-gather and reduce-scatter, the bytes one rank sends in all for
all-to-all; t the average time of one operation.

    algbw = S / t
    busbw = algbw × factor:  all-reduce 2(n−1)/n; reduce-scatter, all-gather, all-to-all (n−1)/n;
                             broadcast 1

Bus bandwidth is comparable with a link's bandwidth whatever n. How we time: per size, every
rank waits at a barrier, then runs `iters` operations back to back (gloo: synchronous; NCCL:
then synchronises the stream); the time of one op is the largest over ranks of elapsed/iters,
and the reported time the median over `reps` such loops.

In-step latency (`flush_bytes > 0`): inside a decode step a collective follows a layer that has
streamed its weights, so the collective's buffers, sockets and code are out of the caches and the
ranks arrive with the jitter of their compute. Then every timed operation is preceded, untimed, by
each rank streaming `flush_bytes` through a buffer, and only the operations are timed. On the
2-vCPU CI machine a 2 KB gloo all-reduce takes 0.26 ms back to back and 0.56 ms after a 64 MiB
flush. Fit per collective:
t(S) = latency + S / bw_alg, by non-negative least squares on relative residuals (so an 8 B and
a 256 MB point weigh the same).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from scipy.optimize import nnls

from roofline.measure.devices import is_cuda
from roofline.model.dtypes import dtype_bytes, dtype_name, torch_dtype
from roofline.io.fields import ConfigError, internal, option

if TYPE_CHECKING:
    import torch

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
SCHEMA = "roofline.collectives/1"


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth for `kind` on n ranks."""
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if kind in ("broadcast", "send_recv"):
        return 1.0
    raise ConfigError(f"collective={kind!r}: allowed {KINDS + ('send_recv',)}")


@dataclass(frozen=True)
class CollectiveRequest:
    kinds: tuple[str, ...] = option(KINDS, "collectives to time: a non-empty subset of " + " | ".join(KINDS))
    min_bytes: int = option(8, "smallest message size in bytes")
    max_bytes: int = option(64 * 2**20, "largest message size in bytes (64 MiB); on GPUs use 536870912 "
                                        "(hundreds of MB)")
    factor: int = option(4, "next size = factor x previous (nccl-tests -f)")
    dtype: str = option("float32", "element dtype of the messages")
    reps: int = option(7, "timed loops per size (median reported)")
    device: str = internal("cpu", "the torch device of the `device` group's entry (roofline/conf/device/)")
    world: int = option(2, "ranks (spawned here, or the count torchrun / srun started)")
    flush_bytes: int = option(0, "0: back to back (nccl-tests); > 0: stream this many bytes (untimed) before "
                                 "each timed op (in-step latency)")

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or not self.kinds:
            raise ConfigError(f"kinds={list(self.kinds)}: allowed a non-empty subset of {KINDS}")
        dtype_name(self.dtype)
        if self.world < 2:
            raise ConfigError(f"world={self.world}: a collective needs >= 2 ranks")
        if not 1 <= self.min_bytes <= self.max_bytes:
            raise ConfigError(f"min_bytes={self.min_bytes}, max_bytes={self.max_bytes}: need 1 <= min <= max")
        if self.factor < 2 or self.reps < 1:
            raise ConfigError(f"factor={self.factor}, reps={self.reps}: need factor >= 2, reps >= 1")
        if self.flush_bytes < 0:
            raise ConfigError(f"flush_bytes={self.flush_bytes}: need >= 0 (0: back to back)")

    def sizes(self) -> list[int]:
        """Sizes S in bytes, each a multiple of world × element size (rounded up)."""
        unit = self.world * dtype_bytes(self.dtype)
        out, s = [], self.min_bytes
        while s <= self.max_bytes:
            out.append(max(unit, math.ceil(s / unit) * unit))
            s *= self.factor
        return sorted(set(out))

    def default_out_dir(self, root) -> Path:
        return Path(root) / f"collectives-{self.device}-{self.world}"


def _op(kind: str, S: int, dtype: torch.dtype, n: int, device: str):
    import torch
    import torch.distributed as dist
    el = torch.finfo(dtype).bits // 8
    count = S // el
    x = torch.ones(count, dtype=dtype, device=device)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(x)
    if kind == "broadcast":
        return lambda: dist.broadcast(x, 0)
    if kind == "all_to_all":
        y = torch.empty_like(x)
        return lambda: dist.all_to_all_single(y, x)
    part = torch.ones(count // n, dtype=dtype, device=device)
    if kind == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(x, part)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return lambda: scatter(part, x)


def _iters(S: int) -> int:
    """Operations per timed loop: many for latency-sized messages, few for large ones."""
    return int(min(50, max(2, 2**22 // max(S, 1))))


def measure(rank: int, world: int, device: str, req: CollectiveRequest) -> list[dict] | None:
    """Run on every rank (roofline.parallel.launch.run); rank 0 returns one row per (kind, size)."""
    import torch  # torch and its process group start in the measuring ranks, not where bus_factor prices
    import torch.distributed as dist
    dtype = torch_dtype(req.dtype)
    sync = (lambda: torch.cuda.synchronize()) if is_cuda(device) else (lambda: None)
    flush = torch.zeros(req.flush_bytes // 4, dtype=torch.float32, device=device) if req.flush_bytes else None
    rows = []
    for kind in req.kinds:
        for S in req.sizes():
            fn, it = _op(kind, S, dtype, world, device), _iters(S)
            fn(), fn()  # warm-up (connections, buffers)
            sync()
            times = []
            if flush is not None:
                it = min(it, 10)
            for _ in range(req.reps):
                dist.barrier()
                elapsed = 0
                if flush is None:
                    t0 = time.perf_counter_ns()
                    for _ in range(it):
                        fn()
                    sync()
                    elapsed = time.perf_counter_ns() - t0
                else:
                    for _ in range(it):
                        flush.add_(1.0)
                        sync()
                        t0 = time.perf_counter_ns()
                        fn()
                        sync()
                        elapsed += time.perf_counter_ns() - t0
                # on the rank's device: NCCL reduces CUDA tensors only (gloo takes either)
                t = torch.tensor([elapsed / it / 1e9], dtype=torch.float64, device=device)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                times.append(float(t))
            med = float(np.median(times))
            algbw = S / med
            rows.append(dict(kind=kind, size_bytes=S, count=S // (torch.finfo(dtype).bits // 8), dtype=req.dtype,
                             ranks=world, iters=it, reps=req.reps, flush_bytes=req.flush_bytes, time_us=med * 1e6,
                             time_p10_us=float(np.quantile(times, 0.1)) * 1e6,
                             time_p90_us=float(np.quantile(times, 0.9)) * 1e6,
                             algbw_GBps=algbw / 1e9, busbw_GBps=algbw * bus_factor(kind, world) / 1e9,
                             bus_factor=bus_factor(kind, world)))
    return rows if rank == 0 else None


def fit(rows: list[dict]) -> dict:
    """Per collective: t = latency + S / bw_alg (and bw_bus = bw_alg × factor)."""
    out = {}
    for kind in sorted({r["kind"] for r in rows}):
        rs = [r for r in rows if r["kind"] == kind]
        S = np.array([r["size_bytes"] for r in rs], float)
        t = np.array([r["time_us"] for r in rs], float) * 1e-6
        X = np.column_stack([np.ones_like(S), S]) / t[:, None]
        scale = X.max(axis=0)
        c, _ = nnls(X / scale, np.ones_like(t))
        lat, inv_bw = c / scale
        pred = lat + inv_bw * S
        n, f = rs[0]["ranks"], bus_factor(kind, rs[0]["ranks"])
        out[kind] = dict(latency_us=float(lat * 1e6), algbw_GBps=float(1 / inv_bw / 1e9) if inv_bw > 0 else math.inf,
                         busbw_GBps=float(f / inv_bw / 1e9) if inv_bw > 0 else math.inf, ranks=n, bus_factor=f,
                         points=len(rs), median_abs_err_pct=float(np.median(np.abs(pred / t - 1)) * 100),
                         sizes_bytes=[int(S.min()), int(S.max())])
    return out


def seconds(collectives, fitted: dict) -> float:
    """Time of a forward's collectives (roofline.parallel.cost.Collective list) from a fit;
    a point-to-point send is priced as a broadcast (one sender, algbw = busbw)."""
    total = 0.0
    for c in collectives:
        kind = "broadcast" if c.kind == "send_recv" else c.kind
        if kind not in fitted:
            raise ConfigError(f"collectives fit has no {kind!r} (measured: {sorted(fitted)})")
        f = fitted[kind]
        total += c.count * (f["latency_us"] * 1e-6 + c.size_bytes / (f["algbw_GBps"] * 1e9))
    return total


def document(req: CollectiveRequest, rows: list[dict], device_name: str) -> dict:
    return dict(schema=SCHEMA, spec=asdict(req), device_name=device_name, rows=rows, fit=fit(rows),
                definitions="algbw = S/t; busbw = algbw x factor (nccl-tests doc/PERFORMANCE.md): all_reduce "
                            "2(n-1)/n, all_gather/reduce_scatter/all_to_all (n-1)/n, broadcast 1")


def load(path) -> dict:
    doc = json.loads(open(path).read())
    if doc.get("schema") != SCHEMA:
        raise ConfigError(f"collectives={str(path)!r}: schema {doc.get('schema')!r}, expected {SCHEMA!r}")
    return doc


def table(rows: list[dict]) -> str:
    """The nccl-tests layout: size, count, type, time, algbw, busbw."""
    lines = [f"{'collective':>15} {'size(B)':>11} {'count':>10} {'type':>8} {'time(us)':>10} {'algbw(GB/s)':>12} "
             f"{'busbw(GB/s)':>12}"]
    for r in rows:
        lines.append(f"{r['kind']:>15} {r['size_bytes']:>11} {r['count']:>10} {r['dtype']:>8} {r['time_us']:>10.1f} "
                     f"{r['algbw_GBps']:>12.3f} {r['busbw_GBps']:>12.3f}")
    return "\n".join(lines)


def run_collectives(req: CollectiveRequest, out_dir) -> dict:
    """Spawn (or join, under torchrun/srun) req.world ranks, measure, write collectives.json and
    collectives.csv into out_dir; returns the document."""
    import pandas as pd

    from roofline.io.files import write_csv_atomic, write_json_atomic
    from roofline.measure.devices import running_device_name
    from roofline.parallel.launch import run

    rows = run(measure, req.world, req.device, (req,))
    if rows is None:  # a non-zero rank of an external launch
        return {}
    doc = document(req, rows, running_device_name(req.device))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "collectives.json", doc)
    write_csv_atomic(pd.DataFrame(rows), out / "collectives.csv")
    return doc
