"""The grouped MoE path (roofline.model.decoder, moe_impl="grouped"): the touched experts with no
host sync, one grouped GEMM per projection over the experts' token groups. On the CPU: the same
output and the same experts as the touched path, and an expert no token routed to is never used.
On a Hopper GPU (marked gpu): it captures in a CUDA graph and replays to the eager touched output."""

from __future__ import annotations

import pytest
import torch

from roofline.model.decoder import Transformer, grouped_capturable
from roofline.model.presets import get_preset, scaled_down

MOE_PRESETS = ("qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b")  # softmax top-k, sigmoid group-limited, top-2


def _pair(name: str, dtype=torch.float32, device="cpu", seed=0):
    cfg = scaled_down(get_preset(name), layers=2)
    torch.manual_seed(seed)
    touched = Transformer(cfg, 3, 64, "touched").eval()
    with torch.no_grad():
        for p in touched.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    touched = touched.to(device, dtype)
    grouped = Transformer(cfg, 3, 64, "grouped").eval().to(device, dtype)
    grouped.load_state_dict(touched.state_dict())
    return cfg, touched, grouped


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_grouped_equals_touched_and_runs_the_same_experts(name):
    cfg, touched, grouped = _pair(name)
    gen = torch.Generator().manual_seed(1)
    x, start = torch.randint(0, cfg.vocab, (3, 5), generator=gen), torch.tensor([0, 4, 9])
    with torch.inference_mode():
        a, b = touched(x, start), grouped(x, start)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert grouped.last_touched_per_layer() == touched.last_touched_per_layer()
    assert 0 < grouped.last_experts_touched() <= cfg.experts


def test_an_expert_no_token_routed_to_is_not_used():
    cfg, _, grouped = _pair("qwen3-30b-a3b")
    x, start = torch.tensor([[5, 9]]), torch.tensor([0])
    with torch.inference_mode():
        ref = grouped(x, start)
        moes = [layer.ffn for layer in grouped.layers if hasattr(layer.ffn, "w1")]
        for moe in moes:  # the same input routes the same way: poison every expert it did not touch
            empty = moe._touched == 0
            assert 0 < int(empty.sum()) < cfg.experts
            moe.w1[empty], moe.w3[empty], moe.w2[empty] = float("nan"), float("nan"), float("nan")
        out = grouped(x, start)
    assert moes and torch.isfinite(out).all()
    torch.testing.assert_close(out, ref)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_grouped_moe_captures_in_a_cuda_graph_and_replays_the_touched_output():
    if not grouped_capturable("cuda", torch.bfloat16):
        pytest.skip("the grouped GEMM's device kernel needs bfloat16 on sm90/sm100")
    cfg, touched, grouped = _pair("qwen3-30b-a3b", torch.bfloat16, "cuda")
    x = torch.randint(0, cfg.vocab, (3, 1), device="cuda")
    start = torch.tensor([3, 7, 11], device="cuda")
    with torch.inference_mode():
        ref = touched(x, start)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            grouped(x, start)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = grouped(x, start)
        graph.replay()
        torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    assert grouped.last_touched_per_layer() == touched.last_touched_per_layer()
