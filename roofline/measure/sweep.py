"""The grid runner: time forward passes of one preset over (dtype, mode, q, B, L).

For each point it writes the cache up to L (random contents: attention reads every cached
position whatever its value, so the time is that of a real context), times the forward of
q new tokens per sequence with the one timer, and appends one row with the statistics, the
byte/FLOP model of exactly that call, achieved GB/s and TFLOP/s, and provenance.

Layer slicing (`layers=n`): the model is built with n and 2n layers of the real shapes;
each point is timed on both and the full depth is extrapolated as T = a + layers·b with
b = (T_2n − T_n)/n — how a 70B or DeepSeek-V3 is measured on one device.

Failures are data: an out-of-memory point, a cache that cannot fit, or a dtype the device
cannot run becomes a row with `status` and the error, and the sweep goes on. A killed run
started again with the same config resumes: completed points are read back from
points.jsonl and skipped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import signal
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from roofline.io import files, results, runfolder
from roofline.measure import memory, provenance
from roofline.model import decoder, kvcache
from roofline.model.accounting import (SHARDED_MOE_NO_GRAPH, check_weight_format, forward_cost, moe_impl_for_mode,
                                       mtp_cost)
from roofline.model.dtypes import datasheet_column, torch_dtype
from roofline.model.formats import activation_dtype, parse_precision, precision, precision_columns
from roofline.io.fields import ConfigError, internal, option
from roofline.model.config import ModelConfig
from roofline.model.decoder import build_model
from roofline.measure import slicing
from roofline.measure.devices import parse_device, running_device_name, datasheet_for_running_device
from roofline.measure.forward import (MATH_FALLBACK, CompiledCall, choose_cpu_decode_attention, compiled_calls,
                                      count_kernels, depth_cosine_gate,
                                      eager_attention_backend, is_math_fallback, sdpa_over_grouped)
from roofline.measure.noise import NoiseMonitor, NoiseSettings
from roofline.measure.telemetry import energy_per_token, nvml_index
from roofline.measure.timer import MODES, TimerSettings, time_fn
from roofline.measure.ceilings import AUTO
from roofline.measure import cpu_gemm
from roofline.measure.cpu_gemm import CHOICES as CPU_GEMMS
from roofline.parallel.layout import Layout

KINDS = ("forward", "mtp")
CPU_ATTENTIONS = ("auto",) + decoder.CPU_DECODE_ATTENTION  # a sweep's cpu_attention


@dataclass(frozen=True)
class SweepRequest:
    model: ModelConfig = internal(why="the `model` group's preset, or the config of `checkpoint`")
    q: tuple[int, ...] = option((1, 2, 4, 8, 16, 32, 64), "new tokens per sequence per forward")
    B: tuple[int, ...] = option((1, 4), "sequences per forward")
    L: tuple[int, ...] = option((128, 512, 1536), "tokens already in each sequence's KV cache (three, over a "
                                                  "decade: the fit's L hold-out)")
    dtypes: tuple[str, ...] = option(("bfloat16",), "float32 | bfloat16 | float16 | auto (the dtype this device's "
                                                    "measured ceilings keep memory-bound longest, in its fast mode; "
                                                    "the demo runs [auto, bfloat16])")
    modes: tuple[str, ...] = option(("eager",), "auto (the auto dtype's fast mode, named dtypes eager) | eager | "
                                                "graph (CUDA-graph replay, cuda only) | compiled (torch.compile: on "
                                                "cpu frozen prepacked weights, a graph per token count; + CUDA "
                                                "graphs on cuda)")
    timer: TimerSettings = option(help="how each point is timed (roofline/conf/timer/: default | quick)",
                                  factory=TimerSettings)
    device: str = internal("cpu", "the torch device of the `device` group's entry")
    layers: int = option(0, "0: full depth; n: time n and 2n layers, extrapolate T = a + layers*b")
    mtp_q: tuple[int, ...] = option((1,), "q of the MTP drafter step timed for presets with MTP modules")
    seed: int = option(0, "seed of the random weights and inputs")
    checkpoint: str = option("", "a Hugging Face model folder: its config and weights replace the model preset")
    ceilings: str = option("", "a ceilings.json (python -m roofline.cli.ceilings) or quick (measure one first); "
                               "rows then give % of measured ceilings")
    out_dir: str = option("", "default: results/runs/sweep-<model>-<fingerprint of the grid>")
    overrides: tuple[str, ...] = internal((), "the command line (provenance)")
    parallel: Layout = internal(why="tp/ep/dp_attention: ranks of torch.distributed (roofline.parallel.runner)",
                                factory=Layout)
    pairs: tuple[tuple[str, str], ...] = internal((), "(dtype, mode) measured, replacing dtypes x modes "
                                                      "(dtypes=[auto] resolved)")
    auto_choice: str = internal("", "why dtypes=[auto] became what it did (console, run.json, report)")
    # per dtype, the most tokens the skinny CPU GEMM takes (cpu_gemm=auto): measured by the
    # ceilings (roofline.measure.cpu_gemm.crossovers), set once they are known; rows record it
    skinny_max_m: tuple[tuple[str, int], ...] = internal((), "measured by the ceilings (cpu_gemm=auto)")
    cpu_gemm: str = option("auto", "the CPU's float32 linears in eager mode: auto (skinny where it builds, else "
                                   "aten) | skinny (roofline.measure.cpu_gemm: at the memory roof for M <= 128 "
                                   "tokens) | aten (torch's F.linear)")
    cpu_attention: str = option("auto", "the CPU's decode (q = 1) attention in eager mode: auto (both timed on the "
                                        "model's shape at build, the faster kept) | grouped (one grouped matmul "
                                        "per KV head) | sdpa (torch's scaled_dot_product_attention)")

    def __post_init__(self) -> None:
        for name in GRID_AXES:  # a value given twice is one grid value (one point, one row)
            object.__setattr__(self, name, tuple(dict.fromkeys(getattr(self, name))))
        self.validate()

    def validate(self) -> None:
        cfg = self.model
        for name in ("q", "B", "L", "dtypes", "modes"):
            if len(getattr(self, name)) == 0:
                raise ConfigError(f"{name}: the grid has no points (empty list)")
        for name, lo in (("q", 1), ("B", 1), ("L", 0), ("mtp_q", 1)):
            bad = [v for v in getattr(self, name) if not isinstance(v, int) or isinstance(v, bool) or v < lo]
            if bad:
                raise ConfigError(f"{name}={bad}: allowed integers >= {lo}")
        longest = max(self.L) + max(self.q + self.mtp_q)
        if longest > cfg.max_context:
            raise ConfigError(f"L={max(self.L)} + q={max(self.q + self.mtp_q)}: exceeds model.max_context="
                              f"{cfg.max_context} of {cfg.name!r}; allowed L + q <= {cfg.max_context}")
        for d in self.dtypes:
            if d != AUTO:  # a format the model's shapes cannot take is bad input, not an unsupported row
                check_weight_format(cfg, parse_precision(d))
        if self.cpu_gemm not in CPU_GEMMS:
            raise ConfigError(f"cpu_gemm={self.cpu_gemm!r}: allowed {CPU_GEMMS}")
        if self.cpu_attention not in CPU_ATTENTIONS:
            raise ConfigError(f"cpu_attention={self.cpu_attention!r}: allowed {CPU_ATTENTIONS}")
        bad = [m for m in self.modes if m not in MODES + (AUTO,)]
        if bad:
            raise ConfigError(f"modes={bad}: allowed {MODES + (AUTO,)}")
        if AUTO in self.dtypes and self.parallel.devices > 1:
            raise ConfigError("dtypes=['auto'] with tp/ep > 1: name the dtype (e.g. dtypes=[bfloat16])")
        if cfg.is_moe and self.parallel.devices == 1:  # the one MoE/mode rule (accounting.moe_impl_for_mode)
            for m, d in itertools.product((m for m in self.modes if m != AUTO), self.dtypes):
                try:
                    moe_impl_for_mode(m, new_run=True, grouped=grouped_moe_runs(self.device, d))
                except ValueError as e:
                    raise ConfigError(f"modes={[m]}, dtypes={[d]}: {e}") from None
        dev = parse_device(self.device, need_available=False)
        if "graph" in self.modes and dev.type != "cuda":
            raise ConfigError(f"modes=['graph']: CUDA-graph replay needs device=cuda, got device={self.device!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed={self.seed!r}: allowed an integer in [0, 2^63)")
        if not isinstance(self.layers, int) or isinstance(self.layers, bool) or self.layers < 0 \
                or 2 * self.layers > cfg.layers:
            raise ConfigError(f"layers={self.layers}: allowed 0 (full depth) or 1..{cfg.layers // 2} "
                              f"(n and 2n layers of {cfg.layers} are measured)")
        for depth in ((self.layers, 2 * self.layers) if self.layers else ()):
            try:
                cfg.scaled(layers=depth)
            except ConfigError as e:
                raise ConfigError(f"layers={self.layers}: {depth} layers of {cfg.name!r} cannot be built ({e})") from None
        if self.checkpoint:  # a broken file is bad input (exit 2, naming it), not a row of errors
            from roofline.checkpoints.loader import tensor_headers
            tensor_headers(self.checkpoint)
        if self.parallel.devices > 1:
            check_request(self)

    def identity(self) -> dict:
        """What changes the numbers (not where they are written): the request, the code
        version, torch and the device."""
        d = dataclasses.asdict(self)
        d.pop("out_dir"), d.pop("overrides"), d.pop("ceilings"), d.pop("auto_choice"), d.pop("skinny_max_m")
        if not d["pairs"]:
            d.pop("pairs")
        d = json.loads(json.dumps(d, default=str))
        d.update(code_version=provenance.code_version(), torch_version=torch.__version__,
                 device_name=spec_device_name(self.device))
        return d

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:10]

    def default_out_dir(self, root: Path) -> Path:
        return root / f"sweep-{self.model.name}-{self.fingerprint()}"


def check_request(req: SweepRequest) -> None:
    """What a distributed sweep cannot do, named before anything runs."""
    lay = req.parallel
    lay.check(req.model, world=lay.devices)
    if lay.pp > 1:
        raise ConfigError(f"parallel.pp={lay.pp}: the sharded forward runs one stage; pp is accounting only")
    if "graph" in req.modes:
        reason = "; ".join(filter(None, ["CUDA-graph replay is not captured across ranks",
                                         SHARDED_MOE_NO_GRAPH if req.model.is_moe else ""]))
        raise ConfigError(f"modes=['graph']: {reason}; use eager with tp/ep > 1")
    if req.layers:
        raise ConfigError(f"layers={req.layers}: layer slicing is single-device; vary model.layers across sweeps")
    if req.checkpoint:
        raise ConfigError("checkpoint=...: sharded sweeps run random weights of the preset's shapes")
    if lay.dp_attention and any(b % lay.tp for b in req.B):
        raise ConfigError(f"B={list(req.B)}: with parallel.dp_attention each of the tp={lay.tp} ranks runs B/tp "
                          "sequences; every B must be a multiple of tp")


@dataclass(frozen=True)
class Point:
    kind: str
    dtype: str
    mode: str
    q: int
    B: int
    L: int
    layers_run: int

    @property
    def point_id(self) -> str:
        return f"{self.kind}|{self.dtype}|{self.mode}|q{self.q}|B{self.B}|L{self.L}|l{self.layers_run}"


def layer_depths(req: SweepRequest) -> tuple[int, ...]:
    return (req.layers, 2 * req.layers) if req.layers else (req.model.layers,)


def grid(req: SweepRequest) -> list[Point]:
    """Points in measurement order: one model per (dtype, depth), its points together; each
    point once (two spellings of one dtype, bf16 and bfloat16, are one point)."""
    pts = []
    for dtype, depth in itertools.product(req.dtypes, layer_depths(req)):
        modes = [m for d, m in req.pairs if d == dtype] if req.pairs else req.modes
        for mode, B, L in itertools.product(modes, req.B, req.L):
            label = parse_precision(dtype).label
            pts += [Point("forward", label, mode, q, B, L, depth) for q in req.q]
            if req.model.mtp_layers:
                pts += [Point("mtp", label, mode, q, B, L, depth) for q in req.mtp_q]
    return list({p.point_id: p for p in pts}.values())


def spec_device_name(device: str) -> str:
    """The running device's name; bad input (exit 2) when CUDA is asked for and absent."""
    return running_device_name(device)


