"""The decoder's elementwise ops in their lean forms (fewer dispatches per decode step) are
bit-equal to the composite formulas they replaced: the float32 -> float32 round trip of
RMSNorm, RoPE with and without a pass-through part, and the CPU grouped decode attention."""

import pytest
import torch
import torch.nn.functional as F

from roofline.model.decoder import RMSNorm, attend
from roofline.model.rope import apply_rope


def _rms_composite(x, weight, eps):  # the form RMSNorm had: three ops in float32, one rounding
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


def _rope_composite(x, cos, sin, interleave):  # the form apply_rope had
    rot = 2 * cos.shape[-1]
    xr, xp = x[..., :rot].float(), x[..., rot:]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    if interleave:
        a, b = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)
    else:
        a, b = xr[..., : rot // 2], xr[..., rot // 2:]
        out = torch.cat((a * c - b * s, b * c + a * s), dim=-1)
    return torch.cat((out.to(x.dtype), xp), dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_the_composite_formula_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(0)
    norm = RMSNorm(96, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96, generator=g) * 3)
    x = (torch.randn(3, 5, 96, generator=g) * 7).to(dtype)
    assert torch.equal(norm(x), _rms_composite(x, norm.weight, 1e-5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("rot", [16, 8])  # 16: every feature rotates; 8: half pass through
def test_rope_equals_the_composite_formula_bit_for_bit(dtype, interleave, rot):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 4, 16, generator=g).to(dtype)
    ang = torch.randn(2, 3, rot // 2, generator=g)
    got = apply_rope(x, ang.cos(), ang.sin(), interleave)
    assert got.dtype == dtype and got.shape == x.shape
    assert torch.equal(got, _rope_composite(x, ang.cos(), ang.sin(), interleave))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_decode_attention_matches_sdpa(dtype):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 8, 1, 32, generator=g).to(dtype)
    k, v = (torch.randn(2, 2, 40, 32, generator=g).to(dtype) for _ in range(2))
    got = attend(q, k, v, None, cpu_decode="grouped")
    want = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(4, 1), v.float().repeat_interleave(4, 1))
    assert got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
