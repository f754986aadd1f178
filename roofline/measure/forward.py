"""What a timed forward really ran: its kernels, its attention backend, and how exact it must be.

A row's GB/s means "a memory measurement" only if the forward ran the kernels the byte model
assumes. Three things can quietly break that, and each is recorded per row:

- Kernels per forward (`count_kernels`): one profiled call (torch.profiler), outside the timed
  region. On CUDA it counts the device kernels launched (memcpy/memset excluded); on the CPU,
  where there are no kernels, the top-level aten ops the profiler sees (what an eager forward
  dispatches one by one). An eager 8B forward launches ~2,000 kernels: at decode size their
  fixed cost is of the order of the weight reads, which is why decode is timed as a CUDA-graph
  replay or compiled.
- The attention backend (`attention_backends`): which of torch's scaled-dot-product kernels
  each attention call selects for its actual tensors (torch's own dispatcher is asked:
  `torch._fused_sdp_choice`, and for a lower-right causal bias the rule of
  torch.nn.attention.bias.CausalBias: Flash, else memory-efficient, else math). The math
  path materialises scores and repeats grouped KV heads: it moves far more bytes than the
  accounting charges, so on CUDA a row whose attention ran it is not a memory measurement
  (`MATH_FALLBACK`).
- The correctness gate (`min_cosine`): the forward of q tokens must equal q single-token
  forwards. In half precision the two orders round differently at every layer; see
  `min_cosine` for the depth-scaled tolerance.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from typing import Any, Callable, Iterator

import torch

from roofline.measure.devices import is_cuda
from roofline.measure.timer import CpuClock
from roofline.model import decoder
from roofline.model.dtypes import torch_dtype
from roofline.model.formats import compute_dtype

MATH_FALLBACK = "math_fallback"  # row status: attention ran torch's math path on CUDA
FLOOR = 1e-3  # 1 - cosine always allowed: the gate of float32 (and of shallow half models)
CEILING = 0.1  # 1 - cosine never allowed: past it the gate could not tell rounding from a bug (fp8 math)
_BACKENDS = {-1: "error", 0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def min_cosine(layers: int, dtype: torch.dtype | str) -> float:
    """Smallest cosine between the q-token forward and q single-token forwards that passes.

    Derivation. Each layer adds its residual update rounded to the dtype: two evaluation
    orders of the same layer differ by a relative error of about eps per rounding, and the
    errors of successive layers are independent, so their squares add: after `layers`
    layers the relative L2 difference of the logits is epsilon ~ sqrt(layers * c) * eps with
    c ~ a few roundings per layer. For small epsilon, 1 - cos = epsilon^2 / 2, so the
    allowed 1 - cos grows LINEARLY with depth: 1 - cos <= layers * 2 * eps^2 (c = 4: a
    factor of about 4 of margin over what was measured, below). float32's eps makes that
    negligible, so FLOOR (the old fixed gate, 0.999) applies.

    Measured on the CPU at the real llama-3.1-8b shapes in bf16 (32 layers): cosine 0.9991,
    i.e. 1 - cos = 9e-4, 2.8e-5 per layer; the bound gives 32 * 2 * 2^-14 = 3.9e-3 (0.9961).
    `dtype` may be a precision label (roofline.model.formats): the matmuls' compute dtype
    counts (fp8 for fp8 weights; the activations for weight-only int8/int4, whose weights are
    the same in both evaluation orders), capped at CEILING.

    Real bugs are far outside either: a query that sees the future, a wrong RoPE position or
    a cache slot written twice change the logits by tens of percent (1 - cos >> 1e-2).
    """
    name = compute_dtype(dtype)
    eps = torch.finfo(getattr(torch, name) if name.startswith("float8") else torch_dtype(name)).eps
    return 1.0 - min(CEILING, max(FLOOR, 2.0 * layers * eps * eps))


# --------------------------------------------------------------------------- attention backend


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scale: float | None = None,
                 cpu_decode: str = "grouped") -> str:
    """The kernel `roofline.model.decoder.attend` runs for these tensors and this mask."""
    if q.device.type == "cpu" and q.shape[2] == 1 and cpu_decode == "grouped":
        return "cpu_grouped_matmul"  # attend's own CPU decode path (not SDPA)
    gqa = k.shape[1] != q.shape[1]
    if mask is not None and not type(mask) is torch.Tensor:  # a CausalBias (lower-right causal)
        if q.device.type != "cuda":
            return "math"
        from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention
        params = SDPAParams(q, k, v, None, 0.0, False, gqa)
        if can_use_flash_attention(params, False):
            return "flash"
        return "efficient" if can_use_efficient_attention(params, False) else "math"
    choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, False, scale=scale, enable_gqa=gqa)
    return _BACKENDS.get(int(choice), f"backend_{int(choice)}")


@contextlib.contextmanager
def attention_backends() -> Iterator[list[str]]:
    """Inside the block, every call of the decoder's attention appends its backend to the list."""
    seen: list[str] = []
    original = decoder.attend

    def recording(q, k, v, mask, scale=None, cpu_decode="grouped"):
        seen.append(sdpa_backend(q, k, v, mask, scale, cpu_decode))
        return original(q, k, v, mask, scale, cpu_decode)

    decoder.attend = recording
    try:
        yield seen
    finally:
        decoder.attend = original