def grouped_moe_runs(device: str, dtype: str) -> bool:
    """Whether the decoder's grouped MoE path captures on `device` in `dtype` (float experts in the
    activation dtype; decoder.grouped_capturable): what lets an MoE sweep run graph or compiled mode."""
    try:
        prec, dev = parse_precision(dtype), parse_device(device, need_available=False)
    except (ConfigError, ValueError):
        return False
    return prec.is_plain and decoder.grouped_capturable(dev, torch_dtype(prec.activations))


def _moe_impl(cfg, mode: str, device: str, dtype: str) -> str:
    return moe_impl_for_mode(mode, new_run=cfg.is_moe, grouped=grouped_moe_runs(device, dtype))


def _runnable_mode(cfg, mode: str, device: str, dtype: str | None) -> tuple[str, str]:
    """The mode itself, or eager (with why) where the MoE/mode rule refuses it for this model."""
    if not cfg.is_moe:
        return mode, ""
    try:
        moe_impl_for_mode(mode, new_run=True, grouped=dtype is not None and grouped_moe_runs(device, dtype))
        return mode, ""
    except ValueError as e:
        return "eager", f"modes=[auto]: an MoE model runs eager, not {mode} ({e})"


def memory_plan(req: SweepRequest, dtype: str, depth: int, points: list["Point"]) -> tuple[list, dict]:
    """Per point: does its peak (weights in dtype, its cache, its activations) fit what the
    device can give (cgroup limit included)? ([(cache batch, cache context, [ids])], {id: too_big reason})."""
    cfg = req.model.scaled(layers=depth)
    free, where = memory.available(req.device)
    return memory.plan_builds(cfg, dtype, [(p.point_id, p.B, p.L + p.q, p.q) for p in points], free, where,
                              with_mtp=cfg.mtp_layers > 0)


