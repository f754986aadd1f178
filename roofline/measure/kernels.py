"""Bandwidth ceiling kernels: read, write, copy and triad, in Triton and in plain torch.

A roofline needs the memory roof measured on the device itself, by kernels that do nothing
but move bytes. Each kernel here streams contiguous 1-D tensors once:

    read   s = sum(x)         n·b read (+ a few per-program fp32 partials)
    write  x[:] = v           n·b written
    copy   out = src          n·b read + n·b written
    triad  out = b + s·c      2·n·b read + n·b written   (BabelStream triad)

`bytes_moved` counts read + written bytes, the same convention as BabelStream and as a
datasheet's HBM bandwidth. Triton's read writes one fp32 partial sum per program and
`run` finishes it with torch (a second, tiny launch); those partials, written and read
back, and the result are counted too.

Every kernel exists as a "grid" variant (one program per BLOCK) and a "persistent" variant
(programs = SMs × PROGRAMS_PER_SM, each striding over blocks): the persistent one avoids
scheduling many short programs and the ragged last wave, the grid one is the textbook form.
torch's own lines (`torch_copy` = dst.copy_(src), ...) sit in the same registry, so a
ceilings experiment iterates over all of them alike: torch rows on a CPU, all rows on a GPU.

Wide accesses. A GPU reaches its bandwidth only with 128-bit (16-byte) loads and stores per
thread. Triton picks a thread's vector width from what it can prove about the addresses:
the base pointer is 16-byte aligned (torch allocations are; Triton specialises on it), and
`tl.multiple_of` / `tl.max_contiguous` state that each block's offsets start at a multiple
of BLOCK and run BLOCK elements without a gap. Full blocks take an unmasked path, because a
mask against an arbitrary n would break the proof; only the single tail block is masked.
BLOCK is sized in bytes, not elements:

    BLOCK_BYTES = 16 B/access × 32 threads × NUM_WARPS × ACCESSES_PER_THREAD  (= 16 KiB)

so each thread issues ACCESSES_PER_THREAD independent 16-byte accesses per block whatever
the dtype (fp32: 4096 elements per block, bf16/fp16: 8192).

Triton on a CPU. Triton kernels run on a CPU only under its interpreter (TRITON_INTERPRET=1),
which Triton reads when a function is decorated with `triton.jit`. The kernels below are
therefore plain functions, jitted on first launch and cached per mode, so that setting the
variable after this module was imported still works. The module imports without Triton
installed; `triton_available()` tells callers whether the Triton rows can run.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable

import torch

from roofline.model.dtypes import DTYPES, MODEL_DTYPES

try:
    import triton
    import triton.language as tl
except ImportError:  # torch rows still work without it
    triton = None
    tl = None

Buffers = dict[str, torch.Tensor]

ACCESS_BYTES = 16  # one 128-bit load or store per thread
NUM_WARPS = 8
ACCESSES_PER_THREAD = 4
BLOCK_BYTES = ACCESS_BYTES * 32 * NUM_WARPS * ACCESSES_PER_THREAD
PROGRAMS_PER_SM = 4  # persistent grid: enough resident warps per SM to keep HBM busy
INTERPRETER_SMS = 2  # small, so that persistent programs loop over several blocks in tests

TRIAD_SCALAR = 0.4  # BabelStream's scalar
_TRIAD_SCALAR_FP32 = torch.tensor(TRIAD_SCALAR, dtype=torch.float32).item()  # what kernels see
WRITE_VALUE = 1.5  # not zero: nothing here may take a zero-page or compression shortcut
PARTIAL_BYTES = 4  # read partials and result accumulate in fp32

KERNEL_DTYPES = tuple(DTYPES[n].torch for n in MODEL_DTYPES)  # the kernels stream what the decoder runs in
OPS = ("read", "write", "copy", "triad")
VARIANTS = ("grid", "persistent", "torch")


def _interpreting() -> bool:
    if triton is not None and hasattr(triton, "knobs"):
        return bool(triton.knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def triton_available() -> bool:
    """Triton imports and can run here: on a CUDA device, or on the CPU interpreter."""
    return triton is not None and (torch.cuda.is_available() or _interpreting())


def block_elems(elem_bytes: int) -> int:
    return BLOCK_BYTES // elem_bytes


def num_sms(device: torch.device | str | None = None) -> int:
    """Streaming multiprocessors of `device`; a fixed small number under the interpreter."""
    device = torch.device(device) if device is not None else _default_device()
    if device.type == "cuda" and not _interpreting():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETER_SMS


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _num_programs(variant: str, n: int, elem_bytes: int, device=None) -> int:
    blocks = math.ceil(n / block_elems(elem_bytes))
    if variant == "persistent":
        return max(1, min(blocks, num_sms(device) * PROGRAMS_PER_SM))
    return blocks


# --- Triton kernels (plain functions; see _jit) -------------------------------------------


def _read_grid(x, partials, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    start = tl.multiple_of(pid.to(tl.int64) * BLOCK, BLOCK)
    offs = tl.max_contiguous(tl.multiple_of(start + tl.arange(0, BLOCK), BLOCK), BLOCK)
    if start + BLOCK <= n:
        v = tl.load(x + offs, eviction_policy="evict_first")
    else:
        v = tl.load(x + offs, mask=offs < n, other=0.0)
    tl.store(partials + pid, tl.sum(v.to(tl.float32), axis=0))


def _read_persistent(x, partials, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    full = n // BLOCK
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for blk in tl.range(pid, full, programs):
        start = tl.multiple_of(blk * BLOCK, BLOCK)
        offs = tl.max_contiguous(tl.multiple_of(start + tl.arange(0, BLOCK), BLOCK), BLOCK)
        acc += tl.load(x + offs, eviction_policy="evict_first").to(tl.float32)
    if pid == full % programs:
        offs = full.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(partials + pid, tl.sum(acc, axis=0))


def _write_grid(out, value, n, BLOCK: tl.constexpr):
    start = tl.multiple_of(tl.program_id(0).to(tl.int64) * BLOCK, BLOCK)
    offs = tl.max_contiguous(tl.multiple_of(start + tl.arange(0, BLOCK), BLOCK), BLOCK)
    v = tl.full([BLOCK], value, out.dtype.element_ty)
    if start + BLOCK <= n:
        tl.store(out + offs, v)
    else:
        tl.store(out + offs, v, mask=offs < n)


def _write_persistent(out, value, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    full = n // BLOCK
    v = tl.full([BLOCK], value, out.dtype.element_ty)
    for blk in tl.range(pid, full, programs):
        start = tl.multiple_of(blk * BLOCK, BLOCK)
        offs = tl.max_contiguous(tl.multiple_of(start + tl.arange(0, BLOCK), BLOCK), BLOCK)
        tl.store(out + offs, v)
    if pid == full % programs:
        offs = full.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, v, mask=offs < n)


def _copy_grid(src, out, n, BLOCK: tl.constexpr):
    start = tl.multiple_of(tl.program_id(0).to(tl.int64) * BLOCK, BLOCK)
    offs = tl.max_contiguous(tl.multiple_of(start + tl.arange(0, BLOCK), BLOCK), BLOCK)
    if start + BLOCK <= n:
        tl.store(out + offs, tl.load(src + offs, eviction_policy="evict_first"))
    else:
        mask = offs < n
        tl.store(out + offs, tl.load(src + offs, mask=mask), mask=mask)


def _copy_persistent(src, out, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    full = n // BLOCK
    for blk in tl.range(pid, full, programs):
        start = tl.multiple_of(blk * BLOCK, BLOCK)
        offs = tl.max_contiguous(tl.multiple_of(start + tl.arange(0, BLOCK), BLOCK), BLOCK)
        tl.store(out + offs, tl.load(src + offs, eviction_policy="evict_first"))
    if pid == full % programs:
        offs = full.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + offs, tl.load(src + offs, mask=mask), mask=mask)


def _triad_grid(b, c, out, s, n, BLOCK: tl.constexpr):
    start = tl.multiple_of(tl.program_id(0).to(tl.int64) * BLOCK, BLOCK)
    offs = tl.max_contiguous(tl.multiple_of(start + tl.arange(0, BLOCK), BLOCK), BLOCK)
    if start + BLOCK <= n:
        vb = tl.load(b + offs, eviction_policy="evict_first").to(tl.float32)
        vc = tl.load(c + offs, eviction_policy="evict_first").to(tl.float32)
        tl.store(out + offs, (vb + s * vc).to(out.dtype.element_ty))
    else:
        mask = offs < n
        vb = tl.load(b + offs, mask=mask).to(tl.float32)
        vc = tl.load(c + offs, mask=mask).to(tl.float32)
        tl.store(out + offs, (vb + s * vc).to(out.dtype.element_ty), mask=mask)


def _triad_persistent(b, c, out, s, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    full = n // BLOCK
    for blk in tl.range(pid, full, programs):
        start = tl.multiple_of(blk * BLOCK, BLOCK)
        offs = tl.max_contiguous(tl.multiple_of(start + tl.arange(0, BLOCK), BLOCK), BLOCK)
        vb = tl.load(b + offs, eviction_policy="evict_first").to(tl.float32)
        vc = tl.load(c + offs, eviction_policy="evict_first").to(tl.float32)
        tl.store(out + offs, (vb + s * vc).to(out.dtype.element_ty))
    if pid == full % programs:
        offs = full.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        vb = tl.load(b + offs, mask=mask).to(tl.float32)
        vc = tl.load(c + offs, mask=mask).to(tl.float32)
        tl.store(out + offs, (vb + s * vc).to(out.dtype.element_ty), mask=mask)


_JITTED: dict[tuple[str, bool], object] = {}


def _jit(fn):
    """`triton.jit(fn)`, made at first launch: Triton picks compiler or interpreter then."""
    key = (fn.__name__, _interpreting())
    if key not in _JITTED:
        # n stays a runtime int: Triton would otherwise turn n == 1 into a constant.
        _JITTED[key] = triton.jit(fn, do_not_specialize=["n"])
    return _JITTED[key]


def _launch(fn, variant: str, n: int, elem_bytes: int, device, *args) -> None:
    if not triton_available():
        raise RuntimeError("Triton kernels need triton and a CUDA device or TRITON_INTERPRET=1")
    grid = (_num_programs(variant, n, elem_bytes, device),)
    _jit(fn)[grid](*args, n, BLOCK=block_elems(elem_bytes), num_warps=NUM_WARPS)


# --- buffers, references, byte counts ----------------------------------------------------


def _check_shape(n: int, dtype: torch.dtype) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n: number of elements must be an int >= 1, got {n!r}")
    if dtype not in KERNEL_DTYPES:
        raise ValueError(f"dtype: must be one of {[str(d) for d in KERNEL_DTYPES]}, got {dtype}")


def _read_buffers(variant: str) -> Callable[[int, torch.dtype, object], Buffers]:
    def make(n: int, dtype: torch.dtype, device) -> Buffers:
        _check_shape(n, dtype)
        # |x| >= 1/16, so a dropped or doubled element moves the sum by >= 1/16, above the
        # fp32 accumulation tolerance of `check` at test sizes. Alternating signs keep the
        # sum a random walk (~0.02·sqrt(n)): torch_read's fp16 result does not overflow.
        sign = 1.0 - 2.0 * (torch.arange(n, device=device) % 2)
        x = (sign * (1.0 + torch.rand(n, device=device)) / 16).to(dtype)
        if variant == "torch":
            return {"x": x, "out": torch.empty((), dtype=dtype, device=device)}
        programs = _num_programs(variant, n, x.element_size(), x.device)
        return {
            "x": x,
            "partials": torch.empty(programs, dtype=torch.float32, device=device),
            "out": torch.empty((), dtype=torch.float32, device=device),
        }

    return make


def _write_buffers(n: int, dtype: torch.dtype, device) -> Buffers:
    _check_shape(n, dtype)
    return {"out": torch.randn(n, device=device).to(dtype)}


def _copy_buffers(n: int, dtype: torch.dtype, device) -> Buffers:
    _check_shape(n, dtype)
    return {
        "src": torch.randn(n, device=device).to(dtype),
        "out": torch.randn(n, device=device).to(dtype),
    }


def _triad_buffers(n: int, dtype: torch.dtype, device) -> Buffers:
    _check_shape(n, dtype)
    return {
        "b": torch.randn(n, device=device).to(dtype),
        "c": torch.randn(n, device=device).to(dtype),
        "out": torch.randn(n, device=device).to(dtype),
    }


def _read_bytes(variant: str) -> Callable[[int, int], int]:
    def count(n: int, elem_bytes: int) -> int:
        if variant == "torch":
            return n * elem_bytes + elem_bytes  # x read, one scalar written
        # x read; partials written by the kernel and read back by torch; fp32 result written.
        programs = _num_programs(variant, n, elem_bytes)
        return n * elem_bytes + 2 * programs * PARTIAL_BYTES + PARTIAL_BYTES

    return count


_REFERENCE = {
    "read": lambda bufs: bufs["x"].double().sum(),
    "write": lambda bufs: torch.full_like(bufs["out"], WRITE_VALUE),
    "copy": lambda bufs: bufs["src"].clone(),
    "triad": lambda bufs: bufs["b"].double() + _TRIAD_SCALAR_FP32 * bufs["c"].double(),
}

_BUFFERS = {"write": _write_buffers, "copy": _copy_buffers, "triad": _triad_buffers}

_STREAM_BYTES = {  # bytes per element, in units of the element size: read + written
    "write": 1,
    "copy": 2,
    "triad": 3,
}


_TRITON_ARGS: dict[str, Callable[[Buffers], tuple]] = {
    "read": lambda bufs: (bufs["x"], bufs["partials"]),
    "write": lambda bufs: (bufs["out"], WRITE_VALUE),
    "copy": lambda bufs: (bufs["src"], bufs["out"]),
    "triad": lambda bufs: (bufs["b"], bufs["c"], bufs["out"], TRIAD_SCALAR),
}


def _triton_run(op: str, variant: str) -> Callable[[Buffers], None]:
    fn = globals()[f"_{op}_{variant}"]

    def run(bufs: Buffers) -> None:
        streamed = bufs["x"] if op == "read" else bufs["out"]
        n, elem_bytes = streamed.numel(), streamed.element_size()
        _launch(fn, variant, n, elem_bytes, streamed.device, *_TRITON_ARGS[op](bufs))
        if op == "read":
            torch.sum(bufs["partials"], dim=0, out=bufs["out"])

    return run


_TORCH_RUN: dict[str, Callable[[Buffers], None]] = {
    "read": lambda bufs: torch.sum(bufs["x"], dim=0, out=bufs["out"]),
    "write": lambda bufs: bufs["out"].fill_(WRITE_VALUE),
    "copy": lambda bufs: bufs["out"].copy_(bufs["src"]),
    # One fused kernel; `b + s * c` would add a temporary and its traffic.
    "triad": lambda bufs: torch.add(bufs["b"], bufs["c"], alpha=TRIAD_SCALAR, out=bufs["out"]),
}


@dataclass(frozen=True)
class CeilingKernel:
    """One bandwidth line: how to allocate, run, check and count it."""

    name: str
    op: str  # one of OPS
    variant: str  # one of VARIANTS
    run: Callable[[Buffers], None]
    reference: Callable[[Buffers], torch.Tensor]  # expected output, from the inputs only
    bytes_moved: Callable[[int, int], int]  # (n, elem_bytes) -> bytes read + written
    make_buffers: Callable[[int, torch.dtype, object], Buffers]  # (n, dtype, device)

    @property
    def uses_triton(self) -> bool:
        return self.variant != "torch"


def _kernel(op: str, variant: str) -> CeilingKernel:
    name = f"torch_{op}" if variant == "torch" else f"triton_{op}_{variant}"
    if op == "read":
        bytes_moved, make = _read_bytes(variant), _read_buffers(variant)
    else:
        per_elem = _STREAM_BYTES[op]
        bytes_moved, make = (lambda n, b: per_elem * n * b), _BUFFERS[op]
    run = _TORCH_RUN[op] if variant == "torch" else _triton_run(op, variant)
    return CeilingKernel(name, op, variant, run, _REFERENCE[op], bytes_moved, make)


KERNELS: dict[str, CeilingKernel] = {
    s.name: s for s in (_kernel(op, variant) for variant in VARIANTS for op in OPS)
}


# --- correctness before timing -----------------------------------------------------------

FP32_EPS = torch.finfo(torch.float32).eps


def _read_tolerance(kernel: CeilingKernel, x: torch.Tensor, out: torch.Tensor,
                    ref: torch.Tensor) -> float:
    """Worst-case rounding of an fp32 sum: eps32 per addition on the longest chain.

    The chain is a tree inside a block (log2 BLOCK), the persistent loop's sequential
    iterations, and the final torch sum over the partials (log2 of their count); log2(n)
    bounds the tree depths. The result is then rounded once to the output dtype.
    """
    n = x.numel()
    iterations = 1
    if kernel.variant == "persistent":
        programs = _num_programs("persistent", n, x.element_size(), x.device)
        iterations = math.ceil(n / (block_elems(x.element_size()) * programs))
    depth = math.ceil(math.log2(max(n, 2))) + iterations
    accumulation = depth * FP32_EPS * x.double().abs().sum().item()
    return accumulation + torch.finfo(out.dtype).eps * abs(ref.item())


def check(kernel: CeilingKernel, n: int, dtype: torch.dtype, device) -> None:
    """Run `kernel` and its torch reference on fresh random inputs; raise if they disagree.

    copy and write must be bit-exact. read is compared with a float64 sum within the fp32
    accumulation bound of `_read_tolerance`. triad is compared with float64 elementwise
    within eps(dtype)·(|b| + |s·c|): two roundings to the dtype at most, measured against
    the size of the terms rather than the result, which may cancel to near zero. The
    reference uses s as an fp32 scalar, the value every implementation receives.
    """
    bufs = kernel.make_buffers(n, dtype, device)
    ref = kernel.reference(bufs)
    kernel.run(bufs)
    out = bufs["out"]
    if kernel.op in ("copy", "write"):
        if not torch.equal(out, ref):
            bad = (out != ref).nonzero()[0].item()
            raise AssertionError(
                f"{kernel.name} {dtype} n={n}: not bit-exact, first mismatch at {bad}: "
                f"{out[bad].item()} != {ref[bad].item()}"
            )
    elif kernel.op == "read":
        err = abs(out.double().item() - ref.item())
        tol = _read_tolerance(kernel, bufs["x"], out, ref)
        if not err <= tol:
            raise AssertionError(
                f"{kernel.name} {dtype} n={n}: sum {out.item()} vs {ref.item()}, "
                f"|err| {err:.3g} > tol {tol:.3g}"
            )
    else:
        eps = torch.finfo(dtype).eps
        tol = eps * (bufs["b"].double().abs() + _TRIAD_SCALAR_FP32 * bufs["c"].double().abs())
        err = (out.double() - ref).abs()
        if not bool((err <= tol).all()):
            bad = int((err - tol).argmax())
            raise AssertionError(
                f"{kernel.name} {dtype} n={n}: triad at {bad}: {out[bad].item()} vs "
                f"{ref[bad].item()}, |err| {err[bad].item():.3g} > tol {tol[bad].item():.3g} "
                f"(rtol {eps:.3g} of |b|+|s·c|)"
            )