def one_backend(seen: list[str]) -> str | None:
    """The backend of a forward: the one name, or 'a+b' when layers differ (None: no attention)."""
    return "+".join(sorted(set(seen))) or None


def _decode_inputs(mod: torch.nn.Module, B: int, L: int, dtype: torch.dtype, gen: torch.Generator):
    """Random q, k, v, scale of one decode step of attention module `mod` over L cached keys, laid
    out as its forward hands them to `attend`: the first L positions of a cache as long as the
    module's own (GQA: q [B, h, 1, d] over k, v [B, h_kv, L, d]; MLA: the absorbed query over the
    one latent head). The module's own cache is not touched."""
    cfg = mod.cfg
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    if isinstance(mod, decoder.MLAttention):
        r, width = cfg.kv_lora_rank, cfg.kv_lora_rank + cfg.qk_rope_dim
        cache = rand(B, max(L, mod.kv_cache.shape[1]), width)[:, :L][:, None]
        return rand(B, cfg.heads, 1, width), cache, cache[..., :r], mod.scale
    longest = max(L, mod.k_cache.shape[2])
    k, v = (rand(B, cfg.kv_heads, longest, cfg.head_dim)[:, :, :L] for _ in range(2))
    return rand(B, cfg.heads, 1, cfg.head_dim), k, v, None


DECODE_ATTENTION_REPS = 15  # interleaved rounds per (B, L) of choose_cpu_decode_attention


def choose_cpu_decode_attention(model: torch.nn.Module, shapes: list[tuple[int, int]], dtype: torch.dtype,
                                reps: int = DECODE_ATTENTION_REPS, clock=None) -> tuple[str, dict]:
    """The faster of attend's two CPU decode paths (decoder.CPU_DECODE_ATTENTION) on this machine,
    for the model's attention shape, at each (B, L) of `shapes` (L: the keys read), and the
    timings: {"grouped_us": {...}, "sdpa_us": {...}} per "B{B}_L{L}" (median of `reps`
    interleaved rounds, one call each, on the project's CPU clock or `clock`). Chosen: SDPA where the median over the shapes of
    t_sdpa / t_grouped is < 1, else the grouped matmul (the default). None of the model's
    weights or caches is touched; a model without attention keeps the default."""
    mods = decoder.attention_modules(model)
    if not mods or not shapes:
        return "grouped", {}
    mod, gen, clock = mods[0], torch.Generator().manual_seed(0), clock or CpuClock()
    times = {impl: {} for impl in decoder.CPU_DECODE_ATTENTION}
    with torch.inference_mode():
        for B, L in shapes:
            q, k, v, scale = _decode_inputs(mod, B, L, dtype, gen)
            calls = {impl: (lambda impl=impl: decoder.attend(q, k, v, None, scale, impl)) for impl in times}
            for call in calls.values():
                call()  # warm-up
            samples = {impl: [] for impl in times}
            for _ in range(reps):
                for impl, call in calls.items():
                    samples[impl].append(clock.measure(call))
            for impl in times:
                times[impl][f"B{B}_L{L}"] = statistics.median(samples[impl]) * 1e6
    timed = {f"{name}_us": {k: round(t, 1) for k, t in d.items()} for name, d in times.items()}
    return ("sdpa" if sdpa_over_grouped(timed) < 1 else "grouped"), timed


