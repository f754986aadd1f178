"""The static KV cache in its format: float, or quantized (fp8 or int8) with its scales.

A decode step at long context reads the cache once per layer, so its format sets those bytes
the way the weight format sets the weights'. A quantized cache holds, per attention layer:

  fp8_e4m3 | fp8_e5m2   codes in float8_e4m3fn / float8_e5m2 and ONE fp32 scale per cache
                        tensor (K and V of GQA; the latent of MLA): x ≈ q · s, vLLM's fp8 cache.
                        The first write after a reset sets s = amax|x| / 200 (K, MLA latent) or
                        / 100 (V), vLLM's calculate_kv_scales constants, which leave 2.2x / 4.5x
                        of e4m3's range as headroom; later writes saturate at the format's max.
  int8                  codes in int8 and one fp32 scale per token per KV head (the cache's
                        shape less its last dim): s = amax|row| / 127, q = round(x / s).

New keys/values are quantized as they are written; attention reads the slice it needs
dequantised to the activation dtype (`KV_IMPL`), what engines do when they have no fused
quantized-KV attention kernel (this decoder has none, on the CPU or on CUDA). The bytes a
forward reads from the cache are then the codes and scales of that slice, which is what
`roofline.model.accounting` charges; the dequantised copy it builds and reads again is
activation traffic: a row whose `kv_impl` is KV_IMPL is charged it too (accounting.kv_dequant_bytes, in
kv_read_bytes), so a fit prices what such a step moved; predictions price the codes alone (a fused kernel).
"""

from __future__ import annotations

import torch
from torch import nn

from roofline.io.fields import ConfigError
from roofline.model.formats import Format

KV_IMPL = "dequant"
SCALE_RANGE = {"k_cache": 200.0, "v_cache": 100.0, "kv_cache": 200.0,  # vLLM's K_/V_SCALE_CONSTANT
               "index_cache": 200.0}  # the sparse-attention indexer's keys: a key cache (K's constant)
INT8_MAX = 127


def write_at(cache: torch.Tensor, pos, new: torch.Tensor, dim: int) -> None:
    """Store new [B, q, ...] at positions `pos` of cache dim `dim` (1 or 2): a slice s:s+q for
    uniform positions (one copy), or per-sequence positions [B, q] (an index_put)."""
    B = new.shape[0]
    if isinstance(pos, slice):
        if dim == 2:
            cache[:B, :, pos] = new.transpose(1, 2)
        else:
            cache[:B, pos] = new
        return
    b_idx = torch.arange(B, device=new.device)[:, None]
    if dim == 2:
        cache[b_idx, :, pos] = new
    else:
        cache[b_idx, pos] = new


def head(cache: torch.Tensor, B: int, kv_len: int, dim: int) -> torch.Tensor:
    """What attention reads: the first B sequences and kv_len positions."""
    return cache[:B, :, :kv_len] if dim == 2 else cache[:B, :kv_len]


def caching_modules(model: nn.Module) -> list[nn.Module]:
    """Modules that hold a cache (attention layers: class attributes CACHE_NAMES, POS_DIM)."""
    return [m for m in model.modules() if getattr(m, "CACHE_NAMES", ())]


def quantize_caches(model: nn.Module, fmt: Format) -> None:
    """Replace every float cache of `model` (main stack and MTP modules) by `fmt` codes and
    their fp32 scales, in place; the float buffers are freed."""
    if fmt.kind not in ("fp8", "int8"):
        raise ValueError(f"quantize_caches: {fmt.name} is not a quantized KV format")
    if fmt.family == "ggml":
        raise ConfigError(f"kv={fmt.name}: llama.cpp's block-quantized cache is priced by the what-if, not run here "
                          "(this code's caches: fp8 per layer, int8 per token)")
    for mod in caching_modules(model):
        for name in mod.CACHE_NAMES:
            old = getattr(mod, name)
            mod.register_buffer(name, torch.zeros(old.shape, dtype=getattr(torch, fmt.storage), device=old.device),
                                persistent=False)
            scales = () if fmt.granularity == "tensor" else old.shape[:-1]
            mod.register_buffer(name + "_scale", torch.zeros(scales, device=old.device), persistent=False)
        mod.kv_format, mod.kv_scaled = fmt, set()


def impl(model: nn.Module) -> str:
    """How attention reads the cache: 'float' (as held) or KV_IMPL (dequantised per step)."""
    return KV_IMPL if any(m.kv_format is not None for m in caching_modules(model)) else "float"


def forget_scales(model: nn.Module) -> None:
    """After a reset: the next write sets the per-tensor fp8 scales again."""
    for mod in caching_modules(model):
        if mod.kv_format is not None:
            mod.kv_scaled = set()


def update(mod: nn.Module, name: str, pos, new: torch.Tensor, B: int, kv_len: int) -> torch.Tensor:
    """Write new [B, q, ...] into cache `name` of `mod`; return cache[:B, .., :kv_len] in new's dtype."""
    fmt, dim = mod.kv_format, mod.POS_DIM
    cache = getattr(mod, name)
    if fmt is None:
        write_at(cache, pos, new, dim)
        return head(cache, B, kv_len, dim)
    scale = getattr(mod, name + "_scale")
    x = new.float()
    if fmt.kind == "fp8":
        if name not in mod.kv_scaled:
            scale.copy_((x.abs().amax() / SCALE_RANGE[name]).clamp(min=torch.finfo(torch.float32).tiny))
            mod.kv_scaled.add(name)
        fmax = torch.finfo(cache.dtype).max
        write_at(cache, pos, (x / scale).clamp(-fmax, fmax).to(cache.dtype), dim)
        return head(cache, B, kv_len, dim).to(new.dtype).mul_(scale.to(new.dtype))
    s = (x.abs().amax(-1) / INT8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    write_at(cache, pos, torch.round(x / s[..., None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), dim)
    write_at(scale, pos, s, dim)
    return head(cache, B, kv_len, dim).to(new.dtype).mul_(head(scale, B, kv_len, dim)[..., None].to(new.dtype))


def fill_random(model: nn.Module, L: int, gen: torch.Generator) -> None:
    """Random keys/values in positions < L of every cache, zero beyond (their values do not
    change the work attention does). A quantized cache gets them through its write path, so
    its codes and scales are what a real context would leave there."""
    for mod in caching_modules(model):
        fmt, dim = mod.kv_format, mod.POS_DIM
        for name in mod.CACHE_NAMES:
            buf = getattr(mod, name)
            buf.zero_()
            if fmt is None:
                live = buf.narrow(dim, 0, L)
                live.copy_(torch.randn(live.shape, generator=gen, device=buf.device).to(buf.dtype))
                continue
            getattr(mod, name + "_scale").zero_()
            mod.kv_scaled.discard(name)
            shape = list(buf.shape)
            shape.insert(1, shape.pop(dim))  # [B, L, ...], as the forward writes
            shape[1] = L
            if L:
                update(mod, name, slice(0, L), torch.randn(shape, generator=gen, device=buf.device), buf.shape[0], 0)

