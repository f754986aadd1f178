"""Quantised weights: round-to-nearest from float weights, and linears that run them through
torch's own packed kernels.

Weight-only int8 and int4 keep the weights packed in memory and dequantise inside the GEMM
kernel, so a decode step reads the packed bytes once: that is what makes them faster, and a
dequantise-then-matmul (which materialises a float copy and reads it again) is a different
measurement. So each (format, device) runs only through a kernel listed in `KERNELS`:

  int8 (per-channel)  cpu   aten._weight_int8pack_mm          x[M,K] · int8 W[N,K], bf16/fp16/fp32 scales
  int4_g<g>           cpu   aten._weight_int4pack_mm_for_cpu   W packed by _convert_weight_to_int4pack_for_cpu
  int4_g<g>           cuda  aten._weight_int4pack_mm           (tinygemm, sm80+, bf16 activations)
  fp8 (tensor/channel/block)  cuda  aten._scaled_mm           (sm89+; 128x128 blocks: sm90+), activations
                                                               quantised to fp8 per call (dynamic)

torch 2.13's CPU _scaled_mm runs, but as a reference loop far below memory bandwidth (timed
here at under 1 GB/s on a decode-shaped fp8 GEMM, against ~20 GB/s for bf16), so fp8 has no
fast CPU kernel. A layer without a kernel can still run by dequantising (`reference=True`):
for correctness checks and real-acceptance runs, never for timing; `require_fast` turns it
into an `Unsupported` error naming the format and the device, which a sweep records as a row
with status `unsupported`.

Routed experts take the weights format expert by expert (`PackedExperts`: one packed linear
per expert, quantised on its own with the same group rules), so a step reads the packed
bytes of the experts it touched. The KV cache's format is `roofline.model.kvcache`'s.

Round-to-nearest at the format's granularity (no calibration):
  int8:  s = amax|row| / 127 (stored in the activation dtype), q = round(w / s) ∈ [-128, 127]
  int4:  per group of g along K, s = (max − min) / 15, z = min + 8·s (torch's layout: w ≈ (q − 8)·s + z),
         q = round((w − (z − 8·s)) / s) ∈ [0, 15]
  fp8:   s = amax / fp8_max per tensor, output row or block, q = fp8(w / s) (w ≈ q · s; s is
         DeepSeek-V3's weight_scale_inv)
Error bounds (`error_bound`): half a step for int8/int4 (|w − ŵ| ≤ s/2); fp8: the cast's
relative rounding (eps/2·|w|) plus half its subnormal spacing times s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from roofline.model.accounting import block_matrices
from roofline.model.formats import Format, Precision, parse_precision
from roofline.model.kvcache import quantize_caches

KERNELS = {
    ("int8", "cpu"): "aten._weight_int8pack_mm",
    ("int4", "cpu"): "aten._weight_int4pack_mm_for_cpu",
    ("int4", "cuda"): "aten._weight_int4pack_mm",
    ("fp8", "cuda"): "aten._scaled_mm",
}
_MIN_CAPABILITY = {("int4", "cuda"): (8, 0), ("fp8", "cuda"): (8, 9)}
INT4_CUDA_INNER_K_TILES = 8
INT4_CPU_ROWS = 16  # _convert_weight_to_int4pack_for_cpu packs output rows 16 at a time


class Unsupported(NotImplementedError):
    """A format with no fast kernel on a device: a row with status `unsupported`, never timed."""


def device_kind(device) -> str:
    return torch.device(device).type


def kernel_for(fmt: Format, device) -> str | None:
    """The torch kernel that runs `fmt` on `device`, or None (also when the GPU is too old)."""
    kind = device_kind(device)
    if fmt.is_float:
        return "aten.mm"
    if _priced_only(fmt):
        return None
    name = KERNELS.get((fmt.kind, kind))
    if name is None:
        return None
    need = _MIN_CAPABILITY.get((fmt.kind, kind))
    if fmt.kind == "fp8" and fmt.granularity == "block":
        need = (9, 0)
    if need and kind == "cuda" and torch.cuda.get_device_capability(torch.device(device)) < need:
        return None
    return name


def _priced_only(fmt: Format) -> bool:
    """A format the what-if prices and this code does not quantize: llama.cpp's GGUF block formats, and int8 with
    a scale per group (the int8 kernel here takes one scale per output channel)."""
    return fmt.family == "ggml" or (fmt.kind == "int8" and fmt.granularity == "group")


def require_kernel(fmt: Format, device, what: str = "weights") -> str:
    k = kernel_for(fmt, device)
    if k is None and _priced_only(fmt):
        raise Unsupported(f"{what}={fmt.name} on device={device}: no kernel here runs it (llama.cpp's GGUF block "
                          "formats and group-scaled int8 are priced by the what-if, roofline.parallel.whatif)")
    if k is None:
        have = sorted(f"{f} on {d}" for f, d in KERNELS)
        raise Unsupported(f"{what}={fmt.name} on device={device}: no fast kernel (a dequantise-then-matmul "
                          f"would be a different measurement); kernels exist for {have}")
    return k


# ---- round-to-nearest quantisation ---------------------------------------------------------------------

@dataclass
class Quantized:
    """A quantised [N, K] matrix: q (stored integers / fp8), scale (and zero), in `fmt`."""
    fmt: Format
    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None = None

    def dequantize(self) -> torch.Tensor:
        f, q = self.fmt, self.q
        N, K = q.shape
        if f.kind == "int8":
            return q.float() * self.scale.float()[:, None]
        if f.kind == "int4":
            g = f.group
            w = (q.float().view(N, K // g, g) - 8) * self.scale.float()[..., None] + self.zero.float()[..., None]
            return w.view(N, K)
        return q.float() * expand_scale(self.scale.float(), f, N, K)


def expand_scale(scale: torch.Tensor, fmt: Format, N: int, K: int) -> torch.Tensor:
    """fp8 scales broadcast to [N, K]."""
    if fmt.granularity == "tensor":
        return scale.reshape(1, 1).expand(N, K)
    if fmt.granularity == "channel":
        return scale.reshape(N, 1).expand(N, K)
    r, c = fmt.block
    return scale.repeat_interleave(r, 0)[:N].repeat_interleave(c, 1)[:, :K]


def _fp8_dtype(fmt: Format) -> torch.dtype:
    return getattr(torch, fmt.storage)


def quantize(w: torch.Tensor, fmt: Format, act_dtype: torch.dtype = torch.bfloat16) -> Quantized:
    """Round-to-nearest quantisation of a float [N, K] matrix at the format's granularity."""
    w = w.detach().float()
    N, K = w.shape
    if fmt.kind == "fp4":
        raise Unsupported(f"weights={fmt.name}: fp4 is priced by the what-if (roofline.parallel.whatif); this code "
                          "runs no fp4 kernel")
    if _priced_only(fmt):
        raise Unsupported(f"weights={fmt.name}: priced by the what-if (roofline.parallel.whatif); this code quantizes "
                          "no GGUF block format and int8 only per output channel")
    if fmt.kind == "int8":
        s = (w.abs().amax(1) / 127).clamp(min=1e-12).to(act_dtype)
        q = torch.round(w / s.float()[:, None]).clamp(-128, 127).to(torch.int8)
        return Quantized(fmt, q, s)
    if fmt.kind == "int4":
        if not fmt.zero_point:
            raise Unsupported(f"weights={fmt.name}: symmetric int4 is priced by the what-if (roofline.parallel.whatif); "
                              "this code's int4 kernel (torch's tinygemm layout) takes a zero point per group")
        g = fmt.group
        if K % g:
            raise Unsupported(f"weights={fmt.name}: K={K} is not a multiple of the group size {g}")
        wg = w.view(N, K // g, g)
        lo, hi = wg.amin(-1), wg.amax(-1)
        s = ((hi - lo) / 15).clamp(min=1e-6).to(act_dtype)
        z = (lo + 8 * s.float()).to(act_dtype)
        base = z.float() - 8 * s.float()
        q = torch.round((wg - base[..., None]) / s.float()[..., None]).clamp(0, 15).to(torch.uint8)
        return Quantized(fmt, q.view(N, K), s, z)
    if fmt.kind == "fp8":
        fmax = torch.finfo(_fp8_dtype(fmt)).max
        if fmt.granularity == "tensor":
            amax = w.abs().amax().reshape(())
        elif fmt.granularity == "channel":
            amax = w.abs().amax(1)
        else:
            r, c = fmt.block
            pad = F.pad(w.abs(), (0, -K % c, 0, -N % r))
            amax = pad.view(pad.shape[0] // r, r, pad.shape[1] // c, c).amax((1, 3))
        s = (amax / fmax).clamp(min=1e-12)
        q = (w / expand_scale(s, fmt, N, K)).to(_fp8_dtype(fmt))
        return Quantized(fmt, q, s)
    raise ValueError(f"quantize: {fmt.name} is a float format")


def error_bound(qz: Quantized) -> torch.Tensor:
    """Largest |w − dequantize(quantize(w))| the format allows, per element [N, K]."""
    f, (N, K) = qz.fmt, qz.q.shape
    if f.kind == "int8":
        return 0.5 * qz.scale.float()[:, None].expand(N, K)
    if f.kind == "int4":
        return 0.5 * qz.scale.float().repeat_interleave(f.group, 1)
    fi = torch.finfo(_fp8_dtype(f))
    s = expand_scale(qz.scale.float(), f, N, K)
    return (fi.eps / 2 * (1 + fi.eps) * qz.q.float().abs() + fi.smallest_normal * fi.eps / 2) * s


# ---- packed linears --------------------------------------------------------------------------------------

class QuantLinear(nn.Module):
    """A linear whose weight is stored in a quantized format. `held_bytes` is what it occupies;
    `reference` is True when it runs by dequantising (never timed as its format)."""

    fmt: Format
    reference: bool = False

    def __init__(self, fmt: Format, in_features: int, out_features: int, bias: torch.Tensor | None):
        super().__init__()
        self.fmt, self.in_features, self.out_features = fmt, in_features, out_features
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def held_bytes(self) -> int:
        """Bytes of the stored weight: packed elements + scales (+ zero points), bias excluded."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dequantize(self) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        if self.reference:
            y = F.linear(x.reshape(-1, shape[-1]), self.dequantize().to(x.dtype))
        else:
            y = self._matmul(x.reshape(-1, shape[-1]))
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features)


class Int8Linear(QuantLinear):
    def __init__(self, qz: Quantized, bias=None):
        super().__init__(qz.fmt, qz.q.shape[1], qz.q.shape[0], bias)
        self.register_buffer("weight_int8", qz.q.contiguous())
        self.register_buffer("scales", qz.scale.contiguous())

    def _matmul(self, x2):
        return torch._weight_int8pack_mm(x2, self.weight_int8, self.scales.to(x2.dtype))

    def dequantize(self):
        return self.weight_int8.float() * self.scales.float()[:, None]


class Int4Linear(QuantLinear):
    """Packed two weights per byte by torch (its own tile layout); scales and zeros [K/g, N, 2]."""

    def __init__(self, qz: Quantized, bias=None, device="cpu"):
        super().__init__(qz.fmt, qz.q.shape[1], qz.q.shape[0], bias)
        self.cuda_kernel = device_kind(device) == "cuda"
        q = qz.q.to(device)
        if self.cuda_kernel:
            pairs = (q[:, ::2].to(torch.uint8) << 4 | q[:, 1::2].to(torch.uint8)).contiguous()
            packed = torch._convert_weight_to_int4pack(pairs, INT4_CUDA_INNER_K_TILES)
        else:
            packed = torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
        self.register_buffer("weight_int4", packed)
        sz = torch.stack([qz.scale.t(), qz.zero.t()], -1).contiguous().to(device)
        self.register_buffer("scales_and_zeros", sz)

    def _matmul(self, x2):
        sz = self.scales_and_zeros.to(x2.dtype)
        if self.cuda_kernel:
            return torch._weight_int4pack_mm(x2, self.weight_int4, self.fmt.group, sz)
        return torch._weight_int4pack_mm_for_cpu(x2, self.weight_int4, self.fmt.group, sz)

    def dequantize(self):
        eye = torch.eye(self.in_features, dtype=self.scales_and_zeros.dtype, device=self.scales_and_zeros.device)
        return self._matmul(eye).t().float()


def _fp8_activation(x2: torch.Tensor, fmt: Format, dtype: torch.dtype):
    """Dynamic activation quantisation for _scaled_mm: per tensor, per row, or per 1 x block[1]."""
    fmax = torch.finfo(dtype).max
    xf = x2.float()
    if fmt.granularity == "tensor":
        s = (xf.abs().amax() / fmax).clamp(min=1e-12).reshape(())
        return (xf / s).to(dtype), s
    if fmt.granularity == "channel":
        s = (xf.abs().amax(1, keepdim=True) / fmax).clamp(min=1e-12)
        return (xf / s).to(dtype), s
    c = fmt.block[1]
    M, K = xf.shape
    s = (xf.view(M, K // c, c).abs().amax(-1) / fmax).clamp(min=1e-12)
    return (xf / s.repeat_interleave(c, 1)).to(dtype), s


def block_scales_for_scaled_mm(xs: torch.Tensor, ws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale_a, scale_b) in the layouts torch._scaled_mm requires for 1x128 activation blocks
    times 128x128 weight blocks (torch's aten/src/ATen/native/cuda/ScaledBlas.cpp,
    is_blockwise_1x128_scaling and is_blockwise_128x128_scaling, the latter checked on
    scale_b.t() against mat2.t(), the weight [N, K]):

    - scale_a [M, ceil(K/128)] outer-dim-major: strides (1, M);
    - scale_b.t() [ceil(N/128), ceil(K/128)] near-inner-dim-major with 16-byte aligned rows:
      strides (round_up(ceil(K/128), 4), 1).

    A stride along a dimension of size 1 is not checked (torch's check_size_stride)."""
    xs = xs.t().contiguous().t()
    nb, kb = ws.shape
    l4 = -(-kb // 4) * 4
    if nb > 1 and ws.stride(0) != l4:
        ws = torch.nn.functional.pad(ws, (0, l4 - kb))[:, :kb]
    return xs, ws.t()


class Fp8Linear(QuantLinear):
    """fp8 weight [N, K] and fp32 scales (DeepSeek-V3's weight_scale_inv: w = q · s)."""

    def __init__(self, qz: Quantized, bias=None, reference: bool = False):
        super().__init__(qz.fmt, qz.q.shape[1], qz.q.shape[0], bias)
        self.reference = reference
        self.register_buffer("weight", qz.q.contiguous())
        self.register_buffer("weight_scale_inv", qz.scale.float().contiguous())

    def dequantize(self):
        N, K = self.weight.shape
        return self.weight.float() * expand_scale(self.weight_scale_inv, self.fmt, N, K)

    def _matmul(self, x2):
        xq, xs = _fp8_activation(x2, self.fmt, self.weight.dtype)
        ws = self.weight_scale_inv
        if self.fmt.granularity == "channel":
            ws = ws.view(1, -1)
        elif self.fmt.granularity == "block":  # scales of W^T [K, N] by (K/128, N/128) blocks
            xs, ws = block_scales_for_scaled_mm(xs, ws)
        return torch._scaled_mm(xq, self.weight.t(), scale_a=xs, scale_b=ws, out_dtype=x2.dtype)


class QuantExperts(nn.Module):
    """Routed experts [E, rows, cols] stored fp8 with block scales, as DeepSeek-V3 releases them.
    Indexing one expert dequantises it: a reference path (no grouped fp8 kernel here)."""

    reference = True

    def __init__(self, fmt: Format, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        self.fmt, self.dtype = fmt, dtype
        self.register_buffer("weight", q)
        self.register_buffer("weight_scale_inv", scale.float())

    def dequantize(self, e: int) -> torch.Tensor:
        N, K = self.weight.shape[1:]
        return self.weight[e].float() * expand_scale(self.weight_scale_inv[e], self.fmt, N, K)

    def __getitem__(self, e: int) -> torch.Tensor:
        return self.dequantize(e).to(self.dtype)

    def linear(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return x @ self[e].T

    def held_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())


class PackedExperts(nn.Module):
    """Routed experts [E, N, K] as E packed linears, each expert quantised on its own at the
    format's granularity (int8 per row, int4 groups along K, fp8 scales) and run through its
    format's kernel: a step reads the packed bytes of the experts it touches."""

    def __init__(self, linears: list[QuantLinear]):
        super().__init__()
        self.fmt = linears[0].fmt
        self.experts = nn.ModuleList(linears)

    def linear(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return self.experts[e](x)

    def dequantize(self, e: int) -> torch.Tensor:
        return self.experts[e].dequantize()


def packed_linear(w: torch.Tensor, fmt: Format, bias: torch.Tensor | None = None, device="cpu",
                  act_dtype: torch.dtype = torch.bfloat16, reference: bool = False) -> QuantLinear:
    """A quantised linear from a float weight [N, K], on `device`, through its format's kernel
    (reference=True: through dequantisation, for formats without one)."""
    try:
        qz = quantize(w, fmt, act_dtype)
    except Unsupported as e:
        raise Unsupported(str(e).replace(f"weights={fmt.name}:", f"weights={fmt.name} on device={device}:")) from None
    if fmt.kind == "int8" and not reference:
        return Int8Linear(qz, bias).to(device)
    if fmt.kind == "int4" and not reference:
        if device_kind(device) == "cpu" and w.shape[0] % INT4_CPU_ROWS:
            raise Unsupported(f"weights={fmt.name} on device={device}: N={w.shape[0]} output rows; torch's CPU int4 "
                              f"packing needs a multiple of {INT4_CPU_ROWS}")
        return Int4Linear(qz, bias, device)
    if fmt.kind == "fp8" or reference:
        if fmt.kind != "fp8":
            raise Unsupported(f"weights={fmt.name}: no reference layer (int formats run through their kernels only)")
        return Fp8Linear(qz, bias, reference=reference).to(device)
    raise ValueError(f"packed_linear: {fmt.name} is a float format")


def _blocks(model: nn.Module) -> list[tuple[nn.Module, bool]]:
    """(block, is MoE) of the main stack and the MTP modules."""
    cfg = model.cfg
    blocks = [(layer, cfg.layer_is_moe(i)) for i, layer in enumerate(model.layers)]
    return blocks + [(m.block, cfg.is_moe) for m in getattr(model, "mtp", [])]


def store_quantized(model: nn.Module, fmt: Format, reference: bool) -> None:
    """Empty block-scaled fp8 storage, on the model's device, for a checkpoint to fill: every
    linear of `block_matrices` and the routed experts (a checkpoint loader's job)."""
    if fmt.kind != "fp8" or fmt.granularity != "block":
        raise ValueError(f"store_quantized: {fmt.name} is not a block-scaled fp8 format")
    p = next(model.parameters())
    dev, act, (r, c) = p.device, p.dtype, fmt.block
    empty = lambda *lead, N, K: Quantized(fmt, torch.empty(*lead, N, K, dtype=_fp8_dtype(fmt), device=dev),  # noqa: E731
                                          torch.empty(*lead, -(-N // r), -(-K // c), device=dev))
    for block, moe in _blocks(model):
        for path, N, K in block_matrices(model.cfg, moe):
            parent_path, _, leaf = path.rpartition(".")
            parent = _get(block, parent_path)
            setattr(parent, leaf, Fp8Linear(empty(N=N, K=K), getattr(parent, leaf).bias, reference=reference))
        if moe:
            for name in ("w1", "w3", "w2"):
                E, N, K = getattr(block.ffn, name).shape
                qz = empty(E, N=N, K=K)
                delattr(block.ffn, name)
                setattr(block.ffn, name, QuantExperts(fmt, qz.q, qz.scale, act))


def _get(root: nn.Module, path: str) -> nn.Module:
    for p in path.split("."):
        root = getattr(root, p)
    return root


def quantize_model(model: nn.Module, prec, device=None, reference: bool = False) -> nn.Module:
    """Put `model` in precision `prec`, in place: the linears that take the weights format
    (accounting.block_matrices), the routed experts (one packed linear per expert) and the LM
    head become packed linears quantised from the current weights; a quantized KV format
    replaces the float caches (roofline.model.kvcache). Raises Unsupported for a weight format
    without a kernel on the device (unless reference=True) and for a float format other than
    the activations'."""
    prec: Precision = parse_precision(prec)
    cfg = model.cfg
    device = device or next(model.parameters()).device
    act = getattr(torch, prec.activations)
    if prec.experts != prec.weights:
        raise Unsupported(f"experts={prec.experts.name} beside weights={prec.weights.name}: experts in a format of "
                          "their own are priced by the what-if, not run (choose weights= for both)")
    for fmt, what in ((prec.weights, "weights"), (prec.lm_head, "lm_head"), (prec.kv, "kv")):
        if fmt.is_float and fmt.name != prec.activations:
            raise Unsupported(f"{what}={fmt.name} with activations {prec.activations}: a float {what} runs in the "
                              "activation dtype; choose dtype instead")
        if not fmt.is_float and not reference and what != "kv":
            require_kernel(fmt, device, what)
    if not prec.weights.is_float:
        for block, moe in _blocks(model):
            for path, _, _ in block_matrices(cfg, moe):
                parent_path, _, leaf = path.rpartition(".")
                parent = _get(block, parent_path)
                lin = getattr(parent, leaf)
                if isinstance(lin, QuantLinear) and lin.fmt == prec.weights:
                    continue  # already stored in this format (a quantized checkpoint)
                w = lin.dequantize() if isinstance(lin, QuantLinear) else lin.weight
                setattr(parent, leaf, packed_linear(w, prec.weights, lin.bias, device, act, reference))
            for name in ("w1", "w3", "w2") if moe else ():
                w = getattr(block.ffn, name)
                if getattr(w, "fmt", None) == prec.weights:
                    continue
                floats = (w.dequantize(e) if isinstance(w, nn.Module) else w[e] for e in range(cfg.experts))
                delattr(block.ffn, name)
                setattr(block.ffn, name, PackedExperts([packed_linear(f, prec.weights, None, device, act, reference)
                                                        for f in floats]))
    if not prec.lm_head.is_float and model.lm_head is not None:
        model.lm_head = packed_linear(model.lm_head.weight, prec.lm_head, None, device, act, reference)
    if not prec.kv.is_float:
        quantize_caches(model, prec.kv)
    return model


def reference_layers(model: nn.Module) -> list[str]:
    """Names of the layers that run by dequantising (what a timed sweep must refuse)."""
    return [n for n, m in model.named_modules() if getattr(m, "reference", False)]


def require_fast(model: nn.Module, prec, device) -> None:
    slow = reference_layers(model)
    if slow:
        fmt = _get(model, slow[0]).fmt.name
        raise Unsupported(f"weights={fmt} on device={device}: {len(slow)} layer(s) (e.g. {slow[0]}) run by "
                          "dequantise-then-matmul, not a fast kernel; not timed")


def held_weight_bytes(model: nn.Module) -> int:
    """Bytes of every weight the model holds: parameters and quantized buffers (caches and RoPE
    tables excluded)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    quant = sum(m.held_bytes() for m in model.modules() if isinstance(m, (QuantLinear, QuantExperts)))
    return params + quant