def _failure_status(e: BaseException) -> str:
    """`unsupported` only for what says the combination does not exist: a NotImplementedError (our
    Unsupported of a format without a fast kernel, CompileUnsupported, torch's missing backend
    kernel) or torch's RuntimeError "... not implemented for 'Half'"; anything else (a TypeError
    of a bug included) is an `error` row with its type and message."""
    if isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower():
        return "oom"
    if isinstance(e, NotImplementedError) or (isinstance(e, RuntimeError) and "not implemented for" in str(e)):
        return "unsupported"
    return "error"


class BuiltModel:
    """One built model (dtype, depth, mode) and the static inputs of each point."""

    def __init__(self, req: SweepRequest, dtype: str, depth: int, mode: str, max_batch: int | None = None,
                 max_ctx: int | None = None):
        """max_batch x max_ctx: the static cache (default: the whole grid's largest)."""
        max_batch = max_batch or max(req.B)
        max_ctx = max_ctx or max(req.L) + max(req.q + req.mtp_q)
        cfg = req.model.scaled(layers=depth)
        if mode == "compiled" and parse_device(req.device).type == "cpu":  # one spare position: a call that ends
            max_ctx = min(max_ctx + 1, cfg.max_context)  # at the cache's last one guards (and recompiles) apart
        self.cfg, self.req, self.dtype, self.mode = cfg, req, dtype, mode
        self.moe_impl = _moe_impl(cfg, mode, req.device, dtype)
        self.max_batch = max_batch
        self.model = self.build(max_ctx)
        from roofline.model.quant import require_fast
        require_fast(self.model, dtype, req.device)  # a dequantise-then-matmul is never timed as its format
        self.gen = torch.Generator(device=req.device).manual_seed(req.seed)
        self.compiled = compiled_calls(self.model, cfg.layers, dtype) if mode == "compiled" and \
            parse_device(req.device).type == "cpu" else None
        self.gemm_kernel = self._gemm_kernel()
        self.decode_attention = self._decode_attention()

    def _gemm_kernel(self) -> str:
        """The kernel of this model's dense linears, as a row records it: on the CPU in eager mode,
        float32 or bfloat16 (plain, no quantized format), `cpu_gemm` auto or skinny: the skinny
        kernel (roofline.measure.cpu_gemm; auto falls back to aten, saying why, where it cannot be
        built; skinny raises Unsupported); else the backend's own (aten, or inductor in compiled mode)."""
        dev = parse_device(self.req.device).type
        if self.mode == "compiled":
            return "inductor"
        plain = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(self.dtype)
        if dev != "cpu" or self.mode != "eager" or self.req.cpu_gemm == "aten" or plain is None:
            return "aten"
        max_m, why = cpu_gemm.MAX_M, ""
        if self.req.cpu_gemm == "auto" and self.dtype in dict(self.req.skinny_max_m):
            max_m = dict(self.req.skinny_max_m)[self.dtype]
            why = "; F.linear above, the crossover the ceilings measured" if max_m else ""
            if not max_m:
                return "aten (F.linear measured faster than the skinny GEMM at M = 1 by the ceilings)"
        try:
            n = cpu_gemm.use_skinny_linears(self.model, max_m)
        except cpu_gemm.KernelUnavailable as e:
            if self.req.cpu_gemm == "skinny":
                raise
            return f"aten ({e})"
        return f"{cpu_gemm.kernel_name(plain)} ({n} linears, M <= {min(max_m, cpu_gemm.MAX_M)}{why})"

    def _decode_attention(self) -> str:
        """attend's CPU decode path for this model, as a row records it (decode_attention): in
        eager mode on the CPU, `cpu_attention` auto times both paths on the model's attention
        shape at the grid's (B, L) corners and takes the faster (roofline.measure.forward.
        choose_cpu_decode_attention), or the path named; elsewhere (a GPU, compiled mode) "sdpa"
        (torch's SDPA, which a GPU always runs) or "grouped" (what inductor compiles)."""
        if parse_device(self.req.device).type != "cpu":
            return "sdpa"
        if self.mode != "eager":
            return "grouped"
        impl, why = self.req.cpu_attention, "asked for"
        if impl == "auto":
            Ls = sorted({min(L + 1, self.model.max_context) for L in (min(self.req.L), max(self.req.L))})
            shapes = sorted({(B, L) for B in (min(self.req.B), max(self.req.B)) for L in Ls})
            impl, times = choose_cpu_decode_attention(self.model, shapes, torch_dtype(parse_precision(self.dtype).activations))
            if times:
                why = f"timed: t_sdpa / t_grouped = {sdpa_over_grouped(times):.2f}, median of {len(shapes)} (B, L)"
            else:
                why = "no attention to time"
        decoder.set_cpu_decode_attention(self.model, impl)
        return f"{impl} ({why})"

    def build(self, max_ctx: int):
        req, cfg = self.req, self.cfg
        prec = parse_precision(self.dtype)
        quantized = None if prec.is_plain else prec
        if req.checkpoint:
            from roofline.checkpoints.loader import load_checkpoint
            from roofline.model.quant import quantize_model
            model = load_checkpoint(req.checkpoint, dtype=prec.activations, device=req.device,
                                    max_batch=self.max_batch, max_context=max_ctx, moe_impl=self.moe_impl,
                                    layers=cfg.layers)
            return model if quantized is None else quantize_model(model, quantized, req.device)
        return build_model(cfg, max_batch=self.max_batch, max_context=max_ctx, dtype=torch_dtype(prec.activations),
                           device=req.device, seed=req.seed, moe_impl=self.moe_impl, precision=quantized)

    def fill_cache(self, L: int) -> None:
        """Random keys/values in positions < L of every cache (their values do not change the
        work attention does); positions >= L are zeroed. A quantized cache is filled through
        its own write path (codes and scales)."""
        kvcache.fill_random(self.model, L, self.gen)

    def callable_for(self, p: Point) -> tuple[Callable[[], object], dict]:
        m, dev = self.model, self.req.device
        tokens = torch.randint(0, self.cfg.vocab, (p.B, p.q), generator=self.gen, device=dev)
        start = p.L  # every sequence at L: no attention mask (decoder.attention_mask)
        kv_len = p.L + p.q
        if p.kind == "forward":
            fn = lambda: m(tokens, start, kv_len=kv_len)
            cost = lambda touched: forward_cost(self.cfg, self.dtype, p.B, p.q, p.L, kv_len, self.moe_impl, touched,
                                                kvcache.impl(m))
            args = (tokens, start)
        else:
            hidden = torch.randn(p.B, p.q, self.cfg.d, generator=self.gen, device=dev).to(m.embed.weight.dtype)
            fn = lambda: m.mtp_forward(hidden, tokens, start, kv_len=kv_len)
            cost = lambda touched: mtp_cost(self.cfg, self.dtype, p.B, p.q, p.L, kv_len, self.moe_impl, touched,
                                            kvcache.impl(m))
            args = (hidden, tokens, start)
        if self.compiled is not None:  # the CPU's compiled mode: this kind's function, compiled per M
            fn = CompiledCall(self.compiled[p.kind], args, fn)
        return fn, cost

    def check(self) -> None:
        """Correct before fast: the forward of q tokens equals q single-token forwards in this
        dtype (cosine of the logits >= forward.min_cosine, depth-scaled for half precision),
        through the same uniform-position path the points are timed on; logits finite."""
        m = self.model
        self.model.reset_cache()
        n = min(4, m.max_context)
        toks = torch.randint(0, self.cfg.vocab, (1, n), generator=self.gen, device=self.req.device)
        full = m(toks, 0).float()
        steps = torch.cat([m(toks[:, i:i + 1], i) for i in range(n)], 1).float()
        cos = torch.nn.functional.cosine_similarity(full.flatten(), steps.flatten(), dim=0).item()
        why = "logits not finite" if not torch.isfinite(full).all() else depth_cosine_gate(cos, self.cfg.layers, self.dtype)
        if why:
            raise RuntimeError(f"forward check failed for {self.cfg.name} {self.dtype}: {why}")


