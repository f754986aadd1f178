"""MLA's wide absorbed heads (576/512) on CUDA: the shared latent head is expanded (no copy) so
that a fused kernel can take it; the row says math_fallback where torch still takes its math path."""

import pytest
import torch
import torch.nn.functional as F

from roofline.model.decoder import expand_shared_kv


def test_the_expanded_shared_head_is_a_view_and_attends_as_grouped_attention():
    g = torch.Generator().manual_seed(0)
    B, h, L, dk, dv = 2, 8, 24, 72, 64
    q, kv = torch.randn(B, h, 3, dk, generator=g), torch.randn(B, 1, L, dk, generator=g)
    k, v = expand_shared_kv(kv, kv[..., :dv], h)
    assert k.shape == (B, h, L, dk) and v.shape == (B, h, L, dv)
    assert k.stride(1) == 0 and k.data_ptr() == kv.data_ptr()  # no copy of the cache
    ref = F.scaled_dot_product_attention(q, kv, kv[..., :dv], enable_gqa=True)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("B, q, L", [(1, 1, 512), (8, 1, 4096), (1, 4, 512)])
def test_mla_attention_on_cuda_is_fused_or_its_row_says_math_fallback(B, q, L):
    """Which kernel torch picks for DeepSeek-V3's absorbed heads is the device's answer: a fused one,
    or math, which the sweep then marks (status math_fallback: no bandwidth claim)."""
    from roofline.measure.forward import eager_attention_backend, is_math_fallback
    from roofline.model.decoder import attend
    h, dk, dv = 128, 576, 512
    query = torch.randn(B, h, q, dk, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(B, 1, L + q, dk, device="cuda", dtype=torch.bfloat16)
    mask = None
    if q > 1:
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(q, L + q)
    chosen = eager_attention_backend(lambda: attend(query, cache, cache[..., :dv], mask, dk ** -0.5))
    row = dict(attn_backend=chosen)
    assert chosen in ("efficient", "cudnn", "flash") or is_math_fallback(row, "cuda"), chosen
