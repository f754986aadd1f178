"""The CPU's skinny GEMM: a forward's linears at the memory roof for decode-sized token counts.

At small M (tokens per pass) a decoder's GEMMs are bound by reading the weights. torch's fp32
`F.linear` on the CPU (MKL sgemm) packs the weight on every call: on the CI-class 2-core EPYC it
streams 11-13 GB/s at M = 1 where a plain read reaches 16.5, and its time at M = 8 is 3-4x that
of M = 1 (docs/cpu.md). `kernels_cpu/skinny_f32.c` reads each weight once per tile of up to six
tokens (register tiles of R rows x MT tokens, R·MT <= 12), so a pass over M <= 6 tokens costs
what one token costs and decode streams at the roof, with no compile of the model.

The C source is built once per machine with the C++ compiler Inductor would use (`$CXX`, c++,
g++, clang++), `-O3 -march=native -ffast-math -fopenmp`, into a cache folder keyed by the source,
the compiler, the flags and the CPU's flags ($ROOFLINE_CACHE, else $XDG_CACHE_HOME/roofline,
else ~/.cache/roofline). It is called through ctypes with the tensors' pointers (a few
microseconds per call). `SkinnyLinear` replaces an `nn.Linear` of a float32 model on the CPU and
falls back to `F.linear` where the kernel does not apply (autograd, another dtype, M > MAX_M).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from roofline.measure import timer

SOURCE = Path(__file__).with_name("kernels_cpu") / "skinny_f32.c"
FLAGS = ("-x", "c++", "-O3", "-march=native", "-ffast-math", "-fopenmp", "-shared", "-fPIC")
# Above this many tokens per pass the weight is re-read by every tile of six tokens and a BLAS's
# cache blocking wins eventually; measured on the 2-core EPYC (8192 x 1024 fp32): the kernel still
# 1.6x faster than F.linear at M = 128 (125 vs 199 ms for 6 GEMMs), not measured beyond.
MAX_M = 128
NAME = "skinny_f32"  # what a row's gemm_kernel says
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


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """The built kernel (built on first use, then loaded from the cache). Raises KernelUnavailable."""
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
    lib.skinny_f32.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 3 + [ctypes.c_int]
    lib.skinny_f32.restype = None
    return lib


def available() -> tuple[bool, str]:
    """(whether the kernel runs here, why not)."""
    try:
        library()
        return True, ""
    except KernelUnavailable as e:
        return False, str(e)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x[..., K] · weight[N, K]^T (+ bias) through the kernel: float32 CPU tensors, M = x.numel() / K
    tokens (any M; `SkinnyLinear` decides when to use it)."""
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"skinny_linear: float32 CPU tensors only, got {x.dtype} {weight.dtype} on {x.device}")
    N, K = weight.shape
    if x.shape[-1] != K:
        raise ValueError(f"skinny_linear: x has {x.shape[-1]} features, weight {K}")
    x2 = x.reshape(-1, K).contiguous()
    w = weight.contiguous()
    y = torch.empty(x2.shape[0], N, dtype=torch.float32)
    library().skinny_f32(w.data_ptr(), x2.data_ptr(), y.data_ptr(), x2.shape[0], N, K, torch.get_num_threads())
    if bias is not None:
        y += bias
    return y.view(*x.shape[:-1], N)


class SkinnyLinear(nn.Module):
    """An nn.Linear (the same weight and bias tensors, no copy) whose forward runs the skinny
    kernel for float32 inputs of at most MAX_M tokens outside autograd, else F.linear."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.dtype == torch.float32 and x.numel() <= MAX_M * self.in_features
                and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))):
            return skinny_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={NAME} (M <= {MAX_M})"


def use_skinny_linears(model: nn.Module) -> int:
    """Every nn.Linear of `model` whose weight is float32 on the CPU replaced by a SkinnyLinear
    (in place); the number replaced. Raises KernelUnavailable (nothing replaced) where the kernel
    cannot be built."""
    library()
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu"]
    for parent, name, child in swaps:
        setattr(parent, name, SkinnyLinear(child))
    return len(swaps)