def _measure(w: BuiltModel, p: Point, timer: TimerSettings) -> dict:
    w.fill_cache(p.L)
    fn, cost_of = w.callable_for(p)
    backend = eager_attention_backend(getattr(fn, "eager", fn))  # one eager call: which SDPA kernel each layer selects
    compiled = fn.prepare() if isinstance(fn, CompiledCall) else {}  # compiled and checked, outside the timing
    mask = w.model.last_mask_bytes
    # kernels per forward, profiled once outside the reps (graph mode replays the eager kernels)
    # and the energy per token from NVML's counter on the warmed-up step ('n/a (no NVML on cpu)' on the CPU)
    idx = nvml_index(w.req.device)  # None on the CPU
    sync = torch.cuda.synchronize if idx is not None else (lambda: None)
    probe = lambda target: {**count_kernels(fn if p.mode == "graph" else target, w.req.device),  # noqa: E731
                            "energy_J_per_token": energy_per_token(target, idx, p.B * p.q, sync)}
    skips = _cudagraph_skips()
    t = time_fn(fn, dataclasses.replace(timer, mode="eager" if compiled else p.mode), w.req.device, probe=probe)
    touched = None
    if w.cfg.is_moe and w.moe_impl in ("touched", "grouped"):
        touched = w.model.last_experts_touched(p.kind)
    c = dataclasses.replace(cost_of(touched), mask_bytes=mask)
    row = t.to_row()
    if compiled:
        row.update(compiled, t_mode="eager (recompile-limit fallback)" if compiled["compile_fallback"] else "compiled",
                   compile_recompiled_while_timed=fn.graphs_now() > compiled["compile_graphs"])
    row.update(c.as_row())
    seen = t.probe.pop("kernel_attn_backend")
    row.update(t.probe, attn_backend=seen or backend)
    row.update(cuda_graphs=_used_cuda_graphs(p.mode, w.req.device, skips))
    if not compiled and w.gemm_kernel.startswith("skinny"):
        # the step's time inside the skinny GEMMs, 3 calls after the timed ones: what of the step
        # is the weights' stream and what the rest of the eager pass (report: regime.decode_notes)
        row["t_gemm_s"] = cpu_gemm.kernel_seconds(fn)
    row.update(gemm_kernel=w.gemm_kernel, decode_attention=w.decode_attention, moe_impl=w.moe_impl, kv_impl=kvcache.impl(w.model), achieved_GBps=c.bytes_total / t.median_s / 1e9,
               achieved_TFLOPs=c.flops / t.median_s / 1e12, tokens_per_s=p.B * p.q / t.median_s,
               t_p99_s=float(np.quantile(t.samples_s, 0.99)),
               samples_s=list(t.samples_s))  # to the samples sidecar, not the row
    return row


