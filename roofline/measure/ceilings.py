"""Measured ceilings: the memory and compute roofs of THIS device, by kernels that only do one.

A roofline point is judged against the bandwidth and FLOP rate the device really reaches,
beside the datasheet's. Memory: the bandwidth kernels of roofline.measure.kernels (read, write,
copy, triad; torch lines always, Triton lines on CUDA) stream working sets from a few
hundred KiB, which live in cache, to well past the last-level cache, which do not; the
memory ceiling is the best of them at working sets >= 4x the cache with the cache flushed
between reps (l2 "cold"). Compute: square matmuls per dtype. Between the two sit the
decode-shaped GEMMs a forward pass really runs, x[M,K] @ W[N,K]^T at a preset's (N, K) for
small M: at M=1 they should read W at close to the memory ceiling, and as M grows they cross
the ridge I* = F_peak / BW_peak. The same shapes run once more per quantized weight format
(`formats`, M = B·(k+1) of a decode or verify step) through the packed kernel that format
runs on this device (roofline.model.quant): the roof a quantized sweep can reach. Their bytes
are the format's exact bytes (scales and zero points included) plus the bf16 input and
output; a format without a fast kernel here is recorded in `failures` as unsupported.

Conventions. bytes_moved = bytes read + bytes written (BabelStream, and a datasheet's
bandwidth). working_set_bytes = the bytes of all buffers a kernel touches. GEMM FLOPs =
2·M·N·K; GEMM bytes = (M·K + N·K + M·N)·element size (inputs read once, output written
once). GB/s = bytes / median seconds / 1e9; TFLOP/s = FLOPs / median / 1e12. Square GEMMs are
timed with a warm cache (they are compute-bound); decode GEMMs cold, since a forward pass
reads each layer's weights from DRAM/HBM once. Every kernel is checked before it is timed:
a kernel that fails its check is recorded in `failures` and never timed.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd
import torch

from roofline.measure import cpu_gemm, kernels

from roofline.io import files
from roofline.measure import provenance
from roofline.io.fields import ConfigError, check_fields, internal, option

from roofline.measure import timer
from roofline.model.dtypes import MODEL_DTYPES, dtype_bytes, dtype_name, torch_dtype
from roofline.model.config import ModelConfig
from roofline.model.formats import parse_format, precision
from roofline.model.presets import get_preset
from roofline.measure.devices import last_level_cache_bytes, parse_device, datasheet_for_running_device
from roofline.measure.telemetry import Telemetry

SCHEMA_VERSION = 1
KiB, MiB, GiB = 2**10, 2**20, 2**30
DECODE_MS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LARGE_FACTOR = 4  # a working set >= 4x the cache is served by DRAM/HBM
CHECK_ELEMS = 3 * 8192 + 5  # several blocks and a ragged tail for every dtype
CHECK_SLICE = 32  # rows and columns of a GEMM result checked against float64

BANDWIDTH_COLUMNS = ["kernel", "variant", "dtype", "l2", "working_set_bytes", "bytes_moved",
                     "t_median_s", "t_p10_s", "t_p90_s", "GBps", "pct_datasheet"]
MATMUL_COLUMNS = ["kind", "name", "dtype", "M", "N", "K", "t_median_s", "TFLOPs", "GBps",
                  "pct_datasheet_flops", "kernel"]
TOP_KEYS = ["schema_version", "provenance", "datasheet", "bandwidth", "matmul", "telemetry",
            "failures", "summary"]
SUMMARY_KEYS = ["mem_bw_GBps", "mem_bw_kernel", "peak_tflops", "ridge_measured", "cache_bytes"]

# Device defaults; (default, quick); `full=true` takes the _FULL_* sets instead of the default ones.
_TIMERS = {
    "cpu": (timer.TimerSettings(warmup=2, min_reps=5, max_reps=30, rel_ci=0.03, budget_s=0.2),
            timer.TimerSettings(warmup=1, min_reps=3, max_reps=10, rel_ci=0.05, budget_s=0.1)),
    "cuda": (timer.TimerSettings(warmup=5, min_reps=10, max_reps=200, rel_ci=0.01, budget_s=0.5,
                                  mode="graph"),
             timer.TimerSettings(warmup=2, min_reps=5, max_reps=50, rel_ci=0.02, budget_s=0.2,
                                  mode="graph")),
}
_WORKING_SETS = {  # a 2-core CPU waits <= 90 s for the default, <= 30 s for quick (one large set: the roof)
    "cpu": ((1 * MiB, 16 * MiB, 256 * MiB), (256 * MiB,)),
    "cuda": (tuple(2**p for p in range(18, 31)), (1 * MiB, 16 * MiB, 256 * MiB, 1 * GiB)),
}
_FULL_WORKING_SETS = {"cpu": tuple(2**p for p in range(18, 30)), "cuda": tuple(2**p for p in range(18, 31))}
_DEFAULT_MS = {"cpu": (1, 4, 16, 64, 256), "cuda": DECODE_MS}
_DEFAULT_DTYPES = {"cpu": ("bfloat16", "float32"), "cuda": ("bfloat16", "float16", "float32")}
_SQUARE = {"cpu": ((1024, 2048), (1024,)), "cuda": ((4096, 8192), (4096,))}
_DECODE_MODEL = {"cpu": "cpu-demo", "cuda": "llama-3.1-8b"}
_FORMATS = {"cpu": ("int8", "int4_g128"), "cuda": ("int4_g128", "fp8", "fp8_e4m3_b128")}
_QUICK_MS = (1, 4, 16, 128)  # 4: where the skinny CPU GEMM's crossover falls on some machines (cpu_gemm.crossovers)


def decode_gemm_shapes(cfg: ModelConfig) -> list[tuple[str, int, int]]:
    """(name, N, K) of the linears one decode step runs, as nn.Linear weights W[N, K].

    GQA: fused QKV (h + 2·h_kv)·d_h x d, o_proj d x h·d_h, the SwiGLU up (gate has the same
    shape) and down, the LM head. MLA replaces QKV by its low-rank projections; MoE adds the
    expert shapes (moe_ffn) and keeps the dense FFN only if some layer has one.
    """
    d = cfg.d
    if cfg.is_mla:
        qk = cfg.qk_nope_dim + cfg.qk_rope_dim
        attn = ([("q_a_proj", cfg.q_lora_rank, d), ("q_b_proj", cfg.heads * qk, cfg.q_lora_rank)]
                if cfg.q_lora_rank else [("q_proj", cfg.heads * qk, d)])
        attn += [("kv_a_proj", cfg.kv_lora_rank + cfg.qk_rope_dim, d),
                 ("kv_b_proj", cfg.heads * (cfg.qk_nope_dim + cfg.v_head_dim), cfg.kv_lora_rank),
                 ("o_proj", d, cfg.heads * cfg.v_head_dim)]
    else:
        attn = [("qkv_proj", (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim, d),
                ("o_proj", d, cfg.heads * cfg.head_dim)]
    ffn = []
    if cfg.has_dense_layers:
        ffn += [("ffn_up", cfg.ffn, d), ("ffn_down", d, cfg.ffn)]
    if cfg.is_moe:
        ffn += [("expert_up", cfg.moe_ffn, d), ("expert_down", d, cfg.moe_ffn)]
    return attn + ffn + [("lm_head", cfg.vocab, d)]


# --------------------------------------------------------------------------- the request


def _device_kind(device: str) -> str:
    return parse_device(device).type


def _ints(field: str, values, lo: int) -> tuple[int, ...]:
    out = tuple(values)
    bad = [v for v in out if isinstance(v, bool) or not isinstance(v, int) or v < lo]
    if not out or bad:
        raise ConfigError(f"ceilings.{field}={list(out)!r}: allowed a non-empty list of "
                          f"integers >= {lo}")
    return out


@dataclass(frozen=True)
class CeilingsRequest:
    """What to measure. None fields take the device's default (see the tables above) when the
    request is built, so a built request is concrete, validated and recorded as it ran."""

    device: str = internal("cpu", "the torch device of the `device` group's entry (roofline/conf/device/)")
    quick: bool = option(False, "a reduced set: one large working set, 3 decode M (<= 30 s on a 2-core CPU)")
    full: bool = option(False, "every working set 256 KiB..512 MiB and every decode M: the whole "
                               "cache-to-DRAM curve (the default: 1, 16, 256 MiB; <= 90 s on 2 cores)")
    busy_check: bool = option(True, "busy-machine reference after each group (roofline.measure.noise): a busy "
                                    "group is re-measured, then marked busy")
    dtypes: tuple[str, ...] | None = option(None, "matmul dtypes; null: [bfloat16, float32] on cpu; "
                                                  "[bfloat16, float16, float32] on cuda")
    bandwidth_dtypes: tuple[str, ...] | None = option(None, "bandwidth kernel dtypes; null: [float32] on cpu "
                                                            "(bytes are bytes); the matmul dtypes on cuda")
    working_sets: tuple[int, ...] | None = option(None, "bytes of all buffers of a kernel; null: cpu 1, 16, "
                                                        "256 MiB (full: powers of two 256 KiB..512 MiB); "
                                                        "cuda 256 KiB..1 GiB")
    l2_modes: tuple[str, ...] = option(("cold", "warm"), "cache states the kernels are timed in: a non-empty "
                                                         "subset of cold | warm")
    kernels: tuple[str, ...] | None = option(None, "names from roofline.measure.kernels.KERNELS; null: torch_* "
                                                   "(+ triton_* on cuda)")
    square_sizes: tuple[int, ...] | None = option(None, "square matmul sizes; null: 1024, 2048 (cpu), "
                                                        "4096, 8192 (cuda)")
    decode_model: ModelConfig | None = option(None, "preset whose (N, K) the decode GEMMs use; null: cpu-demo "
                                                    "(cpu), llama-3.1-8b (cuda)")
    decode_ms: tuple[int, ...] | None = option(None, "tokens M of the decode GEMMs; null: 1, 4, 16, 64, 256 "
                                                     "(cpu; full and cuda: 1, 2, 4, ..., 256); [] for none")
    formats: tuple[str, ...] | None = option(None, "quantized weight formats of the decode GEMMs (M = B·(k+1)); "
                                                   "null: [int8, int4_g128] on cpu, [int4_g128, fp8, "
                                                   "fp8_e4m3_b128] on cuda; [] for none")
    timer: timer.TimerSettings | None = option(None, "timer settings (roofline/conf/timer/); a null field: the "
                                                     "device's own default (cpu / cuda tables, quick or not)")
    # seconds one GEMM's timed calls may take, judged from its first (checked) call (and a second
    # where the first may hold one-time costs) or a smaller square's; a GEMM over
    # it is skipped (ceilings.json `failures`, stage "skipped") with the larger ones of its kind:
    # on a Zen 1 EPYC torch's bfloat16 matmul is a scalar fallback at ~1 GFLOP/s, so one 2048^3
    # call takes ~20 s and the default run, without this, took over 11 minutes. 0: no limit;
    # None: 5 s, 2 s with quick (a GEMM of 1024^3 over 5 s in 7 calls runs below 3 GFLOP/s: a
    # fallback path, not a ceiling).
    gemm_budget_s: float | None = option(None, "seconds one GEMM's timed calls may take, judged from its first "
                                               "call: over it the GEMM (and the larger ones of its kind) is "
                                               "skipped and listed in failures; null: 5 (quick: 2); 0: no limit")

    def __post_init__(self) -> None:
        kind = _device_kind(self.device)
        quick = 1 if self.quick else 0
        fill = lambda f, v: object.__setattr__(self, f, v)  # noqa: E731  (frozen: fill defaults)
        fill("dtypes", _dtypes("dtypes", self.dtypes or _DEFAULT_DTYPES[kind]))
        default_bw = ("float32",) if kind == "cpu" else self.dtypes
        fill("bandwidth_dtypes", _dtypes("bandwidth_dtypes", self.bandwidth_dtypes or default_bw))
        if self.full and self.quick:
            raise ConfigError("ceilings.full=true with quick=true: allowed one of them")
        sets = _FULL_WORKING_SETS[kind] if self.full else _WORKING_SETS[kind][quick]
        fill("working_sets", _ints("working_sets", self.working_sets or sets, KiB))
        bad_l2 = [m for m in self.l2_modes if m not in timer.L2_MODES]
        if not self.l2_modes or bad_l2:
            raise ConfigError(f"ceilings.l2_modes={list(self.l2_modes)!r}: allowed a non-empty "
                              f"subset of {timer.L2_MODES}")
        fill("l2_modes", tuple(self.l2_modes))
        fill("kernels", tuple(self.kernels) if self.kernels is not None else default_kernels(kind))
        _check_kernels(self.kernels, kind)
        fill("square_sizes", _ints("square_sizes", self.square_sizes or _SQUARE[kind][quick], 1))
        if self.decode_model is None:
            fill("decode_model", get_preset(_DECODE_MODEL[kind]))
        ms = self.decode_ms if self.decode_ms is not None else (
            _QUICK_MS if quick else DECODE_MS if self.full else _DEFAULT_MS[kind])
        fill("decode_ms", _ints("decode_ms", ms, 1) if ms else ())
        formats = (() if quick and kind == "cpu" else _FORMATS[kind]) if self.formats is None else self.formats
        fill("formats", tuple(parse_format(f).name for f in formats))
        settings = self.timer or _TIMERS[kind][quick]
        if kind == "cpu" and settings.mode == "graph":
            raise ConfigError("ceilings.timer.mode='graph': CUDA-graph replay needs CUDA; "
                              "on device='cpu' allowed ('eager',)")
        fill("timer", settings)
        if self.gemm_budget_s is None:
            fill("gemm_budget_s", 2.0 if self.quick else 5.0)
        if not isinstance(self.gemm_budget_s, (int, float)) or isinstance(self.gemm_budget_s, bool) or self.gemm_budget_s < 0:
            raise ConfigError(f"ceilings.gemm_budget_s={self.gemm_budget_s!r}: allowed a number of seconds >= 0 (0: no limit)")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "CeilingsRequest":
        """From a plain dict (a composed config): None means default, lists become tuples,
        `decode_model` is a preset name, `timer` a dict of TimerSettings fields (None: default)."""
        check_fields(cls, raw, "ceilings")
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items()}
        device = kw.get("device", "cpu")
        kind = _device_kind(str(device))
        if isinstance(kw.get("decode_model"), str):
            kw["decode_model"] = get_preset(kw["decode_model"])
        given = kw.get("timer")
        if isinstance(given, Mapping):
            check_fields(timer.TimerSettings, given, "ceilings.timer")
            base = _TIMERS[kind][1 if kw.get("quick") else 0]
            given = {k: v for k, v in given.items() if v is not None}
            kw["timer"] = dataclasses.replace(base, **given) if given else None
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["decode_model"] = self.decode_model.name
        return out


def _dtypes(field: str, values) -> tuple[str, ...]:
    out = []
    for d in values:
        try:
            out.append(dtype_name(d))
        except (ValueError, TypeError):
            raise ConfigError(f"ceilings.{field}: unknown dtype {d!r}; allowed "
                              f"{list(MODEL_DTYPES)} (or bf16/fp16/fp32)") from None
    return tuple(out)


def default_kernels(kind: str) -> tuple[str, ...]:
    """torch lines always; Triton lines on CUDA only (the CPU interpreter is far too slow to time)."""
    use_triton = kind == "cuda" and kernels.triton_available()
    return tuple(n for n, k in kernels.KERNELS.items() if not k.uses_triton or use_triton)


def _check_kernels(names: tuple[str, ...], kind: str) -> None:
    unknown = [n for n in names if n not in kernels.KERNELS]
    if unknown or not names:
        raise ConfigError(f"ceilings.kernels: unknown {unknown or '[]'}; allowed a non-empty "
                          f"subset of {list(kernels.KERNELS)}")
    triton_rows = [n for n in names if kernels.KERNELS[n].uses_triton]
    if triton_rows and not kernels.triton_available():
        raise ConfigError(f"ceilings.kernels: {triton_rows} need triton and a CUDA device "
                          "(or TRITON_INTERPRET=1); allowed here: the torch_* kernels")


# --------------------------------------------------------------------------- measuring


def _datasheet(device: str) -> tuple[dict | None, Any]:
    row, matched = datasheet_for_running_device(device)
    if row.measured_only or not matched:
        return None, row
    peak = {d: (None if row.peak_flops(d) is None else row.peak_flops(d) / 1e12)
            for d in MODEL_DTYPES}
    return {"key": row.key, "name": row.name, "mem_bw_GBps": row.mem_bw_GBps,
            "peak_tflops": peak, "cache_bytes": row.cache_bytes()}, row


def _cache_bytes(req: CeilingsRequest, datasheet: dict | None) -> int:
    """The cache a large working set must exceed and the cold flush must evict: the timer's
    l2_bytes if set, else the larger of the datasheet's last-level cache and the queried or
    default cache (timer.resolve_l2_bytes)."""
    if req.timer.l2_bytes > 0:
        return req.timer.l2_bytes
    sheet = (datasheet or {}).get("cache_bytes") or 0
    return max(int(sheet), timer.resolve_l2_bytes(req.device, req.timer))


def _arrays(k: kernels.CeilingKernel, elem: int) -> int:
    """How many arrays of n elements a kernel streams (read 1, write 1, copy 2, triad 3)."""
    n = MiB
    return max(1, round(k.bytes_moved(n, elem) / (n * elem)))


def _footprint(bufs: kernels.Buffers) -> int:
    return sum(t.numel() * t.element_size() for t in bufs.values())


def _failure(stage: str, error: BaseException, **where) -> dict:
    return {**where, "stage": stage, "error": f"{type(error).__name__}: {error}"}


def _pct(value: float, ceiling: float | None) -> float | None:
    return None if not ceiling else 100.0 * value / ceiling


class _Run:
    """What every measured group goes through: a progress bar over kernels and working sets, the
    busy-machine check (roofline.measure.noise: a reference after each group; a busy group is
    measured once more, and its rows marked `busy` with the reason if the machine stays busy), and
    an atomic rewrite of ceilings.json after each group, so that a cut run keeps what it measured."""

    def __init__(self, req: "CeilingsRequest", total: int, progress: bool, checkpoint: Callable[[], None] | None,
                 monitor=None):
        from tqdm import tqdm
        self.bar = tqdm(total=total, desc=f"ceilings {req.device}", unit="set", disable=not progress,
                        file=sys.stderr, leave=False)
        self.checkpoint, self.busy = checkpoint, []
        if monitor is None and req.busy_check:
            from roofline.measure.noise import NoiseMonitor, NoiseSettings
            monitor = NoiseMonitor(NoiseSettings(), req.device, log=lambda m: None)
        self.monitor = monitor

    def group(self, name: str, measure: Callable[[], list[dict]]) -> list[dict]:
        rows = measure()
        if self.monitor is not None:
            c = self.monitor.check()
            if c["busy"]:
                self.bar.write(f"  {name}: the machine was busy ({c['why']}); measuring again", file=sys.stderr)
                self.again = True  # the bar counts each set once
                try:
                    rows = measure()
                finally:
                    self.again = False
                c = self.monitor.check()
            if c["busy"]:
                self.busy.append({"group": name, "why": c["why"]})
                rows = [{**r, "busy": c["why"]} for r in rows]
        return rows

    again = False

    def step(self, n: int = 1, what: str = "") -> None:
        if not self.again:
            self.bar.update(n)
        if what:
            self.bar.set_postfix_str(what, refresh=False)

    def done_group(self) -> None:
        if self.checkpoint is not None:
            self.checkpoint()

    def close(self) -> None:
        self.bar.close()


def _measure_bandwidth(req: CeilingsRequest, cache: int, sheet: dict | None, tel: Telemetry,
                       failures: list, log: Callable[[str], None], run: _Run, rows: list[dict]) -> list[dict]:
    dev = torch.device(req.device)
    bw_sheet = (sheet or {}).get("mem_bw_GBps")
    for name in req.kernels:
        k = kernels.KERNELS[name]
        for dt in req.bandwidth_dtypes:
            tdtype, elem = torch_dtype(dt), dtype_bytes(dt)
            with tel.block(f"bandwidth/{name}/{dt}"):
                try:
                    kernels.check(k, CHECK_ELEMS, tdtype, dev)
                except Exception as e:  # wrong results: never timed
                    failures.append(_failure("check", e, kernel=name, dtype=dt))
                    log(f"  {name} {dt}: check FAILED, not timed: {e}")
                    run.step(len(req.working_sets))
                    continue

                def one_group(k=k, dt=dt, tdtype=tdtype, elem=elem, name=name) -> list[dict]:
                    out = []
                    for ws in req.working_sets:
                        bufs = None
                        try:
                            n = -(-ws // (_arrays(k, elem) * elem))  # footprint >= ws
                            bufs = k.make_buffers(n, tdtype, dev)
                            moved, footprint = k.bytes_moved(n, elem), _footprint(bufs)
                            for l2 in req.l2_modes:
                                settings = dataclasses.replace(req.timer, l2=l2, l2_bytes=cache)
                                r = timer.time_fn(lambda: k.run(bufs), settings, dev)
                                out.append({
                                    "kernel": name, "variant": k.variant, "dtype": dt, "l2": l2,
                                    "working_set_bytes": footprint, "bytes_moved": moved,
                                    "t_median_s": r.median_s, "t_p10_s": r.p10_s, "t_p90_s": r.p90_s,
                                    "GBps": moved / r.median_s / 1e9,
                                    "pct_datasheet": _pct(moved / r.median_s / 1e9, bw_sheet),
                                })
                        except Exception as e:  # OOM, unsupported: a failure row, and go on
                            failures.append(_failure("time", e, kernel=name, dtype=dt,
                                                     working_set_bytes=ws))
                        finally:
                            bufs = None
                        run.step(1, f"{name} {ws / MiB:g} MiB")
                    return out

                rows += run.group(f"{name}/{dt}", one_group)
            run.done_group()
            log(f"  {name} {dt}: {len(req.working_sets)} working sets x {list(req.l2_modes)}")
    return rows


def check_gemm(out: torch.Tensor, a: torch.Tensor, b_kn: torch.Tensor) -> None:
    """out = a @ b_kn, checked on its top-left CHECK_SLICE² block against float64.

    Inputs are exact in their dtype, so the error is accumulation plus rounding: fp32
    accumulation over K terms, worst case K·eps32·Σ|a·b|; the rounding of the output and of
    split-K partial sums (CUDA's reduced-precision reductions), each <= eps(dtype)·Σ|a·b|.
    tol = (2·eps(dtype) + K·eps32) · (|a| @ |b|), elementwise.
    """
    m, n = min(out.shape[0], CHECK_SLICE), min(out.shape[1], CHECK_SLICE)
    a64, b64 = a[:m].double(), b_kn[:, :n].double()
    ref, scale = a64 @ b64, a64.abs() @ b64.abs()
    K = a.shape[1]
    tol = (2 * torch.finfo(out.dtype).eps + K * torch.finfo(torch.float32).eps) * scale
    err = (out[:m, :n].double() - ref).abs()
    if not bool((err <= tol).all()):
        i, j = divmod(int((err - tol).argmax()), n)
        raise AssertionError(f"GEMM {out.dtype} M={out.shape[0]} N={out.shape[1]} K={K}: "
                             f"[{i},{j}] {out[i, j].item()} vs float64 {ref[i, j].item()}, "
                             f"|err| {err[i, j].item():.3g} > tol {tol[i, j].item():.3g}")


def _gemm_row(kind: str, name: str, dt: str, M: int, N: int, K: int, t: float,
              peak: float | None, kernel: str) -> dict:
    flops, nbytes = 2 * M * N * K, (M * K + N * K + M * N) * dtype_bytes(dt)
    return {"kind": kind, "name": name, "dtype": dt, "M": M, "N": N, "K": K, "t_median_s": t,
            "TFLOPs": flops / t / 1e12, "GBps": nbytes / t / 1e9,
            "pct_datasheet_flops": _pct(flops / t / 1e12, peak), "kernel": kernel}


def _timed_calls(settings: timer.TimerSettings) -> int:
    """The fewest calls timer.time_fn makes: what a GEMM's time budget is judged against."""
    return settings.warmup + settings.min_reps


class OverBudget(RuntimeError):
    """A GEMM whose first call says that its timed calls would take longer than gemm_budget_s."""


def _time_gemm(fn: Callable[[], torch.Tensor], a: torch.Tensor, b_kn: torch.Tensor,
               settings: timer.TimerSettings, dev: torch.device, budget_s: float = 0.0) -> float:
    """Median seconds of fn, after one checked call; raises OverBudget where that call, times the
    timer's warm-up and minimum repetitions, exceeds budget_s (> 0)."""
    def one_call() -> tuple[torch.Tensor, float]:
        start = time.perf_counter()
        out = fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return out, time.perf_counter() - start

    out, first = one_call()
    check_gemm(out, a, b_kn)
    calls = _timed_calls(settings)
    if budget_s and first * calls > budget_s and first <= budget_s:
        # a first call pays one-time costs (cuBLAS heuristics, lazy module loads, oneDNN primitive
        # creation): a second call decides, unless the first alone took the whole budget
        first = min(first, one_call()[1])
    if budget_s and first * calls > budget_s:
        raise OverBudget(f"one call took {first:.3g} s, so its {calls} timed calls would take ~{first * calls:.3g} s, "
                         f"over ceilings.gemm_budget_s={budget_s:g}")
    return timer.time_fn(fn, settings, dev).median_s


def _skip(failures: list, log: Callable[[str], None], e: OverBudget, larger: str, **where) -> None:
    """Record a GEMM over the time budget (and that the larger ones of its kind were not tried)."""
    failures.append({**where, "stage": "skipped", "error": f"{e}; {larger} not tried"})
    log(f"  skipped {' '.join(f'{k}={v}' for k, v in where.items())}: {e}; {larger} not tried")


def _measure_matmul(req: CeilingsRequest, cache: int, sheet: dict | None, tel: Telemetry,
                    failures: list, log: Callable[[str], None], run: _Run, rows: list[dict]) -> list[dict]:
    dev = torch.device(req.device)
    warm = dataclasses.replace(req.timer, l2="warm", l2_bytes=cache)
    cold = dataclasses.replace(req.timer, l2="cold" if "cold" in req.l2_modes else "warm",
                               l2_bytes=cache)
    shapes = decode_gemm_shapes(req.decode_model) if req.decode_ms else []
    for dt in req.dtypes:
        tdtype = getattr(torch, dt)
        peak = ((sheet or {}).get("peak_tflops") or {}).get(dt)

        def squares(dt=dt, tdtype=tdtype, peak=peak) -> list[dict]:
            out, over, last = [], False, None
            calls = _timed_calls(warm)
            for s in sorted(req.square_sizes):
                a = b = c = None
                try:
                    if over:
                        continue
                    predicted = last[1] * (s / last[0]) ** 3 * calls if last else 0.0  # cubic in the size
                    if req.gemm_budget_s and predicted > req.gemm_budget_s:  # not even one call
                        raise OverBudget(f"its {calls} timed calls would take ~{predicted:.3g} s "
                                         f"({last[1]:.3g} s a call at {last[0]}^3, times the cube of the size ratio), "
                                         f"over ceilings.gemm_budget_s={req.gemm_budget_s:g}")
                    a, b = (torch.randn(s, s, device=dev, dtype=tdtype) for _ in range(2))
                    c = torch.empty(s, s, device=dev, dtype=tdtype)
                    t = _time_gemm(lambda: torch.matmul(a, b, out=c), a, b, warm, dev, req.gemm_budget_s)
                    last = (s, t)
                    out.append(_gemm_row("square", f"square_{s}", dt, s, s, s, t, peak, "torch.matmul"))
                except OverBudget as e:
                    over = True
                    _skip(failures, log, e, "larger squares", kind="square", dtype=dt, M=s, N=s, K=s)
                except Exception as e:
                    failures.append(_failure("matmul", e, kind="square", dtype=dt, M=s, N=s, K=s))
                finally:
                    a = b = c = None
                run.step(1, f"matmul {dt} {s}^3")
            return out

        def decodes(dt=dt, tdtype=tdtype, peak=peak) -> list[dict]:
            skinny = tdtype in cpu_gemm.DTYPES and dev.type == "cpu" and cpu_gemm.available()[0]
            out = []
            for name, N, K in shapes:
                w = x = None
                for M in sorted(req.decode_ms):
                    try:
                        if w is None:
                            w = torch.randn(N, K, device=dev, dtype=tdtype)
                        x = torch.randn(M, K, device=dev, dtype=tdtype)
                        fn = lambda: torch.nn.functional.linear(x, w)  # noqa: E731
                        t = _time_gemm(fn, x, w.t(), cold, dev, req.gemm_budget_s)
                        out.append(_gemm_row("decode", name, dt, M, N, K, t, peak, "F.linear"))
                        if skinny:  # the kernel an eager CPU sweep runs (roofline.measure.cpu_gemm)
                            fn = lambda: cpu_gemm.skinny_linear(x, w)  # noqa: E731
                            t = _time_gemm(fn, x, w.t(), cold, dev, req.gemm_budget_s)
                            out.append(_gemm_row("decode", name, dt, M, N, K, t, peak, cpu_gemm.kernel_name(tdtype)))
                    except OverBudget as e:
                        _skip(failures, log, e, "larger M", kind="decode", name=name, dtype=dt, M=M, N=N, K=K)
                        break
                    except Exception as e:
                        failures.append(_failure("matmul", e, kind="decode", name=name,
                                                 dtype=dt, M=M, N=N, K=K))
                w = x = None
                run.step(1, f"decode {dt} {name}")
            return out

        for kind, measure in (("square", squares), ("decode", decodes)):
            with tel.block(f"matmul/{kind}/{dt}"):
                rows += run.group(f"matmul/{kind}/{dt}", measure)
            run.done_group()
        log(f"  matmul {dt}: {len(req.square_sizes)} square, "
            f"{len(shapes)} x {len(req.decode_ms)} decode shapes")
    for name in req.formats:
        with tel.block(f"matmul/decode/{name}"):
            rows += _measure_format_gemms(req, parse_format(name), shapes, cold, failures)
        run.step(len(shapes), f"decode {name}")
        run.done_group()
        log(f"  matmul {name}: {len(shapes)} x {len(req.decode_ms)} decode shapes")
    return rows


def check_format_gemm(out: torch.Tensor, x: torch.Tensor, w_deq: torch.Tensor) -> None:
    """A packed kernel's x @ W^T against float64 on the dequantised weights, within bf16 rounding
    of the output and of in-kernel partial sums: |err| <= 2^-7 · (|x| @ |W|^T)."""
    m, n = min(out.shape[0], CHECK_SLICE), min(out.shape[1], CHECK_SLICE)
    ref = x[:m].double() @ w_deq[:n].double().T
    tol = 2 ** -7 * (x[:m].double().abs() @ w_deq[:n].double().abs().T) + 1e-6
    err = (out[:m, :n].double() - ref).abs()
    if not bool((err <= tol).all()):
        raise AssertionError(f"packed GEMM M={out.shape[0]} N={out.shape[1]}: |err| {err.max().item():.3g} "
                             f"exceeds bf16 rounding of the dequantised reference")


def _measure_format_gemms(req: CeilingsRequest, fmt, shapes, settings, failures: list) -> list[dict]:
    from roofline.model import quant
    dev, act = torch.device(req.device), torch.bfloat16
    label = precision("bfloat16", fmt.name).label
    rows = []
    for name, N, K in shapes:
        try:
            quant.require_kernel(fmt, dev)
            w = torch.randn(N, K, device=dev, dtype=act) * 0.02
            lin = quant.packed_linear(w, fmt, device=dev, act_dtype=act)
            w_deq = quant.quantize(w, fmt, act).dequantize().to(dev)
            w = None
        except Exception as e:  # no kernel, or a shape its packing refuses: recorded, never timed
            failures.append(_failure("matmul", e, kind="decode", name=name, dtype=label, N=N, K=K,
                                     status="unsupported" if isinstance(e, NotImplementedError) else "error"))
            continue
        for M in req.decode_ms:
            try:
                x = torch.randn(M, K, device=dev, dtype=act)
                check_format_gemm(lin(x), x, w_deq)
                t = timer.time_fn(lambda: lin(x), settings, dev).median_s
                flops, nbytes = 2 * M * N * K, fmt.matrix_bytes(N, K, 2) + (M * K + M * N) * 2
                rows.append({"kind": "decode", "name": name, "dtype": label, "M": M, "N": N, "K": K,
                             "t_median_s": t, "TFLOPs": flops / t / 1e12, "GBps": nbytes / t / 1e9,
                             "pct_datasheet_flops": None, "kernel": type(lin).__name__})
            except Exception as e:
                failures.append(_failure("matmul", e, kind="decode", name=name, dtype=label, M=M, N=N, K=K))
        lin = w_deq = None
    return rows


def summarize(bandwidth: list[dict], matmul: list[dict], cache_bytes: int) -> dict:
    """The measured roofs. Memory: the best GB/s at working sets >= LARGE_FACTOR x cache
    (or, if a kernel's largest is smaller, at least that large), l2 cold where there are cold
    rows. Compute: the best
    TFLOP/s per dtype of its square and decode-shaped GEMMs (`peak_from` names which). Ridge: FLOP/B = peak FLOP/s / memory B/s."""
    rows = [r for r in bandwidth if r["l2"] == "cold"] or list(bandwidth)
    largest: dict[str, int] = {}  # per kernel: its largest working set
    for r in rows:
        largest[r["kernel"]] = max(largest.get(r["kernel"], 0), r["working_set_bytes"])
    threshold = min([LARGE_FACTOR * cache_bytes, *largest.values()])
    large = [r for r in rows if r["working_set_bytes"] >= threshold]
    best = max(large, key=lambda r: r["GBps"]) if large else None
    by_kernel: dict[str, float] = {}
    for r in large:
        by_kernel[r["kernel"]] = max(by_kernel.get(r["kernel"], 0.0), r["GBps"])
    peak: dict[str, float] = {}  # the best GEMM of a dtype, square or decode-shaped (a slow square path never lowers it)
    peak_from: dict[str, str] = {}
    for r in matmul:
        if r["kind"] in ("square", "decode") and "+" not in str(r["dtype"]) and r["TFLOPs"] > peak.get(r["dtype"], 0.0):
            peak[r["dtype"]] = r["TFLOPs"]
            peak_from[r["dtype"]] = f"{r['kind']} {r['name']} M={r['M']}"
    bw = best["GBps"] if best else None
    decode_m1: dict[str, float] = {}  # best decode GEMM GB/s at M=1 per dtype / weight format
    for r in matmul:
        if r["kind"] == "decode" and r["M"] == 1:
            decode_m1[r["dtype"]] = max(decode_m1.get(r["dtype"], 0.0), r["GBps"])
    return {
        "decode_m1_GBps": decode_m1,
        "mem_bw_GBps": bw,
        "mem_bw_kernel": best["kernel"] if best else None,
        "peak_tflops": peak,
        "peak_from": peak_from,
        "ridge_measured": {d: (None if not bw else f * 1e12 / (bw * 1e9)) for d, f in peak.items()},
        "cache_bytes": cache_bytes,
        "mem_bw_working_set_bytes": best["working_set_bytes"] if best else None,
        "mem_bw_by_kernel": by_kernel,
    }


def _groups(req: CeilingsRequest) -> int:
    shapes = len(decode_gemm_shapes(req.decode_model)) if req.decode_ms else 0
    return (len(req.kernels) * len(req.bandwidth_dtypes) * len(req.working_sets)
            + len(req.dtypes) * (len(req.square_sizes) + shapes) + len(req.formats) * shapes)


def measure_ceilings(req: CeilingsRequest, log: Callable[[str], None] | None = None,
                     context: Mapping[str, Any] | None = None, out_dir: str | Path | None = None,
                     progress: bool = False) -> dict:
    """Measure everything `req` asks for; returns the ceilings document (see SCHEMA_VERSION).
    `context` (e.g. the command-line overrides) is recorded in the provenance. With `out_dir`,
    ceilings.json there is rewritten atomically after each kernel group (summary `complete`
    false until the end), so a run cut short keeps its copy roof; `progress`: a bar on stderr."""
    log = log or (lambda msg: None)
    sheet, _ = _datasheet(req.device)
    cache = _cache_bytes(req, sheet)
    tel, failures = Telemetry(req.device), []
    bandwidth: list[dict] = []
    matmul: list[dict] = []
    with timer.set_threads(req.timer.threads):
        prov = provenance.collect(req.device)
        prov["config"] = req.to_dict()
        prov.update(context or {})

        def document(complete: bool) -> dict:
            summary = summarize(bandwidth, matmul, cache)
            summary.update(throttled=tel.throttled, llc_bytes=last_level_cache_bytes(req.device),
                           complete=complete, busy_machine=list(run.busy))
            return {"schema_version": SCHEMA_VERSION, "provenance": prov, "datasheet": sheet,
                    "bandwidth": bandwidth, "matmul": matmul, "telemetry": tel.records,
                    "failures": failures, "summary": summary}

        checkpoint = (lambda: write_ceilings(document(False), out_dir)) if out_dir is not None else None
        run = _Run(req, _groups(req), progress, checkpoint)
        log(f"ceilings on {prov['device_name']} ({prov['threads']} threads), cache flush {cache / MiB:.0f} MiB")
        try:
            _measure_bandwidth(req, cache, sheet, tel, failures, log, run, bandwidth)
            _measure_matmul(req, cache, sheet, tel, failures, log, run, matmul)
        finally:
            run.close()
    return document(True)


# --------------------------------------------------------------------------- files


def write_ceilings(result: dict, run_dir: str | Path) -> Path:
    """run_dir/ceilings.json (everything) + ceilings_bandwidth.csv + ceilings_matmul.csv."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, rows, cols in (("bandwidth", result["bandwidth"], BANDWIDTH_COLUMNS),
                             ("matmul", result["matmul"], MATMUL_COLUMNS)):
        files.write_csv_atomic(pd.DataFrame(rows, columns=cols), run_dir / f"ceilings_{name}.csv")
    files.write_json_atomic(run_dir / "ceilings.json", result)
    return run_dir


def load_ceilings(path: str | Path) -> dict:
    """Read a ceilings.json (or the run folder holding one), checking version and keys."""
    path = Path(path)
    if path.is_dir():
        path = path / "ceilings.json"
    doc = files.read_json(path, f"ceilings={str(path)!r}", "ceilings.json", obj=True)
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ConfigError(f"ceilings={str(path)!r}: schema_version={doc.get('schema_version')!r}; "
                          f"this code reads {SCHEMA_VERSION}")
    for key in TOP_KEYS:
        if key not in doc:
            raise ConfigError(f"ceilings={str(path)!r}: missing key {key!r}")
    for key in SUMMARY_KEYS:
        if not isinstance(doc["summary"], dict) or key not in doc["summary"]:
            raise ConfigError(f"ceilings={str(path)!r}: summary is missing key {key!r}")
    return doc


def format_summary(result: dict) -> str:
    """One screen: measured memory roof per kernel, matmul GFLOP/s per dtype, % of datasheet."""
    s, sheet, prov = result["summary"], result["datasheet"] or {}, result["provenance"]
    bw_sheet = sheet.get("mem_bw_GBps")
    pct = lambda v, c: f" ({100 * v / c:.0f}% of datasheet {c:g})" if c and v else ""  # noqa: E731
    lines = [f"ceilings: {prov['device_name']} [{prov['device']}], {prov['threads']} threads, "
             f"flush {s['cache_bytes'] / MiB:.0f} MiB"
             + (f", last-level cache {s['llc_bytes'] / MiB:.4g} MiB" if s.get("llc_bytes") else "")
             + ("" if sheet else ", no datasheet row (measured only)")]
    lines.append(f"memory, GB/s (read+written bytes / median, 1 GB = 1e9 B), best per kernel at "
                 f"working sets >= {LARGE_FACTOR}x cache (or its largest), l2 cold:")
    for k, v in sorted(s.get("mem_bw_by_kernel", {}).items(), key=lambda kv: -kv[1]):
        lines.append(f"  {k:<28s} {v:9.1f}{pct(v, bw_sheet)}")
    if s["mem_bw_GBps"]:
        lines.append(f"  measured memory ceiling: {s['mem_bw_GBps']:.1f} GB/s ({s['mem_bw_kernel']})"
                     + pct(s["mem_bw_GBps"], bw_sheet))
    lines.append("matmul, GFLOP/s (2·M·N·K / median) and decode GEMM x[1,K]·W[N,K]^T GB/s:")
    for dt, tf in s["peak_tflops"].items():
        m1 = [r["GBps"] for r in result["matmul"] if r["kind"] == "decode" and r["dtype"] == dt
              and r["M"] == 1]
        peak = (sheet.get("peak_tflops") or {}).get(dt)
        ridge = s["ridge_measured"].get(dt)
        lines.append(f"  {dt:<9s} peak {1e3 * tf:9.1f} GFLOP/s{pct(tf, peak)} ({s.get('peak_from', {}).get(dt, 'best GEMM')})"
                     + (f", ridge {ridge:.1f} FLOP/B" if ridge else "")
                     + (f", decode M=1 best {max(m1):.1f} GB/s" if m1 else ""))
    for label, gbps in s.get("decode_m1_GBps", {}).items():
        if "+" in label:
            of = f"; {100 * gbps / s['mem_bw_GBps']:.0f}% of the memory ceiling" if s["mem_bw_GBps"] else ""
            lines.append(f"  {label:<26s} decode M=1 best {gbps:.1f} GB/s (format bytes incl. scales{of})")
    if result["failures"]:
        skipped = sum(f.get("stage") == "skipped" for f in result["failures"])
        lines.append(f"failures: {len(result['failures'])}" + (f", {skipped} of them GEMMs skipped over the time budget "
                                                               f"(gemm_budget_s)" if skipped else "")
                     + " (see ceilings.json 'failures')")
    for b in s.get("busy_machine") or []:
        lines.append(f"WARNING: {b['group']} was measured on a busy machine ({b['why']}), twice; its roof is "
                     "marked busy in ceilings.json: re-measure on a quiet machine before trusting it")
    if s.get("throttled"):
        lines.append("WARNING: the device reported power/thermal throttling during the run")
    return "\n".join(lines)


def stderr_log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)



# --------------------------------------------------------------------------- the precision a device is memory-bound in

AUTO = "auto"


def native_bf16_cpu() -> bool:
    """This CPU multiplies bf16 natively (AVX512-BF16 or AMX tiles); else torch emulates it in fp32."""
    cpu = getattr(torch._C, "_cpu", None)
    return bool(cpu and (cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported()))


def fast_mode(device: str, dtype: str | None = None) -> str:
    """The forward mode that reaches the device's roof: CUDA-graph replay on CUDA. On the CPU,
    float32 and bfloat16 run eager where the skinny GEMM builds (roofline.measure.cpu_gemm: its
    linears at the memory roof and flat in the token count up to ~6 tokens, no compile of the
    model: a compiled bf16 graph of cpu-demo took 3.6 min on the 2-vCPU AMX Xeon, the demo with
    four 719 s, docs/cpu.md); another dtype (or without that kernel) the compiled mode (frozen,
    prepacked GEMM weights: roofline.measure.forward.CompiledForward) where Inductor has a C++
    compiler, else eager."""
    if _device_kind(device) == "cuda":
        return "graph"
    if dtype in ("float32", "bfloat16") and cpu_gemm.available()[0]:
        return "eager"
    return "compiled" if timer._cxx_compiler() else "eager"


def knee_tokens(doc: Mapping[str, Any]) -> dict[str, float]:
    """Per measured dtype: the token count where a decode-shaped pass turns compute-bound, from
    the measured ceilings: ridge (peak FLOP/s / memory B/s) over one token's intensity (2 FLOP per
    weight / the dtype's bytes per weight) = ridge · bytes / 2."""
    s = doc["summary"]
    bw = s.get("mem_bw_GBps")
    return {d: tf * 1e12 / (bw * 1e9) * dtype_bytes(d) / 2 for d, tf in (s.get("peak_tflops") or {}).items()
            if bw and tf and d in MODEL_DTYPES}


def choose_precision(device: str, doc: Mapping[str, Any] | None) -> tuple[str, str, str]:
    """(dtype, mode, why) for `dtypes=[auto]`: of the dtypes the ceilings measured, the one whose
    roofline keeps the most tokens per pass memory-bound (`knee_tokens`: the highest ridge in
    units of one token's intensity; a tie goes to the smaller dtype, fewer bytes per step), run
    in `fast_mode`. Without ceilings: bf16 where the device multiplies it natively (CUDA; a CPU
    with AVX512-BF16/AMX), else float32, and the reason says it was not measured."""
    knees = knee_tokens(doc) if doc else {}
    if knees:
        best = max(knees, key=lambda d: (round(knees[d], 6), -dtype_bytes(d)))
        mode = fast_mode(device, best)
        s = doc["summary"]
        detail = "; ".join(f"{d}: roof {1e3 * s['peak_tflops'][d]:.4g} GFLOP/s, ridge "
                           f"{s['peak_tflops'][d] * 1e3 / s['mem_bw_GBps']:.3g} FLOP/B, knee ~{k:.3g} tokens"
                           for d, k in sorted(knees.items(), key=lambda kv: -kv[1]))
        why = (f"dtypes=[auto] chose {best} in mode {mode}: of the measured ceilings (memory roof "
               f"{s['mem_bw_GBps']:.4g} GB/s) it keeps the most tokens per pass memory-bound ({detail})")
    else:
        native = _device_kind(device) == "cuda" or native_bf16_cpu()
        best = "bfloat16" if native else "float32"
        mode = fast_mode(device, best)
        why = (f"dtypes=[auto] chose {best} in mode {mode} without measured ceilings: this device "
               + ("multiplies bf16 natively" if native else "has no native bf16 (no AVX512-BF16/AMX), so bf16 is "
                                                            "emulated and compute-bound at a few tokens"))
    if mode == "eager" and best in ("float32", "bfloat16") and _device_kind(device) == "cpu" and cpu_gemm.available()[0]:
        kernel = cpu_gemm.kernel_name(getattr(torch, best))
        tile = "16 tokens (AMX tiles)" if kernel == cpu_gemm.AMX else f"{cpu_gemm.max_tile()} tokens"
        why += (f"; eager with the skinny {best} GEMM ({kernel}, roofline.measure.cpu_gemm: each weight read once "
                f"per tile of up to {tile}, no compile)")
    if mode == "compiled":
        why += ("; compiled: Inductor with frozen weights (GEMMs prepacked once), the token counts dynamic "
                "(at most four graphs: B = 1 or > 1 by q = 1 or > 1)")
    return best, mode, why
