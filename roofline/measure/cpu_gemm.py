"""The CPU's skinny GEMM: a forward's linears at the memory roof for decode-sized token counts.

At small M (tokens per pass) a decoder's GEMMs are bound by reading the weights. torch's fp32
`F.linear` on the CPU (MKL sgemm) packs the weight on every call: on the CI-class 2-core EPYC it
streams 11-13 GB/s at M = 1 where a plain read reaches 16.5, and its time at M = 8 is 3-4x that
of M = 1 (docs/cpu.md). `kernels_cpu/skinny_gemm.c` reads each weight once per tile of up to four
tokens with AVX2's 16 vector registers, six with AVX-512's 32 (register tiles of R rows x MT
tokens, R·MT <= 12; `max_tile()`), so a pass over that many tokens costs about what one token
costs and decode streams at the roof, with no compile of the model.

The C source is built once per machine with the C++ compiler Inductor would use (`$CXX`, c++,
g++, clang++), `-O3 -march=native -ffast-math -fopenmp`, into a cache folder keyed by the source,
the compiler, the flags and the CPU's flags ($ROOFLINE_CACHE, else $XDG_CACHE_HOME/roofline,
else ~/.cache/roofline). It is called through ctypes with the tensors' pointers (a few
microseconds per call). `SkinnyLinear` replaces an `nn.Linear` of a float32 or bfloat16 model on
the CPU and falls back to `F.linear` where the kernel does not apply (autograd, another dtype,
M > MAX_M).

bfloat16 weights: the same tiles, sums in float32, the output rounded to bfloat16 once (bias
added first, as oneDNN's bf16 GEMM rounds its float32 sums). Where the CPU has AVX512-BF16
(`skinny_bf16`) the tokens stay bfloat16 and VDPBF16PS multiplies pairs of them; elsewhere
(`skinny_bf16w`) each weight vector is widened to float32 in registers and the tokens are
converted once per call. Where the CPU has AMX-BF16 (`skinny_amx`) the tokens are packed once per
call into the tile layout and one TDPBF16PS multiplies 16 rows of weights by 16 tokens: on the
2-vCPU AMX Xeon it streams the cpu-demo model's linears at 15 GB/s through this module at M = 1
and costs 1.07x that at M = 16 (VDPBF16PS: 14.3 GB/s, 2.9x at M = 16; torch's bf16 F.linear:
8.5 GB/s, flat). It reads 2 bytes per weight on any x86 with AVX2, where torch's bf16
F.linear is emulated (no AVX512-BF16) or, with AMX, streams a DRAM-resident weight at M = 1
below the roof (docs/cpu.md).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from roofline.measure import timer

SOURCE = Path(__file__).with_name("kernels_cpu") / "skinny_gemm.c"
FLAGS = ("-x", "c++", "-O3", "-march=native", "-ffast-math", "-fopenmp", "-shared", "-fPIC")
# Above this many tokens per pass the weight is re-read by every tile of tokens and a BLAS's
# cache blocking wins eventually; measured on the 2-core EPYC (8192 x 1024 fp32): the kernel still
# 1.6x faster than F.linear at M = 128 (125 vs 199 ms for 6 GEMMs), not measured beyond.
MAX_M = 128
NAME = "skinny_f32"  # what a row's gemm_kernel says (float32 weights)
SYMBOLS = {torch.float32: "skinny_f32", torch.bfloat16: "skinny_bf16w"}  # weight dtype -> entry point
DTYPES = tuple(SYMBOLS)
DPBF16 = "skinny_bf16"  # bfloat16 weights and tokens, VDPBF16PS (built where the CPU has AVX512-BF16)
AMX = "skinny_amx"  # bfloat16 weights and tokens on AMX tiles (built where the CPU has AMX-BF16)
CHOICES = ("auto", "skinny", "aten")  # a sweep's cpu_gemm


class KernelUnavailable(NotImplementedError):
    """The skinny kernel cannot be built here (no C++ compiler, or the build failed)."""


def _compiler() -> str | None:
    return timer._cxx_compiler()  # the one rule: the compiler Inductor would use


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def cache_dir() -> Path:
    root = os.environ.get("ROOFLINE_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "roofline"
    return Path(root) / "cpu_gemm"


def library() -> ctypes.CDLL:
    """The built kernel (built on first use, then loaded from the cache). Raises KernelUnavailable,
    the same answer on every call of the process: a failed build is not retried per model or row."""
    got = _built()
    if isinstance(got, KernelUnavailable):
        raise KernelUnavailable(str(got))
    return got


@functools.lru_cache(maxsize=None)
def _built() -> ctypes.CDLL | KernelUnavailable:
    try:
        return _build_and_load()
    except KernelUnavailable as e:
        return e


library.cache_clear = _built.cache_clear  # forget the answer (tests; a compiler installed meanwhile)


def _build_and_load() -> ctypes.CDLL:
    cxx = _compiler()
    if cxx is None:
        raise KernelUnavailable("the CPU skinny GEMM needs a C++ compiler ($CXX, c++, g++ or clang++ on PATH)")
    src = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([src, cxx.encode(), " ".join(FLAGS).encode(), _cpu_flags().encode()])).hexdigest()[:16]
    out = cache_dir() / f"skinny_f32-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            built = Path(tmp) / out.name
            r = subprocess.run([cxx, *FLAGS, str(SOURCE), "-o", str(built)], capture_output=True, text=True)
            if r.returncode:
                raise KernelUnavailable(f"building the CPU skinny GEMM with {cxx} failed: "
                                        f"{(r.stderr or r.stdout).strip().splitlines()[-1:]}")
            os.replace(built, out)  # atomic: a concurrent build never loads a half-written file
    lib = ctypes.CDLL(str(out))
    for symbol in (*SYMBOLS.values(), DPBF16, AMX):
        if hasattr(lib, symbol):
            getattr(lib, symbol).argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 3 + [ctypes.c_int]
            getattr(lib, symbol).restype = ctypes.c_int if symbol == AMX else None
    return lib


def _amx(lib: ctypes.CDLL) -> bool:
    """Whether the AMX entry runs here: built (the CPU has AMX-BF16) and the kernel granted the
    tile state (Linux asks a process to request it once)."""
    return hasattr(lib, AMX) and bool(lib.skinny_amx_init())


def _entry(dtype: torch.dtype) -> str:
    """The kernel's entry point for weights of `dtype`: bfloat16 on AMX tiles where the CPU has
    them, else on VDPBF16PS where the build has it, else widened to float32."""
    if dtype == torch.bfloat16:
        lib = library()
        if _amx(lib):
            return AMX
        if lib.skinny_has_dpbf16():
            return DPBF16
    return SYMBOLS[dtype]


def max_tile() -> int:
    """Tokens per register tile of the float32 / widened-bfloat16 kernel as built here: 4 with 16
    vector registers (AVX2), 6 with 32 (AVX-512); a pass over M tokens reads each weight
    ceil(M / max_tile()) times from the caches and once from memory."""
    return int(library().skinny_max_tile())


def kernel_name(dtype: torch.dtype) -> str:
    """What a row's gemm_kernel (and a ceilings row's kernel) says for weights of `dtype`:
    skinny_f32, skinny_amx (AMX tiles), skinny_bf16 (VDPBF16PS) or skinny_bf16w (weights widened
    to float32). skinny_amx runs the shapes it tiles (N a multiple of 16, K of 32: every linear
    of the models here) and hands any other shape to skinny_bf16."""
    return _entry(dtype)


def available() -> tuple[bool, str]:
    """(whether the kernel runs here, why not)."""
    try:
        library()
        return True, ""
    except KernelUnavailable as e:
        return False, str(e)


class _Clock:
    """Wall seconds spent inside the kernel's C calls while `on` (kernel_seconds): off, a call
    pays one attribute test."""
    on = False
    total = 0.0


def kernel_seconds(fn, reps: int = 3) -> float:
    """Median over `reps` calls of fn of the wall seconds spent inside this kernel's C calls
    (every skinny GEMM fn runs), each call timed by the wall clock around it. For the split of
    an eager step into its GEMMs and the rest (attention, norms, RoPE, dispatch), measured
    outside any timed region (the clock reads cost ~0.1 us a GEMM)."""
    per = []
    try:
        _Clock.on = True
        for _ in range(reps):
            _Clock.total = 0.0
            fn()
            per.append(_Clock.total)
    finally:
        _Clock.on = False
    return statistics.median(per)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x[..., K] · weight[N, K]^T (+ bias) through the kernel: CPU tensors, the weight float32 or
    bfloat16 and x of the same dtype, M = x.numel() / K tokens (any M; `SkinnyLinear` decides when
    to use it). Sums in float32; the result in x's dtype (bfloat16: rounded once, bias added first).

    Lean on purpose: a decode step calls it once per linear (85 times in the cpu-demo model) and on
    the 2-vCPU EPYC every torch call costs 2-10 us, so it issues no torch op it does not need (a
    float32 call: one empty, the kernel, one view; 46 -> 17 us a call on that EPYC, measured)."""
    if weight.dtype not in SYMBOLS or x.dtype != weight.dtype or not (x.is_cpu and weight.is_cpu):
        raise ValueError(f"skinny_linear: float32 or bfloat16 CPU tensors of one dtype only, "
                         f"got x {x.dtype} on {x.device}, weight {weight.dtype} on {weight.device}")
    N, K = weight.shape
    if x.shape[-1] != K:
        raise ValueError(f"skinny_linear: x has {x.shape[-1]} features, weight {K}")
    entry = _entry(weight.dtype)
    lib = library()
    x2 = x if x.dim() == 2 else x.reshape(-1, K)
    if entry not in (DPBF16, AMX) and x2.dtype != torch.float32:
        x2 = x2.float()  # widened: a copy (M x K, small)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    w = weight if weight.is_contiguous() else weight.contiguous()
    M = x2.shape[0]
    y = torch.empty(M, N, dtype=torch.float32)
    args = (w.data_ptr(), x2.data_ptr(), y.data_ptr(), M, N, K, torch.get_num_threads())
    start = time.perf_counter() if _Clock.on else 0.0
    if entry != AMX or lib.skinny_amx(*args) != 0:  # AMX declines a shape it does not tile
        getattr(lib, DPBF16 if entry == AMX else entry)(*args)
    if _Clock.on:
        _Clock.total += time.perf_counter() - start
    if bias is not None:
        y += bias
    if x.dtype != torch.float32:
        y = y.to(x.dtype)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], N)