def _cudagraph_skips() -> int:
    """Inductor's count of compiled graphs it ran without CUDA graphs (it logs 'skipping
    cudagraphs due to ...' and bumps counters['inductor']['cudagraph_skips'])."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["inductor"]["cudagraph_skips"])
    except Exception:
        return 0


def _used_cuda_graphs(mode: str, device: str, skips_before: int, skips_after: int | None = None) -> bool | None:
    """Whether the timed step replayed CUDA graphs: graph mode always; compiled mode on CUDA
    unless Inductor skipped them while this point compiled (a CPU op, a dynamic shape, a
    mutated input...: the row is then a compiled step with launch overhead); None off CUDA."""
    if parse_device(device, need_available=False).type != "cuda":
        return None
    if mode == "graph":
        return True
    if mode != "compiled":
        return False
    after = _cudagraph_skips() if skips_after is None else skips_after
    return after == skips_before


def _bound(row: dict, ridge: float | None) -> dict:
    if ridge is None or row.get("intensity") is None:
        return dict(ridge_datasheet=ridge, bound_datasheet=None)
    return dict(ridge_datasheet=ridge, bound_datasheet="memory" if row["intensity"] < ridge else "compute")


def ceiling_columns(row: dict, dtype: str, measured: dict | None, datasheet) -> dict:
    """Achieved bandwidth and FLOP/s as % of the measured and of the datasheet ceiling, side
    by side, and the bound regime against the measured ridge."""
    label, dtype = dtype, activation_dtype(dtype)
    short = datasheet_column(dtype)
    pct = lambda v, c: None if not c or v is None else 100.0 * v / c
    out = dict(pct_datasheet_bw=pct(row.get("achieved_GBps"), datasheet.mem_bw_GBps),
               pct_datasheet_flops=pct(row.get("achieved_TFLOPs"), (datasheet.peak_flops(short) or 0) / 1e12))
    if measured:
        summ = measured["summary"]
        peaks = summ.get("peak_tflops") or {}
        bw, tf = summ.get("mem_bw_GBps"), peaks.get(dtype, peaks.get(short))
        ridge = tf * 1e12 / (bw * 1e9) if bw and tf else None
        out.update(ceiling_bw_GBps=bw, ceiling_TFLOPs=tf, ridge_measured=ridge,
                   pct_measured_bw=pct(row.get("achieved_GBps"), bw),
                   pct_measured_flops=pct(row.get("achieved_TFLOPs"), tf),
                   bound_measured=None if ridge is None else ("memory" if row["intensity"] < ridge else "compute"))
        p = parse_precision(label)
        if not p.weights.is_float:  # the roof the format's own packed kernel reached (decode GEMM, M=1)
            roof = (summ.get("decode_m1_GBps") or {}).get(precision(p.activations, p.weights.name).label)
            out.update(format_roof_GBps=roof, pct_format_roof=pct(row.get("achieved_GBps"), roof))
    return out


def extrapolate_layers(rows: list[dict], layers_full: int) -> list[dict]:
    """Full-depth rows from n- and 2n-layer rows of the same point: T = a + layers·b, and the
    physics recomputed for the full model by the caller's cost function."""
    by_key: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        # an MTP module is one block whatever the depth: only the main forward extrapolates
        if r.get("status") == "ok" and r["kind"] == "forward":
            key = (r["kind"], r["dtype"], r["mode"], r["q"], r["B"], r["L"])
            by_key.setdefault(key, {})[r["layers_run"]] = r
    out = []
    for key, depths in by_key.items():
        if len(depths) != 2:
            continue
        n, n2 = sorted(depths)
        if n2 == layers_full:  # 2n is the full depth: the measured row is the full-depth row
            continue
        per_layer = (depths[n2]["t_median_s"] - depths[n]["t_median_s"]) / (n2 - n)
        full = dict(depths[n2])
        full["t_median_s"] = depths[n]["t_median_s"] + (layers_full - n) * per_layer
        for k in ("t_p10_s", "t_p90_s"):  # the 2n-layer run's relative spread around the extrapolated median
            full[k] = full["t_median_s"] * depths[n2][k] / depths[n2]["t_median_s"]
        full.update(layers_run=layers_full, extrapolated=True, layers_measured=f"{n},{n2}",
                    per_layer_s=per_layer, fixed_s=depths[n]["t_median_s"] - n * per_layer,
                    **slicing.judge(depths[n], depths[n2], layers_full))
        out.append(full)
    return out


def finalize(req: SweepRequest, run_dir: Path, rows: list[dict], measured: dict | None = None) -> "pd.DataFrame":
    """points.csv: measured rows, plus extrapolated full-depth rows when slicing."""
    table = list(rows)
    if req.layers:
        sheet = datasheet_for_running_device(req.device)[0]
        for r in extrapolate_layers(rows, req.model.layers):
            c = (forward_cost if r["kind"] == "forward" else mtp_cost)(
                req.model, r["dtype"], r["B"], r["q"], r["L"], r["kv_len"], r["moe_impl"],
                kv_impl=r.get("kv_impl") or "float")
            r.update(c.as_row())
            t = r["t_median_s"]
            r.update(achieved_GBps=c.bytes_total / t / 1e9, achieved_TFLOPs=c.flops / t / 1e12,
                     tokens_per_s=r["B"] * r["q"] / t, point_id=r["point_id"] + "|extrapolated",
                     **_bound(r, sheet.ridge(activation_dtype(r["dtype"]))))
            r.update(ceiling_columns(r, r["dtype"], measured, sheet))
            table.append(r)
        refused = [r for r in table if r.get("status") == "refused"]
        if refused:
            print(f"WARNING slicing: {len(refused)} point(s) not extrapolated to {req.model.layers} layers; "
                  f"first: {refused[0]['point_id']}: {refused[0]['error']}", file=sys.stderr)
    return results.write_csv(table, run_dir / "points.csv")


GRID_AXES = ("q", "B", "L", "dtypes", "modes", "mtp_q")


def _union(old: list, new: tuple) -> tuple:
    merged = list(old) + [v for v in new if v not in old]
    return tuple(sorted(merged)) if all(isinstance(v, int) for v in merged) else tuple(merged)


def check_run_dir(req: SweepRequest, run_dir: Path, force: bool = False,
                  extend: bool = False) -> tuple[SweepRequest, dict | None, list]:
    """What a sweep would do with run_dir, writing nothing (the dry run asks this too): (the
    request to measure, the run.json kept or None for a fresh folder, the extension log). A folder
    holding another measurement, or one of another results schema, is refused naming what
    differs, unless `force`; when only grid values differ, `extend` measures the union grid."""
    runfolder.check_folder_path(run_dir, "out_dir")
    meta = run_dir / "run.json"
    if force and extend:
        raise ConfigError("force=true and extend=true: force sets the old run aside, extend adds to it; choose one")
    if force:
        return req, None, []
    if not meta.exists():
        if (run_dir / "points.jsonl").exists():
            raise ConfigError(f"out_dir={str(run_dir)!r} holds points.jsonl but no run.json: not a run folder this "
                              "code wrote or can resume; choose another out_dir, or force=true to set it aside")
        return req, None, []
    try:
        old = json.loads(meta.read_text())
        old_id = old.get("identity") or {}
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise ConfigError(f"out_dir={str(run_dir)!r}: run.json is unreadable ({e}); force=true sets the folder aside")
    if old.get("schema_version") != results.SCHEMA_VERSION:
        raise ConfigError(f"out_dir={str(run_dir)!r}: run.json has schema_version={old.get('schema_version')!r}, this "
                          f"code reads {results.SCHEMA_VERSION}; choose another out_dir, or force=true to set it aside")
    was = (old.get("spec") or {}).get("ceilings", req.ceilings) or ""
    if was != req.ceilings:  # the ceilings stay out of the fingerprint, but one run has one set of roofs
        raise ConfigError(f"ceilings={req.ceilings or None!r}: the rows in out_dir={str(run_dir)!r} are put against "
                          f"ceilings={was or None!r}; give the same ceilings, another out_dir, or force=true")
    if old.get("fingerprint") == req.fingerprint():
        return req, old, old.get("extended", [])
    identity = req.identity()
    diff = sorted(k for k in set(old_id) | set(identity) if old_id.get(k) != identity.get(k))
    if extend and old_id and set(diff) <= set(GRID_AXES):
        req = dataclasses.replace(req, **{k: _union(old_id[k], getattr(req, k)) for k in GRID_AXES})
        identity = req.identity()
        return req, old, old.get("extended", []) + [dict(time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                                          added={k: identity[k] for k in diff})]
    what = "; ".join(f"{k}: {old_id.get(k)!r} -> {identity.get(k)!r}" for k in diff) if old_id \
        else "written by an older version of this code"
    hint = "extend=true to add the new grid values" if set(diff) <= set(GRID_AXES) and old_id else ""
    raise ConfigError(f"out_dir={str(run_dir)!r} holds a different sweep (fingerprint "
                      f"{old.get('fingerprint')} != {req.fingerprint()}; {what or 'its run.json was edited'}); "
                      f"choose another out_dir, force=true to re-measure{', or ' + hint if hint else ''}")


