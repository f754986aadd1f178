"""On a CUDA device: the real llama-3.1-8b runs in bf16, and a miniature matches a float32 CPU reference."""

import pytest
import torch

from roofline.model.decoder import build_model
from roofline.model.presets import get_preset, list_presets, scaled_down

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("name", list_presets())
def test_bf16_on_cuda_matches_float32_cpu_reference(name):
    cfg = scaled_down(get_preset(name))
    toks = torch.randint(0, cfg.vocab, (2, 6))
    start = torch.tensor([0, 3])
    ref = build_model(cfg, max_batch=2, max_context=16, seed=1)(toks, start)
    gpu = build_model(cfg, max_batch=2, max_context=16, seed=1, dtype=torch.bfloat16, device="cuda")
    # same weights: copy the float32 reference's parameters (init RNG streams differ across devices)
    cpu_ref = build_model(cfg, max_batch=2, max_context=16, seed=1)
    gpu.load_state_dict({k: v.to("cuda", torch.bfloat16) for k, v in cpu_ref.state_dict().items()}, strict=False)
    out = gpu(toks.cuda(), start.cuda()).float().cpu()
    cos = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0)
    assert cos > 0.995


def test_llama_3_1_8b_bf16_decode_step_runs():
    cfg = get_preset("llama-3.1-8b")
    m = build_model(cfg, max_batch=1, max_context=512, dtype=torch.bfloat16, device="cuda")
    out = m(torch.randint(0, cfg.vocab, (1, 4), device="cuda"), torch.zeros(1, dtype=torch.long, device="cuda"))
    assert out.shape == (1, 4, cfg.vocab) and torch.isfinite(out.float()).all()


def test_bf16_build_peaks_near_the_models_own_bytes():
    """Meta-device build: the 8B in bf16 never holds a float32 copy (that would be 2x its bytes)."""
    cfg = get_preset("llama-3.1-8b")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    m = build_model(cfg, max_batch=1, max_context=512, dtype=torch.bfloat16, device="cuda")
    params = list(m.parameters())
    model_bytes = sum(p.numel() * p.element_size() for p in params)
    model_bytes += sum(b.numel() * b.element_size() for b in m.buffers())
    largest_f32 = max(p.numel() for p in params) * 4
    peak = torch.cuda.max_memory_allocated() - base
    assert peak <= model_bytes + largest_f32 + 64 * 2**20, (peak, model_bytes)


@pytest.mark.parametrize("B, q, L", [(1, 1, 512), (8, 1, 4096), (32, 1, 4096), (1, 4, 512), (8, 16, 4096)])
def test_sweep_shapes_stay_on_a_fused_attention_kernel(B, q, L):
    """Uniform positions (the sweep's int start_pos): no boolean mask, so torch never drops to
    its math path, which would read every grouped KV head once per query head."""
    from roofline.measure.forward import count_kernels, eager_attention_backend
    cfg = get_preset("llama-3.1-8b").scaled(layers=1)
    m = build_model(cfg, max_batch=B, max_context=L + q, dtype=torch.bfloat16, device="cuda")
    toks = torch.randint(0, cfg.vocab, (B, q), device="cuda")
    chosen = eager_attention_backend(lambda: m(toks, L))
    assert chosen in ("flash", "efficient", "cudnn"), chosen
    seen = count_kernels(lambda: m(toks, L), "cuda")["kernel_attn_backend"]
    assert seen is None or "math" not in seen
    # and the mask-free path computes what the masked one does
    ref = build_model(cfg, max_batch=B, max_context=L + q, dtype=torch.bfloat16, device="cuda")
    for a, b in zip(m.kv_cache_tensors(), ref.kv_cache_tensors()):
        b.copy_(a)
    out = m(toks, L).float()
    masked = ref(toks, torch.full((B,), L, device="cuda")).float()
    cos = torch.nn.functional.cosine_similarity(out.flatten(), masked.flatten(), dim=0)
    assert cos > 0.999


def test_compiled_decode_runs_with_cuda_graphs_and_fewer_kernels_than_eager():
    from roofline.measure.forward import count_kernels
    from roofline.measure.timer import TimerSettings, time_fn
    cfg = get_preset("llama-3.1-8b").scaled(layers=2)
    m = build_model(cfg, max_batch=1, max_context=520, dtype=torch.bfloat16, device="cuda", moe_impl="dense")
    toks = torch.randint(0, cfg.vocab, (1, 1), device="cuda")
    fn = lambda: m(toks, 512)  # noqa: E731
    eager = count_kernels(fn, "cuda")["kernels_per_forward"]
    r = time_fn(fn, TimerSettings(mode="compiled", warmup=1, min_reps=5, max_reps=20, budget_s=1.0), "cuda",
                probe=lambda target: count_kernels(target, "cuda"))
    assert r.mode == "compiled" and r.median_s > 0
    assert 0 < r.probe["kernels_per_forward"] < eager
