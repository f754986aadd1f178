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
from typing import Any, Callable, Iterator

import torch

from roofline.measure.devices import is_cuda
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


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scale: float | None = None) -> str:
    """The kernel `roofline.model.decoder.attend` runs for these tensors and this mask."""
    if q.device.type == "cpu" and q.shape[2] == 1:
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

    def recording(q, k, v, mask, scale=None):
        seen.append(sdpa_backend(q, k, v, mask, scale))
        return original(q, k, v, mask, scale)

    decoder.attend = recording
    try:
        yield seen
    finally:
        decoder.attend = original


def one_backend(seen: list[str]) -> str | None:
    """The backend of a forward: the one name, or 'a+b' when layers differ (None: no attention)."""
    return "+".join(sorted(set(seen))) or None


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