def prepare_run_dir(req: SweepRequest, run_dir: Path, force: bool = False, extend: bool = False) -> SweepRequest:
    """Create or reopen a run folder (its lock held); return the request to measure (see
    check_run_dir; with `force` the old files are set aside first)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = run_dir / "run.json"
    req, old, extended = check_run_dir(req, run_dir, force, extend)
    if force:
        runfolder.set_aside(run_dir)
    if old is None:
        files.write_json_atomic(meta, dict(fingerprint=req.fingerprint(), schema_version=results.SCHEMA_VERSION,
                                           identity=req.identity(), spec=dataclasses.asdict(req)))
    elif old.get("fingerprint") != req.fingerprint():
        files.write_json_atomic(meta, dict(old, fingerprint=req.fingerprint(), identity=req.identity(),
                                           spec=dataclasses.asdict(req), extended=extended))
    return req


def _given_elsewhere(ceilings: str, run_dir: Path) -> bool:
    """ceilings= names a file (or folder) other than the run folder's own ceilings.json."""
    if ceilings in ("", "quick"):
        return False
    given = Path(ceilings) / "ceilings.json" if Path(ceilings).is_dir() else Path(ceilings)
    return given.resolve() != (Path(run_dir) / "ceilings.json").resolve()


def _ceilings_for(req: SweepRequest, run_dir: Path) -> dict | None:
    """The measured ceilings the rows are put against, checked to be of this device."""
    from roofline.measure.ceilings import load_ceilings
    if not req.ceilings:
        return None
    path = Path(req.ceilings) if req.ceilings != "quick" else run_dir / "ceilings.json"
    if req.ceilings == "quick" and not path.exists():
        return None
    if not path.exists() or (path.is_dir() and not (path / "ceilings.json").exists()):
        raise ConfigError(f"ceilings={req.ceilings!r}: no such ceilings.json; allowed a file written by "
                          "roofline.cli.ceilings, or quick")
    doc = load_ceilings(path)
    here = spec_device_name(req.device)
    there = (doc.get("provenance") or {}).get("device_name")
    if there != here:
        raise ConfigError(f"ceilings={str(path)!r}: measured on {there!r}, this sweep runs on {here!r} "
                          f"(device={req.device}); measure this device's ceilings or use ceilings=quick")
    return doc


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM: the points saved so far are in the run folder (summary attached;
    `signum` is the signal, the command exits 128 + signum)."""

    def __init__(self, summary: dict, signum: int = signal.SIGINT):
        super().__init__(summary)
        self.summary, self.signum = summary, int(signum)


def run_sweep(req: SweepRequest, run_dir: Path, progress: bool = True,
              measure: Callable[[BuiltModel, Point, TimerSettings], dict] = _measure,
              force: bool = False, extend: bool = False, retry_failed: bool = True, workload=None,
              noise: NoiseSettings | None = NoiseSettings()) -> dict:
    """Measure every point not already in run_dir; return the counts. `measure` is the
    per-point step (tests inject failures through it); `workload` the class that builds the
    model (the distributed runner's sharded one; tp/ep > 1 starts the ranks first); `noise`
    the busy-machine check (roofline.measure.noise; None: off). Bad input
    (a device that is not here, a ceilings file of another device, a folder of another sweep)
    is refused before anything is written; see roofline.io.runfolder for the folder's lock and resume."""
    if AUTO not in req.dtypes:
        req, _ = resolve_auto(req, Path(run_dir))  # modes=[auto] -> eager; nothing measured
    if workload is None and req.parallel.devices > 1:
        raise ConfigError(f"tp={req.parallel.tp} ep={req.parallel.ep}: a sweep over "
                          f"{req.parallel.devices} ranks runs through roofline.parallel.runner.run_parallel_sweep")
    t0 = time.time()
    run_dir = Path(run_dir)
    req.identity()  # the device must exist before a folder is made
    runfolder.check_folder_path(run_dir, "out_dir")
    if req.ceilings and req.ceilings != "quick":
        _ceilings_for(req, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with runfolder.locked(run_dir):
        return _run_locked(req, run_dir, progress, measure, force, extend, retry_failed, t0, workload or BuiltModel,
                           noise)


def resolve_auto(req: SweepRequest, run_dir: Path, log=None, measure: bool = True) -> tuple[SweepRequest, dict | None]:
    """dtypes=[auto] (and modes=[auto]) made concrete from this device's measured ceilings
    (roofline.measure.ceilings.choose_precision; a quick set is measured first when the sweep has
    none): the auto dtype in its fast mode, a named dtype eager (modes=[auto]) or in the modes
    given. Returns the resolved request and the quick ceilings measured for it (None if none were)."""
    from roofline.measure.ceilings import CeilingsRequest, choose_precision, measure_ceilings
    if AUTO not in req.dtypes:  # modes=[auto] for named dtypes: eager (as before auto existed)
        modes = tuple(dict.fromkeys("eager" if m == AUTO else m for m in req.modes))
        return (dataclasses.replace(req, modes=modes) if modes != req.modes else req), None
    fresh = None
    if AUTO in req.dtypes:
        doc = _ceilings_for(req, run_dir) if req.ceilings else None
        if doc is None and measure:
            fresh = doc = measure_ceilings(CeilingsRequest(device=req.device, quick=True))
        dtype, mode, why = choose_precision(req.device, doc)
    else:
        dtype, mode, why = None, "eager", ""
    explicit = [m for m in req.modes if m != AUTO]
    fast, moe_why = _runnable_mode(req.model, mode, req.device, dtype)
    if AUTO in req.modes:
        why = "; ".join(filter(None, [why, moe_why]))
    pairs, dtypes = [], []
    for d in req.dtypes:
        label = dtype if d == AUTO else d
        if label not in dtypes:
            dtypes.append(label)
        for m in (explicit or []) + ([fast if d == AUTO else "eager"] if AUTO in req.modes else []):
            if (label, m) not in pairs:
                pairs.append((label, m))
    if log and why:
        log(why)
    out = dataclasses.replace(req, dtypes=tuple(dtypes), modes=tuple(sorted({m for _, m in pairs})),
                              pairs=tuple(pairs), auto_choice=why,
                              ceilings=req.ceilings or ("quick" if fresh is not None else ""))
    return out, fresh


def _run_locked(req, run_dir, progress, measure, force, extend, retry_failed, t0, workload, noise=None) -> dict:
    req, fresh = resolve_auto(req, run_dir, log=lambda m: print(m, file=sys.stderr, flush=True))
    req = prepare_run_dir(req, run_dir, force, extend)
    resumed = runfolder.load_points(run_dir, runfolder.TRANSIENT if retry_failed else ())
    done = {r["point_id"] for r in resumed.rows}
    points = grid(req)
    todo = [p for p in points if p.point_id not in done]
    prov = provenance.collect(req.device)
    sheet, _ = datasheet_for_running_device(req.device)
    measured = _ceilings_for(req, run_dir)
    if req.ceilings == "quick" and measured is None:  # measure a quick set into the run folder, once
        from roofline.measure.ceilings import CeilingsRequest, measure_ceilings, write_ceilings
        measured = fresh if fresh is not None else measure_ceilings(CeilingsRequest(device=req.device, quick=True))
        write_ceilings(measured, run_dir)
    if measured is not None and parse_device(req.device).type == "cpu":
        req = dataclasses.replace(req, skinny_max_m=tuple(cpu_gemm.crossovers(measured).items()))
    busy = [b["group"] for b in ((measured or {}).get("summary") or {}).get("busy_machine") or []]
    if busy:
        print(f"warning: ceilings: {len(busy)} group(s) were measured on a busy machine ({', '.join(busy[:4])}"
              f"{', ...' if len(busy) > 4 else ''}): the % of measured roofs may be too high; re-measure the "
              "ceilings on a quiet machine", file=sys.stderr)
    if measured is not None and req.ceilings != "quick" and _given_elsewhere(req.ceilings, run_dir):
        # the roofs the rows are put against travel with them: report, plots and fit read the run
        # folder's ceilings.json (and its busy-machine marks), not a path that may change
        from roofline.measure.ceilings import write_ceilings
        write_ceilings(measured, run_dir)
    bar = tqdm(total=len(points), initial=len(points) - len(todo), desc=f"sweep {req.model.name}",
               unit="pt", disable=not progress, file=sys.stderr)
    new = 0
    monitor = NoiseMonitor(noise, req.device, log=lambda m: tqdm.write(m, file=sys.stderr)) if noise and todo else None

    def ok_row(w, p):
        row = measure(w, p, req.timer)
        samples = row.pop("samples_s", None)
        row.update(status="ok", error=None, converged=bool(row["t_ci_rel"] <= req.timer.rel_ci),
                   **_bound(row, sheet.ridge(activation_dtype(p.dtype))),
                   **ceiling_columns(row, p.dtype, measured, sheet))
        if is_math_fallback(row, req.device):
            row.update(status=MATH_FALLBACK, error=f"attention ran torch's math path ({row['attn_backend']}):"
                       " it moves bytes the accounting does not charge; not a memory measurement")
        return row, samples

    sig = runfolder.Signals()

    def write(r, samples):
        with sig.writing():  # a signal waits for the line: a finished point is never a torn one
            if samples:
                results.append_samples(run_dir, r["point_id"], samples)
            results.append_row(run_dir / "points.jsonl", r)

    def correct(fixes):
        for c in fixes:
            with sig.writing():
                if c["samples"]:
                    results.append_samples(run_dir, c["point_id"], c["samples"])
                results.append_correction(run_dir, c["point_id"], c["set"])

    try:
        with sig:
            for (dtype, depth, mode), group in itertools.groupby(todo, key=lambda p: (p.dtype, p.layers_run, p.mode)):
                group = list(group)
                builds, too_big = memory_plan(req, dtype, depth, group)
                by_id = {p.point_id: p for p in group}
                rank = {p.point_id: i for i, p in enumerate(group)}
                batches = [(None, [by_id[k] for k in too_big])] + [
                    ((b, c), sorted((by_id[k] for k in keys), key=lambda p: rank[p.point_id])) for b, c, keys in builds]
                for cache, pts in batches:  # one model build per cache size that fits; too-big points alone
                    w, setup_error = None, None
                    if cache is not None and pts:
                        try:
                            w = workload(req, dtype, depth, mode, *cache)
                            w.check()
                        except ConfigError:  # bad input found only at the build (NaN weights): one line, exit 2
                            raise
                        except Exception as e:  # the whole build fails as data
                            setup_error, w = e, None
                    for p in pts:
                        base = dict(point_id=p.point_id, kind=p.kind, model=req.model.name, dtype=p.dtype,
                                    mode=p.mode, q=p.q, B=p.B, L=p.L, layers_run=p.layers_run,
                                    layers_full=req.model.layers, extrapolated=False,
                                    schema_version=results.SCHEMA_VERSION, overrides=" ".join(req.overrides),
                                    fingerprint=req.fingerprint(), **prov, **req.parallel.as_row(),
                                    **precision_columns(p.dtype))
                        samples = None
                        try:
                            if p.point_id in too_big:
                                raise memory.TooBig(too_big[p.point_id])
                            if setup_error is not None:
                                raise setup_error
                            row, samples = ok_row(w, p)
                        except Exception as e:
                            status = "too_big" if isinstance(e, memory.TooBig) else _failure_status(e)
                            row = dict(status=status, error=f"{type(e).__name__}: {e}"[:500])
                        if monitor is not None:  # not judged yet: the monitor's verdict comes as a correction
                            row.update(noisy=None, noise_reason=None)
                        write({**base, **row}, samples)  # on disk now, whatever the monitor says later
                        new += 1
                        bar.update(1)
                        if monitor is not None:
                            again = (lambda w=w, p=p, base=base: _with_samples(base, ok_row(w, p))) \
                                if row["status"] == "ok" else None
                            correct(monitor.add({**base, **row}, again))
                    correct(monitor.flush() if monitor else [])
                    del w
                if parse_device(req.device).type == "cuda":
                    torch.cuda.empty_cache()
            bar.close()  # the monitor's last verdicts and the summary are inside: a signal there still reports
            quiet = monitor.finish(run_dir) if monitor else {}
            return _summarize(req, run_dir, measured, points, todo, new, resumed, t0, quiet)
    except KeyboardInterrupt as e:
        with runfolder.Signals.ignored():  # a second signal (a forwarded one) must not cut the summary
            bar.close()
            summary = _summarize(req, run_dir, measured, points, todo, new, resumed, t0)
        raise SweepInterrupted(summary, getattr(e, "signum", signal.SIGINT)) from None


def _with_samples(base: dict, measured: tuple[dict, list | None]) -> dict:
    row, samples = measured
    return {**base, **row, "_samples": samples}


def _summarize(req, run_dir, measured, points, todo, new, resumed, t0, quiet=None) -> dict:
    rows = results.apply_corrections(run_dir, results.read_rows(run_dir / "points.jsonl"))
    df = finalize(req, run_dir, rows, measured)
    ok = sum(r["status"] == "ok" for r in rows)
    slow = [r["point_id"] for r in rows if r["status"] == "ok" and r.get("converged") is False]
    return dict(run_dir=str(run_dir), points=len(points), measured_now=new, resumed=len(points) - len(todo),
                ok=ok, failed=len(rows) - ok, not_converged=len(slow), not_converged_points=slow,
                quarantined=resumed.quarantined, retried=resumed.retried, wall_s=round(time.time() - t0, 2),
                rows=len(df), noisy=sum(bool(r.get("noisy")) for r in rows),
                noise_monitor_s=(quiet or {}).get("monitor_s", 0.0))


# rates a dry run assumes for a step time when neither measured ceilings nor a datasheet give them
# (a CPU without ceilings=): low on purpose, the time bound is to be an upper one
ASSUMED_GBps, ASSUMED_TFLOPs = 5.0, 0.01


def _rates(req: SweepRequest, run_dir: Path, dtype: str) -> tuple[float, float, str]:
    """(bytes/s, FLOP/s, where they come from) to estimate a step time before measuring it."""
    from roofline.measure.ceilings import load_ceilings
    path = run_dir / "ceilings.json" if req.ceilings == "quick" else Path(req.ceilings) if req.ceilings else None
    if path is not None and path.exists():
        summ = load_ceilings(path).get("summary") or {}
        bw, tf = summ.get("mem_bw_GBps"), (summ.get("peak_tflops") or {}).get(activation_dtype(dtype))
        if bw and tf:
            return bw * 1e9, tf * 1e12, f"measured ceilings ({path.name})"
    sheet = datasheet_for_running_device(req.device)[0]
    bw, f = sheet.bandwidth_Bps(), sheet.peak_flops(activation_dtype(dtype))
    if bw and f:
        return bw, f, f"the datasheet of {sheet.name}"
    return ASSUMED_GBps * 1e9, ASSUMED_TFLOPs * 1e12, (f"assumed {ASSUMED_GBps:g} GB/s and {ASSUMED_TFLOPs * 1e3:g} "
                                                      "GFLOP/s (no ceilings=; give one for a closer bound)")


def point_seconds(step_s: float, t: TimerSettings) -> float:
    """Wall time of one point at a step time: warm-up passes, then repetitions until the budget
    is spent, never fewer than min_reps (a slow step runs min_reps however long), nor more than max_reps."""
    reps = min(t.max_reps, max(t.min_reps, math.ceil(t.budget_s / step_s) + 1 if step_s > 0 else t.max_reps))
    return (t.warmup + reps) * step_s + (2 * step_s if t.l2 == "cold" else 0.0)


def dry_run(req: SweepRequest, run_dir: Path, force: bool = False, extend: bool = False) -> str:
    """What a sweep would do, measuring and writing nothing: the expanded grid, each point's
    memory fit against what the device can give now, and an upper bound on the time."""
    req, _ = resolve_auto(req, run_dir, measure=False)  # without ceilings: the device's flags decide
    req, old, _ = check_run_dir(req, run_dir, force, extend)  # refused here as the real command refuses it
    pts = grid(req)
    done = set()
    if old is not None:
        done = {r["point_id"] for r in runfolder.read_points(run_dir)[0] if r["status"] == "ok"}
    rows, groups = [], 0
    for (dtype, depth, mode), group in itertools.groupby(pts, key=lambda p: (p.dtype, p.layers_run, p.mode)):
        group = list(group)
        cfg = req.model.scaled(layers=depth)
        builds, too_big = memory_plan(req, dtype, depth, group)
        bw, fl, _ = _rates(req, run_dir, dtype)
        for p in group:
            need = memory.peak_bytes(cfg, dtype, p.B, p.L + p.q, p.q, cfg.mtp_layers > 0)
            build = next((i for i, (_, _, keys) in enumerate(builds) if p.point_id in keys), None)
            c = (forward_cost if p.kind == "forward" else mtp_cost)(cfg, dtype, p.B, p.q, p.L)
            step = max(c.bytes_total / bw, c.flops / fl)
            rows.append(dict(point=p.point_id, peak_GB=round(need.total / 1e9, 3),
                             memory="TOO BIG" if build is None else f"fits (build {groups + build + 1})",
                             state="done (resumed)" if p.point_id in done else "to measure",
                             step_ms_est=float(f"{step * 1e3:.3g}"),
                             point_s_est=float(f"{point_seconds(step, req.timer):.3g}")))
        groups += len(builds)
    free, where = memory.available(req.device)
    todo = sum(r["state"] == "to measure" for r in rows)
    est = sum(r["point_s_est"] for r in rows if r["state"] == "to measure" and r["memory"] != "TOO BIG")
    rates = _rates(req, run_dir, req.dtypes[0])[2]
    t = req.timer
    with pd.option_context("display.width", 200, "display.max_rows", 10000, "display.max_colwidth", 80):
        table = pd.DataFrame(rows).to_string(index=False)
    axes = ", ".join(f"{a}={list(getattr(req, a))}" for a in ("dtypes", "modes", "q", "B", "L"))
    return "\n".join([
        f"dry run of {req.model.name} on {req.device} into {run_dir} (nothing measured or written)",
        f"grid: {axes}" + (f", layers {req.layers} and {2 * req.layers} of {req.model.layers}" if req.layers else ""),
        f"{len(pts)} points in {groups} model builds; {len(pts) - todo} already in out_dir; {todo} to measure; "
        f"{sum(r['memory'] == 'TOO BIG' for r in rows)} too big for {where} (peak: weights in their dtype + "
        "static KV cache + one float32 parameter + the pass's activations)",
        table,
        f"time: about {est:.3g} s for the {todo} points to measure (each: {t.warmup} warm-up passes, then repetitions "
        f"until timer.budget_s {t.budget_s:g} s, never fewer than min_reps {t.min_reps} however slow a step, nor more "
        f"than max_reps {t.max_reps}; step times estimated from the byte and FLOP counts at {rates}), plus the "
        f"correctness check and {groups} model build(s)",
    ])


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """T(q)/T(1), the step time's p50/p90/p99 (ms) and achieved GB/s per (kind, dtype, mode, B, L) at full depth."""
    ok = df[(df["status"] == "ok") & (df["layers_run"] == df["layers_full"])]
    out = []
    for key, g in ok.groupby(["kind", "dtype", "mode", "B", "L"]):
        g = g.sort_values("q")
        t1 = g.loc[g["q"] == g["q"].min(), "t_median_s"].iloc[0]
        for _, r in g.iterrows():
            out.append(dict(zip(["kind", "dtype", "mode", "B", "L"], key), q=r["q"], p50_ms=1e3 * r["t_median_s"],
                            p90_ms=1e3 * r.get("t_p90_s", np.nan), p99_ms=1e3 * r.get("t_p99_s", np.nan),
                            t_over_t1=r["t_median_s"] / t1, GBps=r["achieved_GBps"], TFLOPs=r["achieved_TFLOPs"]))
    return pd.DataFrame(out)