def sdpa_over_grouped(timed: dict) -> float:
    """The median over the shapes of t_sdpa / t_grouped in choose_cpu_decode_attention's timings."""
    return statistics.median(timed["sdpa_us"][k] / timed["grouped_us"][k] for k in timed["sdpa_us"])


# --------------------------------------------------------------------------- kernels per forward


def _top_level_ops(events) -> int:
    count = 0
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        count += parent is None
    return count


def backend_from_kernel_names(names: list[str]) -> str | None:
    """The attention backend a CUDA profile shows by its kernel names (None: none recognised)."""
    found = set()
    for n in names:
        low = n.lower()
        if "flash_fwd" in low or "flash::" in low:
            found.add("flash")
        elif "cudnn" in low and ("sdpa" in low or "fmha" in low or "attention" in low):
            found.add("cudnn")
        elif "fmha" in low or "efficient_attention" in low:
            found.add("efficient")
    return "+".join(sorted(found)) or None


def count_kernels(fn: Callable[[], Any], device: str | torch.device) -> dict:
    """Profile one call of fn (warmed up by the caller: nothing compiles inside).

    {"kernels_per_forward": n, "kernels_counted": "cuda_kernels" | "cpu_top_level_ops",
    "kernel_attn_backend": the attention backend the CUDA kernel names show, or None}.
    """
    from torch.profiler import ProfilerActivity, profile

    from roofline.measure.quiet import native_stderr_filtered
    dev = torch.device(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with native_stderr_filtered(), profile(activities=activities) as prof:  # libkineto's USDT lines off the console
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    events = prof.events()
    if dev.type == "cuda":
        names = [e.name for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                 and not e.name.startswith(("Memcpy", "Memset"))]
        return {"kernels_per_forward": len(names), "kernels_counted": "cuda_kernels",
                "kernel_attn_backend": backend_from_kernel_names(names)}
    return {"kernels_per_forward": _top_level_ops(events), "kernels_counted": "cpu_top_level_ops",
            "kernel_attn_backend": None}


def eager_attention_backend(fn: Callable[[], Any]) -> str | None:
    """Call fn once eagerly and return the attention backend(s) torch's dispatcher chose."""
    with attention_backends() as seen:
        fn()
    return one_backend(seen)


def is_math_fallback(row: dict, device: str) -> bool:
    """On CUDA, attention on torch's math path: not a memory measurement."""
    backend = row.get("attn_backend") or ""
    return is_cuda(device) and "math" in backend.split("+")


def depth_cosine_gate(cos: float, layers: int, dtype) -> str | None:
    """None if cos passes `min_cosine`, else the reason (for the error message)."""
    need = min_cosine(layers, dtype)
    if not math.isfinite(cos) or cos < need:
        return f"cosine {cos:.6f} < {need:.6f} (min_cosine for {layers} layers in {dtype})"
    return None


# --------------------------------------------------------------------------- compiled CPU forward

COMPILE_RECOMPILE_LIMIT = 64  # distinct token counts (and kinds) one compiled function may hold


class RecompileFallback(RuntimeError):
    """torch.compile hit its recompile limit: without `fail_on_recompile_limit_hit` it would
    run the call eagerly, silently. A CompiledForward catches it and records the fallback."""


GEMM_BACKENDS = "CPP"  # the CPP micro-GEMM template alone: no autotuning (see inductor_cpu)
GEMM_BACKENDS_FALLBACK = "CPP,ATEN"  # where the template cannot take a GEMM: autotuned against ATen


@contextlib.contextmanager
def inductor_cpu(max_autotune: bool = True, recompile_limit: int = COMPILE_RECOMPILE_LIMIT,
                 gemm_backends: str = GEMM_BACKENDS) -> Iterator[None]:
    """Inductor as a CPU forward needs it (only inside the block; compiling happens at a first call):
    weight freezing (parameters become constants, so GEMM weights are prepacked once at compile
    time: oneDNN/MKL packed linears, or with max_autotune the CPP micro-GEMM template in a blocked
    layout, generated for the call's N, K and its M or a symbolic one), the recompile limit raised,
    and a hit of it raised as an error instead of a silent eager fallback.

    `gemm_backends` "CPP" (the default) takes the CPP template for every GEMM it can take, with
    no autotuning: "CPP,ATEN" benchmarks it against ATen's packed linears one GEMM at a time,
    with the weight warm in the cache, and on the 2-vCPU EPYC chose MKL's packed linear for every
    GEMM of the M = 1 graph and oneDNN's for the graphs of symbolic M (read from the generated
    code), kernels that stream a DRAM-resident weight slower and are not flat in M (docs/cpu.md);
    the benchmark was also a quarter of the compile. The autotuner's tables go to stderr directly
    (sys.stderr.write); they are kept off the console (the progress bar)."""
    import io

    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config
    patch = dict(freezing=True, max_autotune=max_autotune, max_autotune_report_choices_stats=False)
    if max_autotune:
        patch["max_autotune_gemm_backends"] = gemm_backends
    with inductor_config.patch(patch), dynamo_config.patch(recompile_limit=recompile_limit,
                                                           fail_on_recompile_limit_hit=True), \
            contextlib.redirect_stderr(io.StringIO()):
        yield


def _no_gemm_choice(e: BaseException) -> bool:
    """Inductor found no kernel for a GEMM with the backends it was given (NoValidChoicesError,
    however torch.compile wrapped it)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__name__ == "NoValidChoicesError" or "NoValidChoicesError" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _graphs_compiled() -> int:
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


class CompiledForward:
    """One model call `call(*args)` compiled for the CPU, its token axes dynamic: the batch B and
    the tokens per sequence q (dims 0 and 1 of every tensor argument; the rest static) are
    symbolic, and so is the cache length (`start_pos`, an int: `dynamic=True`). Inductor's CPP
    micro-GEMM template takes a symbolic M = B·q (its thread and cache blocking are chosen at run
    time; the register blocking and the prepacked weight layout depend only on N and K), so one
    graph serves every token count. Dynamo specialises a size of 1, and the decoder branches on
    q = 1 (attend's CPU decode path), so a kind holds at most four graphs, B = 1 or > 1 by q = 1
    or > 1, whatever the grid: a sweep of q = 1..8 at B = 1 and 4 compiles four graphs, not one
    per (q, B) (`static_tokens=True`: one per shape, the former behaviour, for comparisons).

    Each compile lowers every layer of the model (frozen weights are constants: the layers' GEMMs
    cannot share one compiled kernel call), so a graph costs about a minute on a 2-vCPU CPU.

    `prepare(*args)` runs the first call of these shapes (compiling a graph when no earlier graph
    serves them), checks its output against the eager call on the same inputs
    (`depth_cosine_gate`) and returns what a row records: compile_s (that first call, outside any
    timed region: a graph's compile, or a few seconds where an earlier graph served the shapes),
    compile_new_graph (whether it compiled one), compile_fallback (None, or why the call runs
    eagerly: the recompile limit), compile_graphs (graphs compiled so far), compile_gemm_backends
    (the GEMM backends it compiled with: "CPP", or "CPP,ATEN" where the template could not take
    some GEMM and Inductor found no kernel; `inductor_cpu`). `__call__` runs the compiled call, or the eager one after a fallback.
    """

    def __init__(self, call: Callable[..., Any], layers: int, dtype, max_autotune: bool = True,
                 recompile_limit: int = COMPILE_RECOMPILE_LIMIT, static_tokens: bool = False,
                 gemm_backends: str = GEMM_BACKENDS):
        self.call, self.layers, self.dtype = call, layers, dtype
        self.gemm_backends = gemm_backends
        self.max_autotune, self.recompile_limit = max_autotune, recompile_limit
        self.static_tokens = static_tokens
        self.compiled = torch.compile(call, dynamic=True)
        self.shapes: dict[tuple, dict] = {}

    @staticmethod
    def _key(args) -> tuple:
        return tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args)

    def _mark(self, args) -> None:
        """Every tensor dim static but the token axes B and q (all of them with static_tokens)."""
        for a in args:
            if isinstance(a, torch.Tensor):
                for dim in range(0 if self.static_tokens else min(2, a.dim()), a.dim()):
                    torch._dynamo.mark_static(a, dim)

    def prepare(self, *args) -> dict:
        key = self._key(args)
        if key in self.shapes:  # compiled for an earlier point: no new graph; graphs counted from now
            return {**self.shapes[key], "compile_new_graph": False, "compile_graphs": _graphs_compiled()}
        self._mark(args)
        before, t0 = _graphs_compiled(), time.perf_counter()
        fallback, backends = None, self.gemm_backends
        try:
            try:
                with torch.no_grad(), inductor_cpu(self.max_autotune, self.recompile_limit, backends):
                    out = self.compiled(*args)
            except Exception as e:
                if not (self.max_autotune and backends != GEMM_BACKENDS_FALLBACK and _no_gemm_choice(e)):
                    raise
                backends = GEMM_BACKENDS_FALLBACK  # a GEMM the CPP template cannot take: ATen beside it
                with torch.no_grad(), inductor_cpu(self.max_autotune, self.recompile_limit, backends):
                    out = self.compiled(*args)
        except Exception as e:
            if type(e).__name__ != "FailOnRecompileLimitHit":
                raise
            fallback = (f"recompile limit ({self.recompile_limit} graphs) hit at shapes {key}: "
                        "this call runs eagerly")
            out = None
        info = dict(compile_s=time.perf_counter() - t0, compile_fallback=fallback,
                    compile_graphs=_graphs_compiled(),
                    compile_gemm_backends=backends if self.max_autotune else "none (max_autotune off)")
        if out is not None:
            with torch.no_grad():
                ref = self.call(*args)
            a, b = _logits(out), _logits(ref)
            cos = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()
            why = depth_cosine_gate(cos, self.layers, self.dtype)
            if why:
                raise RuntimeError(f"compiled forward differs from eager at shapes {key}: {why}")
            info["compile_vs_eager_cosine"] = cos
            info["compile_new_graph"] = info["compile_graphs"] > before
        self.shapes[key] = info
        return info

    def __call__(self, *args):
        info = self.shapes.get(self._key(args))
        if info is None:
            raise RuntimeError("CompiledForward: prepare() these shapes first (compiling is never timed)")
        with torch.no_grad():
            return self.call(*args) if info["compile_fallback"] else self.compiled(*args)


def _logits(out) -> torch.Tensor:
    return (out[0] if isinstance(out, tuple) else out).float()


class CompiledCall:
    """A sweep point's call through its kind's CompiledForward: `prepare()` compiles (once per
    shape) and checks it; calling runs it; `eager` is the plain call (attention backend probe)."""

    def __init__(self, forward: CompiledForward, args: tuple, eager: Callable[[], Any]):
        self.forward, self.args, self.eager = forward, args, eager

    def prepare(self) -> dict:
        return self.forward.prepare(*self.args)

    def graphs_now(self) -> int:
        return _graphs_compiled()

    def __call__(self):
        return self.forward(*self.args)


def compiled_calls(model, layers: int, dtype, max_autotune: bool = True) -> dict[str, CompiledForward]:
    """The compiled forward and MTP calls of one built model (the CPU's compiled mode). Dynamo's
    caches are reset first: graphs of a previous model (another dtype or build) are dropped, so
    they neither count against the recompile limit nor guard this model's calls."""
    from roofline.measure.timer import CompileUnsupported, _cxx_compiler
    if _cxx_compiler() is None:
        raise CompileUnsupported("mode 'compiled': torch.compile (Inductor) on the CPU needs a C++ compiler "
                                 "(none of $CXX, c++, g++, clang++ is on PATH); use modes eager")
    torch._dynamo.reset()
    return {"forward": CompiledForward(lambda t, s: model(t, s), layers, dtype, max_autotune),
            "mtp": CompiledForward(lambda h, t, s: model.mtp_forward(h, t, s), 1, dtype, max_autotune)}
