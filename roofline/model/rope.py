"""Rotary position embeddings with the scaling variants the presets need.

Frequencies follow the published reference implementations: "llama3" (Llama 3.1: long
wavelengths divided by `factor`, short ones kept, a smooth ramp between), "yarn"
(DeepSeek-V3: NTK-by-parts interpolation between original and scaled frequencies, plus an
attention-temperature factor `mscale` that multiplies cos/sin), "linear" (positions divided
by `factor`).
"""

from __future__ import annotations

import math

import torch

from roofline.model.config import ModelConfig, RopeScaling


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_softmax_scale(rs: RopeScaling) -> float:
    """DeepSeek-V3 multiplies the attention softmax scale by mscale(factor, mscale_all_dim)^2."""
    if rs.kind != "yarn" or not rs.mscale_all_dim:
        return 1.0
    m = _yarn_mscale(rs.factor, rs.mscale_all_dim)
    return m * m


def inv_frequencies(dim: int, theta: float, rs: RopeScaling) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (float64, length dim/2) and the cos/sin amplitude factor."""
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if rs.kind == "none":
        return inv, 1.0
    if rs.kind == "linear":
        return inv / rs.factor, 1.0
    if rs.kind == "llama3":
        low_wl = rs.original_max_position / rs.low_freq_factor
        high_wl = rs.original_max_position / rs.high_freq_factor
        wl = 2 * math.pi / inv
        smooth = (rs.original_max_position / wl - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
        scaled = torch.where(wl > low_wl, inv / rs.factor, inv)
        mid = (wl <= low_wl) & (wl >= high_wl)
        blended = (1 - smooth) * inv / rs.factor + smooth * inv
        return torch.where(mid, blended, scaled), 1.0
    # yarn
    def correction_dim(rot: float) -> float:
        return dim * math.log(rs.original_max_position / (rot * 2 * math.pi)) / (2 * math.log(theta))

    lo = max(math.floor(correction_dim(rs.beta_fast)), 0)
    hi = min(math.ceil(correction_dim(rs.beta_slow)), dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    extrapolation_mask = 1 - ramp
    inv = inv / rs.factor * (1 - extrapolation_mask) + inv * extrapolation_mask
    amp = _yarn_mscale(rs.factor, rs.mscale) / _yarn_mscale(rs.factor, rs.mscale_all_dim)  # mscale(f, 0) = 1
    return inv, amp


def rope_table(cfg: ModelConfig, max_positions: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, float32, shape [max_positions, rotary_dim/2]."""
    inv, amp = inv_frequencies(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling)
    ang = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv)
    return (ang.cos() * amp).float().to(device), (ang.sin() * amp).float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """Rotate the first 2*cos.shape[-1] features of x [B, q, heads, dim]; cos/sin are [B, q, rot/2]."""
    rot = 2 * cos.shape[-1]
    whole = rot == x.shape[-1]  # the usual case: every feature rotates (no pass-through part)
    xr = x if whole else x[..., :rot]
    if xr.dtype != torch.float32:  # the no-op casts are skipped: each is a dispatch (docs/cpu.md)
        xr = xr.float()
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    if interleave:
        a, b = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)
    else:
        a, b = xr[..., : rot // 2], xr[..., rot // 2 :]
        out = torch.cat((a * c - b * s, b * c + a * s), dim=-1)
    if out.dtype != x.dtype:
        out = out.to(x.dtype)
    return out if whole else torch.cat((out, x[..., rot:]), dim=-1)