def crossovers(doc: dict | None) -> dict[str, int]:
    """Per weight dtype, the most tokens per pass for which this machine's ceilings measured the
    skinny kernel faster than F.linear: the largest decode M of an unbroken run of wins from M = 1
    (median over the decode shapes of t_skinny / t_F.linear < 1 at each measured M), 0 where it
    already loses at M = 1. A dtype whose ceilings timed no skinny rows is absent (the kernel then
    takes every M <= MAX_M). On the 2-vCPU AMX Xeon torch's bf16 F.linear (oneDNN on AMX) is flat
    in M but streams half the roof at M = 1: the kernel wins at M <= 4 and loses at 16."""
    rows = [r for r in (doc or {}).get("matmul") or [] if r.get("kind") == "decode" and r.get("t_median_s")]
    out = {}
    for dtype in sorted({r["dtype"] for r in rows}):
        mine = [r for r in rows if r["dtype"] == dtype]
        skinny = {(r["name"], r["M"]): r["t_median_s"] for r in mine if str(r.get("kernel", "")).startswith("skinny")}
        aten = {(r["name"], r["M"]): r["t_median_s"] for r in mine if r.get("kernel") == "F.linear"}
        both = sorted(set(skinny) & set(aten), key=lambda k: k[1])
        if not both:
            continue
        best = 0
        for M in sorted({m for _, m in both}):
            if statistics.median(skinny[k] / aten[k] for k in both if k[1] == M) >= 1:
                break
            best = M
        out[dtype] = best
    return out


class SkinnyLinear(nn.Module):
    """An nn.Linear (the same weight and bias tensors, no copy) whose forward runs the skinny
    kernel for inputs of the weight's dtype (float32 or bfloat16) of at most MAX_M tokens outside
    autograd, else F.linear."""

    def __init__(self, linear: nn.Linear, max_m: int = MAX_M):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.max_m = min(max_m, MAX_M)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.dtype == self.weight.dtype and x.dtype in SYMBOLS and x.numel() <= self.max_m * self.in_features
                and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))):
            return skinny_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        kernel = SYMBOLS.get(self.weight.dtype, "F.linear")
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={kernel} (M <= {self.max_m})"


def use_skinny_linears(model: nn.Module, max_m: int = MAX_M) -> int:
    """Every nn.Linear of `model` whose weight is float32 or bfloat16 on the CPU replaced by a
    SkinnyLinear taking up to `max_m` tokens (in place); the number replaced. Raises
    KernelUnavailable (nothing replaced) where the kernel cannot be built."""
    library()
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear and child.weight.dtype in SYMBOLS and child.weight.device.type == "cpu"]
    for parent, name, child in swaps:
        setattr(parent, name, SkinnyLinear(child, max_m))
    return len(swaps)
